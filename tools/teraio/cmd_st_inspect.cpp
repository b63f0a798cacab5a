// `teraio st-inspect FILE`: the header of a safetensors file as a table (name, dtype, shape,
// offsets, bytes), its metadata and totals; `--json` for scripts. Validates the whole header,
// so it doubles as a checker: a malformed file fails with the reason.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "command.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/safetensors/header.hpp"

namespace teraio::cli {
namespace {

using safetensors::Header;
using safetensors::TensorInfo;

std::string shape_text(const TensorInfo& t) {
  std::string text = "[";
  for (std::size_t i = 0; i < t.shape.size(); ++i) text += cat(i == 0 ? "" : ", ", t.shape[i]);
  return text + "]";
}

// Tensor names and metadata are arbitrary UTF-8: escape what JSON requires.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void print_json(const std::string& path, const Header& h) {
  std::printf("{\"file\": %s, \"header_bytes\": %llu, \"data_offset\": %llu, \"data_bytes\": %llu,\n",
              quoted(path).c_str(), static_cast<unsigned long long>(h.header_bytes),
              static_cast<unsigned long long>(h.data_offset), static_cast<unsigned long long>(h.data_bytes));
  std::printf(" \"metadata\": {");
  bool first = true;
  for (const auto& [key, value] : h.metadata) {
    std::printf("%s%s: %s", first ? "" : ", ", quoted(key).c_str(), quoted(value).c_str());
    first = false;
  }
  std::printf("},\n \"tensors\": [");
  first = true;
  for (const TensorInfo& t : h.tensors) {
    std::printf(
        "%s\n  {\"name\": %s, \"dtype\": \"%s\", \"shape\": %s, \"begin\": %llu, \"end\": %llu, \"bytes\": "
        "%llu}",
        first ? "" : ",", quoted(t.name).c_str(), std::string(safetensors::dtype_name(t.dtype)).c_str(),
        shape_text(t).c_str(), static_cast<unsigned long long>(t.begin),
        static_cast<unsigned long long>(t.end), static_cast<unsigned long long>(t.bytes()));
    first = false;
  }
  std::printf("\n]}\n");
}

void print_table(const std::string& path, const Header& h) {
  std::size_t name_width = 4;
  for (const TensorInfo& t : h.tensors) name_width = std::max(name_width, t.name.size());
  const int w = static_cast<int>(name_width);
  std::printf("%s: %zu tensors, header %llu bytes, data %s at offset %llu\n\n", path.c_str(),
              h.tensors.size(), static_cast<unsigned long long>(h.header_bytes),
              format_bytes(h.data_bytes).c_str(), static_cast<unsigned long long>(h.data_offset));
  std::printf("%-*s  %-11s  %-20s  %14s  %14s  %14s\n", w, "name", "dtype", "shape", "begin", "end", "bytes");
  std::map<std::string, std::uint64_t> bytes_per_dtype;
  std::uint64_t elements = 0;
  for (const TensorInfo& t : h.tensors) {
    std::printf("%-*s  %-11s  %-20s  %14llu  %14llu  %14llu\n", w, t.name.c_str(),
                std::string(safetensors::dtype_name(t.dtype)).c_str(), shape_text(t).c_str(),
                static_cast<unsigned long long>(t.begin), static_cast<unsigned long long>(t.end),
                static_cast<unsigned long long>(t.bytes()));
    bytes_per_dtype[std::string(safetensors::dtype_name(t.dtype))] += t.bytes();
    elements += t.numel();
  }
  if (!h.metadata.empty()) {
    std::printf("\nmetadata:\n");
    for (const auto& [key, value] : h.metadata) std::printf("  %s = %s\n", key.c_str(), value.c_str());
  }
  std::printf("\ntotal: %zu tensors, %llu elements, %s", h.tensors.size(),
              static_cast<unsigned long long>(elements), format_bytes(h.data_bytes).c_str());
  for (const auto& [dtype, bytes] : bytes_per_dtype)
    std::printf("; %s %s", dtype.c_str(), format_bytes(bytes).c_str());
  std::printf("\n");
}

int run_st_inspect(const std::vector<std::string>& args) {
  Options opts("st-inspect",
               "print the header of a safetensors file (tensors, metadata, totals); validates it");
  opts.add_positional("FILE", "a .safetensors file");
  opts.add_flag("json", "print JSON instead of a table");
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const std::string path = *opts.positional("FILE");
  const Header header = safetensors::read_header(path);
  if (opts.flag("json")) {
    print_json(path, header);
  } else {
    print_table(path, header);
  }
  return 0;
}

const CommandRegistration kRegistration{"st-inspect", "print and validate the header of a safetensors file",
                                        run_st_inspect};

}  // namespace
}  // namespace teraio::cli
