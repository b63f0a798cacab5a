// When the stall search gives up: after `patience` rounds in a row with neither a shorter
// simulated step nor a new low of the excess (src/plan/stall_patience.hpp).
#include "stall_patience.hpp"

#include <gtest/gtest.h>

namespace teraio::plan::detail {
namespace {

TEST(StallPatience, RoundsThatOnlyLowerTheExcessAreProgress) {
  StallPatience p(2, 10.0, 1000);
  // The step gets no shorter for five rounds, but the excess keeps falling: the search goes on.
  for (const std::int64_t excess : {900, 800, 700, 600, 500}) {
    EXPECT_FALSE(p.shorter(10.5, excess)) << excess;
    EXPECT_FALSE(p.exhausted()) << excess;
  }
  // Then the plan that fits: shorter, and the search has not given up before it.
  EXPECT_TRUE(p.shorter(9.0, 0));
  EXPECT_FALSE(p.exhausted());
}

TEST(StallPatience, GivesUpAfterPatienceRoundsWithoutProgress) {
  StallPatience p(3, 10.0, 1000);
  EXPECT_FALSE(p.shorter(11.0, 1000));  // neither shorter nor less excess
  EXPECT_FALSE(p.shorter(10.0, 1200));  // as long is not shorter; more excess is no progress
  EXPECT_FALSE(p.exhausted());
  EXPECT_FALSE(p.shorter(12.0, 1000));  // the excess only back to its low: no progress
  EXPECT_TRUE(p.exhausted());
}

TEST(StallPatience, AShorterStepStartsTheCountAgainAndRaisesTheBar) {
  StallPatience p(2, 10.0, 1000);
  EXPECT_FALSE(p.shorter(10.1, 1000));
  EXPECT_TRUE(p.shorter(9.5, 1100));  // shorter, even with more excess
  EXPECT_FALSE(p.shorter(9.7, 1100));
  EXPECT_FALSE(p.exhausted());
  EXPECT_FALSE(p.shorter(9.6, 1050));  // still longer than 9.5, and 1050 is above the low of 1000
  EXPECT_TRUE(p.exhausted());
}

}  // namespace
}  // namespace teraio::plan::detail
