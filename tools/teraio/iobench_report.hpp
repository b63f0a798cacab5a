// Results of `teraio iobench`: one row per mode and direction, printed as a table and written
// as JSON (for bench/RESULTS.md), each beside the raw reference it is judged against.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace teraio::cli {

struct BenchRow {
  std::string mode;       // "raw", "ssd tier", "bounce ssd<->gpu", "host tier", "raw copy"
  std::string direction;  // "write", "read", "device->host", "host->device"
  std::string backend;    // "io_uring", "posix", "dd", "fio ...", "cudaMemcpyAsync", ...
  std::size_t paths = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;  // median of the timed passes
  double raw_bps = 0;  // the reference this row is judged against; 0: none (a reference itself)
  std::string raw_name;
  std::string note;

  double bps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
  double ratio() const { return raw_bps > 0 ? bps() / raw_bps : 0; }
};

struct BenchReport {
  std::vector<std::pair<std::string, std::string>> facts;  // machine and configuration, in order
  std::vector<BenchRow> rows;
};

// A fixed-width table: mode, direction, backend, paths, bytes, seconds, GB/s, raw GB/s, ratio, note.
std::string format_table(const BenchReport& report);
std::string to_json(const BenchReport& report);

}  // namespace teraio::cli
