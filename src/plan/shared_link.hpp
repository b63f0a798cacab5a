// plan/shared_link: what the PCIe link's shared rate adds to the step bound. While both
// directions are busy the link carries at most Hardware::pcie_duplex_bandwidth together (94
// GB/s on the H100 machines, against 55 GB/s each way). The returns one over-budget operator
// forces after it ends and the departures another forces before it starts cross the link in
// the same stretch of the step, so where they are many their sum, not the larger of the two,
// sets the link time that stretch needs.
#pragma once

#include <cstddef>
#include <vector>

namespace teraio::plan {

// A tensor's bytes and the moment they may cross: its deadline (a return) or its release (a
// departure), in seconds from the start of its operator's step.
struct Timed {
  double at, bytes;
};

// What one operator over the budget forces across the link, as the step bound chooses it: the
// bytes due back soonest after it ends are the fewest possible due by every moment (the
// latest-needed tensors, `returns`, by deadline, ascending), and the bytes released latest
// before it starts the fewest possible released after every moment (the earliest-released
// tensors whose previous use wrote them, `departures`, by release, ascending). The last of each
// may count in part.
struct Forced {
  std::size_t op = 0;
  double begin = 0, end = 0;  // the operator's start and end in the step
  std::vector<Timed> returns, departures;
};

// Bytes per second: incoming alone, outgoing alone, and both together while both are busy.
struct LinkRates {
  double in = 0, out = 0, both = 0;
};

// The least stall inside the stretch from `after`'s end to `before`'s start (past the step's
// end and round to the next step when before.op <= after.op; the whole step but the operator
// itself when they are the same): the returns `after` forces that are due inside it and the
// departures `before` forces that are released inside it all cross the link inside it. 0 when
// it has room for them.
double shared_link_stall(const Forced& after, const Forced& before, double step, const LinkRates& rates);

}  // namespace teraio::plan
