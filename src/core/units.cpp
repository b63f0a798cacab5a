#include "teraio/core/units.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio {
namespace {

struct NumberAndSuffix {
  double number;
  std::string suffix;  // lower case, spaces removed
};

NumberAndSuffix split_number(std::string_view original, std::string_view what) {
  const std::string_view text = trim(original);
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.' ||
                               text[end] == 'e' || text[end] == 'E' ||
                               ((text[end] == '+' || text[end] == '-') && end > 0 &&
                                (text[end - 1] == 'e' || text[end - 1] == 'E')))) {
    // 'e' only counts as an exponent when a digit follows; "1e" is not a number.
    if ((text[end] == 'e' || text[end] == 'E') &&
        (end + 1 >= text.size() || !(std::isdigit(static_cast<unsigned char>(text[end + 1])) ||
                                     text[end + 1] == '+' || text[end + 1] == '-')))
      break;
    ++end;
  }
  double number = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, number);
  if (end == 0 || ec != std::errc() || ptr != text.data() + end || !std::isfinite(number) || number < 0) {
    throw Error(ErrorKind::kInvalidArgument, cat("cannot parse ", what, " '", original,
                                                 "': expected a non-negative number with an optional unit"));
  }
  std::string suffix;
  for (char c : text.substr(end))
    if (c != ' ') suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return {number, suffix};
}

double byte_multiplier(const std::string& unit, std::string_view original, std::string_view what) {
  if (unit.empty() || unit == "b") return 1;
  if (unit == "k" || unit == "kib") return static_cast<double>(kKiB);
  if (unit == "m" || unit == "mib") return static_cast<double>(kMiB);
  if (unit == "g" || unit == "gib") return static_cast<double>(kGiB);
  if (unit == "t" || unit == "tib") return static_cast<double>(kTiB);
  if (unit == "kb") return 1e3;
  if (unit == "mb") return 1e6;
  if (unit == "gb") return 1e9;
  if (unit == "tb") return 1e12;
  throw Error(ErrorKind::kInvalidArgument, cat("cannot parse ", what, " '", original, "': unknown unit '",
                                               unit, "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"));
}

}  // namespace

std::uint64_t parse_bytes(std::string_view text) {
  const auto [number, suffix] = split_number(text, "size");
  const double bytes = number * byte_multiplier(suffix, text, "size");
  if (bytes >= 1.8e19) throw Error(ErrorKind::kInvalidArgument, cat("size '", text, "' is too large"));
  if (bytes != std::floor(bytes))
    throw Error(ErrorKind::kInvalidArgument, cat("size '", text, "' is not a whole number of bytes"));
  return static_cast<std::uint64_t>(bytes);
}

double parse_bandwidth(std::string_view text) {
  auto [number, suffix] = split_number(text, "bandwidth");
  if (suffix.size() >= 2 && suffix.ends_with("/s")) suffix.resize(suffix.size() - 2);
  return number * byte_multiplier(suffix, text, "bandwidth");
}

double parse_duration(std::string_view text) {
  const auto [number, suffix] = split_number(text, "duration");
  if (suffix.empty() || suffix == "s") return number;
  if (suffix == "ms") return number * 1e-3;
  if (suffix == "us") return number * 1e-6;
  if (suffix == "ns") return number * 1e-9;
  throw Error(ErrorKind::kInvalidArgument,
              cat("cannot parse duration '", text, "': unknown unit '", suffix, "' (use s, ms, us or ns)"));
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buffer[32];
  if (unit == 0)
    std::snprintf(buffer, sizeof buffer, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buffer, sizeof buffer, "%.1f %s", value, kUnits[unit]);
  return buffer;
}

std::string format_bandwidth(double bytes_per_second) {
  char buffer[32];
  if (bytes_per_second >= 1e9)
    std::snprintf(buffer, sizeof buffer, "%.2f GB/s", bytes_per_second / 1e9);
  else
    std::snprintf(buffer, sizeof buffer, "%.1f MB/s", bytes_per_second / 1e6);
  return buffer;
}

std::string format_duration(double seconds) {
  char buffer[32];
  if (seconds < 1e-3)
    std::snprintf(buffer, sizeof buffer, "%.0f us", seconds * 1e6);
  else if (seconds < 1)
    std::snprintf(buffer, sizeof buffer, "%.2f ms", seconds * 1e3);
  else
    std::snprintf(buffer, sizeof buffer, "%.3f s", seconds);
  return buffer;
}

}  // namespace teraio
