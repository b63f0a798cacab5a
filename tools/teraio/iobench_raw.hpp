// The raw reference of `teraio iobench`: the same volume written and read with O_DIRECT by
// standard tools (dd always, fio when installed) on a file in the same directory, in the same
// run, so that TeraIO's figures are compared with what the disk gives without it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace teraio::cli {

struct RawMeasurement {
  std::string tool;  // "dd bs=16MiB" or "fio io_uring bs=4MiB qd=32"
  double write_bps = 0;
  double read_bps = 0;
  std::string problem;  // why the tool could not measure, empty when it did
};

struct RawOptions {
  std::string file;  // created and preallocated if absent, reused, never deleted here
  std::uint64_t volume = 0;
  std::uint64_t request_size = 0;
  unsigned queue_depth = 1;
  unsigned repeat = 1;
  bool warmup = true;
};

// streams dd processes at once, each on its own contiguous share of the file: one sequential
// reader leaves a virtual or NVMe disk partly idle, and the reference must be the disk's best.
RawMeasurement measure_dd(const RawOptions& options, unsigned streams = 1);
RawMeasurement measure_fio(const RawOptions& options, unsigned jobs = 1);

// sync + echo 3 > /proc/sys/vm/drop_caches; false when not permitted (not root).
bool drop_page_cache();
// Median of the samples (seconds); 0 for none.
double median(std::vector<double> samples);

}  // namespace teraio::cli
