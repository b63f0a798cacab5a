// core/strings: small string helpers shared by every module (message building, splitting).
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace teraio {

// Concatenates anything that can be streamed; the message builder for errors and logs.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

std::vector<std::string> split(std::string_view text, char separator);
std::string_view trim(std::string_view text);
std::string to_lower(std::string_view text);

}  // namespace teraio
