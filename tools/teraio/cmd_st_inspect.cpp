// `teraio st-inspect FILE`: the header of a safetensors file as a table (name, dtype, shape,
// offsets, bytes), its metadata and totals; `--json` for scripts. Validates the whole header,
// so it doubles as a checker: a malformed file fails with the reason.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

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

void print_json(const std::string& path, const Header& h) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const TensorInfo& t : h.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", safetensors::dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"begin", t.begin},
                       {"end", t.end},
                       {"bytes", t.bytes()}});
  }
  const nlohmann::ordered_json document = {{"file", path},
                                           {"header_bytes", h.header_bytes},
                                           {"data_offset", h.data_offset},
                                           {"data_bytes", h.data_bytes},
                                           {"metadata", h.metadata},
                                           {"tensors", tensors}};
  // Names come from the file: replace invalid UTF-8 rather than refuse to print the header.
  std::printf("%s\n", document.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
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
