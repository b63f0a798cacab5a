// When the stall search (planner_stalls.cpp) gives up (internal to plan/).
#pragma once

#include <cstdint>

namespace teraio::plan::detail {

// Counts the stall search's rounds that made no progress: neither a shorter simulated step nor
// a new low of the bytes left over the budget. A lower excess is progress towards a plan that
// fits, whose step can be shorter than any before it: on W2's profile with no layer recomputed
// it came at round 22, where counting only shorter steps had stopped at round 8 (bench/RESULTS.md,
// session 27).
class StallPatience {
 public:
  // `step_s` and `excess` are the stall-free plan's.
  StallPatience(int patience, double step_s, std::int64_t excess)
      : patience_(patience), best_step_s_(step_s), lowest_excess_(excess) {}

  // Records a round; returns whether its step is the shortest yet.
  bool shorter(double step_s, std::int64_t excess) {
    ++idle_;
    if (excess < lowest_excess_) {
      lowest_excess_ = excess;
      idle_ = 0;
    }
    if (!(step_s < best_step_s_)) return false;
    best_step_s_ = step_s;
    idle_ = 0;
    return true;
  }

  // `patience` rounds in a row without progress.
  bool exhausted() const { return idle_ >= patience_; }

 private:
  int patience_;
  double best_step_s_;
  std::int64_t lowest_excess_;
  int idle_ = 0;
};

}  // namespace teraio::plan::detail
