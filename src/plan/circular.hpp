// Circular operator windows: the training step repeats, so a window that runs past the last
// operator continues at operator 0 of the next step. A window maps onto at most two linear
// operator ranges, which is what the range trees understand.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "bandwidth_ledger.hpp"

namespace teraio::plan::detail {

// Linear operators [op_begin, op_end) holding window offsets starting at `first_offset`.
struct Segment {
  std::size_t op_begin = 0;
  std::size_t op_end = 0;
  std::size_t first_offset = 0;
  std::size_t offset(std::size_t op) const { return first_offset + (op - op_begin); }
};

struct Segments {
  std::array<Segment, 2> items{};
  std::size_t count = 0;
  const Segment* begin() const { return items.data(); }
  const Segment* end() const { return items.data() + count; }
};

// The linear ranges holding offsets [lo, hi) of `window` over n operators, in offset order.
inline Segments segments(std::size_t n, Window window, std::size_t lo, std::size_t hi) {
  Segments out;
  hi = std::min(hi, window.length);
  if (lo >= hi) return out;
  const std::size_t a = window.start + lo;
  const std::size_t b = window.start + hi;
  if (a < n) out.items[out.count++] = {a, std::min(b, n), lo};
  if (b > n) {
    const std::size_t begin = a > n ? a - n : 0;
    out.items[out.count++] = {begin, b - n, begin + n - window.start};
  }
  return out;
}

// The operator at `offset` of `window`.
inline std::size_t op_at(std::size_t n, Window window, std::size_t offset) {
  const std::size_t op = window.start + offset;
  return op >= n ? op - n : op;
}

// Seconds from the start of `window` to the start of its operator at `offset` (offset ==
// length: its end), given op_start_times() of the n = start_s.size() - 1 operators.
inline double time_at(const std::vector<double>& start_s, Window window, std::size_t offset) {
  const std::size_t n = start_s.size() - 1;
  const std::size_t end = window.start + offset;
  if (end <= n) return start_s[end] - start_s[window.start];
  return (start_s[n] - start_s[window.start]) + start_s[end - n];
}

}  // namespace teraio::plan::detail
