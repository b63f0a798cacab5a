// The options of `teraio iobench`, parsed and checked apart from the run so that tests can
// exercise them without touching a disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "teraio/core/units.hpp"

namespace teraio::cli {

struct IobenchConfig {
  std::vector<std::string> paths;  // empty: a fresh directory under the temp directory
  std::uint64_t volume = kGiB;     // bytes written and read per mode
  unsigned threads = 4;            // POSIX backend threads per path
  unsigned queue_depth = 32;       // io_uring entries per path
  std::uint64_t stripe_unit = 4 * kMiB;
  std::uint64_t chunk = 64 * kMiB;        // bytes per transfer submitted to the tier store
  std::uint64_t request_size = 4 * kMiB;  // bytes per disk request (the engine's chunk_bytes)
  unsigned transfers_in_flight = 4;       // tier-store transfer threads
  bool cuda = false;                      // --device cuda
  std::vector<std::string> backends{"io_uring", "posix"};
  unsigned repeat = 1;
  bool raw_reference = true;
  bool host_tier = true;  // also measure the host tier and the raw device copy
  bool warmup = true;
  bool keep_files = false;  // leave the data files in place (the default for --paths)
  std::string json_path;
};

// Parses the iobench arguments; nullopt when --help was asked for (help then holds the text).
// Throws Error{kInvalidArgument} for bad values.
std::optional<IobenchConfig> parse_iobench_args(const std::vector<std::string>& args, std::string& help);

}  // namespace teraio::cli
