// trace/characterize: the paper's study of a trace — how much of the memory each operator
// needs is actually touched by it, how tensor sizes are distributed, and how long tensors
// sit idle, by size. `teraio characterize` writes these numbers as CSV and plots them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::trace {

// The paper's size buckets: <1MB, 1-10MB, 10-100MB, 100MB-1GB, >=1GB (decimal units).
struct SizeBucket {
  std::string label;
  std::uint64_t min_bytes = 0;  // inclusive
  std::uint64_t max_bytes = 0;  // exclusive; UINT64_MAX for the last bucket
};
const std::vector<SizeBucket>& size_buckets();
std::size_t size_bucket_of(std::uint64_t bytes);

// Tensors and bytes that fall into one size bucket.
struct SizeMix {
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
  std::size_t inactive_periods = 0;
};

struct CharacterizationSummary {
  std::size_t ops = 0;
  std::size_t tensors = 0;
  std::size_t uses = 0;
  std::size_t inactive_periods = 0;
  double step_time_s = 0;
  std::uint64_t peak_demand_bytes = 0;
  std::uint64_t max_active_bytes = 0;
  // active / demand per operator (operators with zero demand are skipped).
  double mean_active_share = 0;
  double max_active_share = 0;
  double idle_threshold_s = 0;
  // Tensors (by count and by bytes) with at least one inactive period longer than the
  // threshold, and inactive periods longer than it.
  double share_tensors_idle_over_threshold = 0;
  double share_bytes_idle_over_threshold = 0;
  double share_periods_over_threshold = 0;
  // Bytes of step-local tensors the program still held after their last use (held_after_use,
  // recorded by a profile with record_releases), per operator: the late frees. A plan made as
  // if every storage were freed at its last use counts them free, so they are what the runtime's
  // count runs over the plan's (bench/RESULTS.md, session 32: W3's 32 and 112 MiB). Zero when the
  // profile did not record releases (releases_recorded false).
  bool releases_recorded = false;
  std::uint64_t held_past_use_p90_bytes = 0;
  std::uint64_t held_past_use_p99_bytes = 0;
  std::uint64_t held_past_use_max_bytes = 0;
  std::size_t held_past_use_max_op = 0;
};

struct Characterization {
  // Per operator: start time, memory demand without migration, bytes it touches.
  std::vector<double> start_s;
  std::vector<std::uint64_t> demand_bytes;
  std::vector<std::uint64_t> active_bytes;
  std::vector<std::uint64_t> held_past_use_bytes;  // see CharacterizationSummary::releases_recorded
  // Indexed like size_buckets().
  std::vector<SizeMix> sizes;
  // Sorted inactive-period lengths (seconds) of the tensors of each size bucket.
  std::vector<std::vector<double>> idle_s_by_bucket;
  CharacterizationSummary summary;
};

// Characterizes a validated trace (a multi-step trace is taken as one repeating unit).
Characterization characterize(const Trace& trace, double idle_threshold_s = 0.010);

// Writes memory.csv, sizes.csv, inactive_cdf.csv (at most `cdf_points` per bucket),
// summary.csv and summary.json into `dir` (created if missing). Throws Error{kIo} naming the
// file on failure.
void write_characterization(const Characterization& c, const std::string& dir, std::size_t cdf_points = 400);

}  // namespace teraio::trace
