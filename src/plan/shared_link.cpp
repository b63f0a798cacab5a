#include "shared_link.hpp"

#include <algorithm>
#include <limits>

namespace teraio::plan {

// Put the stretch at [0, L]. R(b) is the returns due by b, D(a) the departures released at or
// after a. For any 0 <= a <= b <= L: returns can cross only in [0, b] and departures only in
// [a, L], so in [0, a) the link carries returns alone (at most `in`), in [a, b] both together
// (at most `both`), in (b, L] departures alone (at most `out`), and during a stall S anywhere
// in the stretch at most `both`:
//   R(b) + D(a) <= in·a + both·(b - a) + out·(L - b) + both·S.
// The right side less both·S is linear in a and b, so the largest excess is reached with a and
// b at the moments bytes are due or released (or at 0 and L), and it splits into a part in b
// and a part in a: one sweep over those moments, keeping the best part in a so far.
double shared_link_stall(const Forced& after, const Forced& before, double step, const LinkRates& rates) {
  const double length = before.op > after.op ? before.begin - after.end : before.begin + step - after.end;
  const double both = rates.both, in = std::min(rates.in, both), out = std::min(rates.out, both);
  if (length < 0 || both <= 0) return 0;
  struct Moment {
    double at, returns, departures;
  };
  std::vector<Moment> moments{{0, 0, 0}, {length, 0, 0}};
  double departing = 0;  // D(a) at the moment the sweep is at
  for (const Timed& r : after.returns)
    if (const double at = r.at - after.end; at <= length) moments.push_back({std::max(at, 0.0), r.bytes, 0});
  for (const Timed& d : before.departures)
    if (const double at = length - (before.begin - d.at); at >= 0) {
      moments.push_back({std::min(at, length), 0, d.bytes});
      departing += d.bytes;
    }
  std::sort(moments.begin(), moments.end(), [](const Moment& x, const Moment& y) { return x.at < y.at; });
  // excess(a, b) = [R(b) - (both - out)·b] + [D(a) + (both - in)·a] - out·L
  double best_a = -std::numeric_limits<double>::infinity(), returned = 0, excess = 0;
  for (std::size_t i = 0; i < moments.size();) {
    const double at = moments[i].at;
    double returns = 0, departures = 0;
    for (; i < moments.size() && moments[i].at == at; ++i) {
      returns += moments[i].returns;
      departures += moments[i].departures;
    }
    best_a = std::max(best_a, departing + (both - in) * at);  // a = at: what is released at it counts
    returned += returns;                                      // b = at: what is due at it counts
    excess = std::max(excess, returned - (both - out) * at + best_a - out * length);
    departing -= departures;
  }
  return excess / both;
}

}  // namespace teraio::plan
