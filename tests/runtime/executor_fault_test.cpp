// I/O failures under the executor: each surfaces as a teraio::Error from the call that saw it,
// and the tensor stays where its bytes are valid.
#include <gtest/gtest.h>

#include "runtime_test_support.hpp"

namespace teraio::runtime {
namespace {

using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;
using testing::RigOptions;

constexpr std::uint64_t kBytes = 16 * kKiB;  // one request per transfer

// Only an SSD tier, whose n-th request fails with EIO.
RigOptions failing_request(std::uint64_t n) {
  RigOptions options;
  options.host_capacity = 0;
  options.faults.fail_at = n;
  return options;
}

template <typename F>
void expect_io_error(F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
}

TEST(ExecutorFaults, FailedOffloadKeepsTheTensorOnTheDevice) {
  Rig rig(0, failing_request(1));
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(0, {});
  expect_io_error([&] { ex.drain(); });
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  EXPECT_EQ(rig.ssd_used(), 0u);
  EXPECT_EQ(ex.resident_bytes(), kBytes);
}

TEST(ExecutorFaults, FailedFetchLeavesTheTensorOnItsTierAndCanBeRetried) {
  Rig rig(0, failing_request(2));
  Executor& ex = rig.executor();
  rig.add(1, kBytes);
  ex.set_plan(plan_of({offload(1, kBytes, plan::Tier::kSsd, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.before_op(0, {});
  ex.drain();
  ASSERT_EQ(ex.location(1), Location::kSsd);
  const TensorId used[] = {1};
  expect_io_error([&] { ex.before_op(1, used); });
  EXPECT_EQ(ex.location(1), Location::kSsd);
  EXPECT_FALSE(rig.memory().holds(1));  // the fresh allocation with garbage is gone
  EXPECT_EQ(ex.resident_bytes(), 0u);
  ex.before_op(2, used);
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
}

// Bringing everything back after a failed step: a prefetch still in flight that fails leaves
// its tensor on the tier, so drain_keeping_valid() only logs it and the tensor can be fetched.
TEST(ExecutorFaults, DrainKeepingValidLogsAFailedPrefetchWhoseBytesStayOnTheTier) {
  for (const bool keeping_valid : {false, true}) {
    Rig rig(0, failing_request(2));
    Executor& ex = rig.executor();
    rig.add(1, kBytes);
    ex.set_plan(
        plan_of({offload(1, kBytes, plan::Tier::kSsd, 0), prefetch(1, kBytes, plan::Tier::kSsd, 1, 2)}));
    ex.set_mode(Mode::kPlanned);
    ex.before_op(0, {});
    ex.drain();
    ASSERT_EQ(ex.location(1), Location::kSsd);
    ex.before_op(1, {});  // issues the prefetch, whose read fails
    if (keeping_valid) {
      EXPECT_NO_THROW(ex.drain_keeping_valid());
    } else {
      expect_io_error([&] { ex.drain(); });
    }
    EXPECT_EQ(ex.location(1), Location::kSsd);
    const TensorId one[] = {1};
    ex.fetch(one);
    EXPECT_TRUE(rig.memory().intact(1)) << (keeping_valid ? "drain_keeping_valid" : "drain");
  }
}

TEST(ExecutorFaults, FailedEvictionSurfacesFromTheOperatorAndKeepsTheData) {
  Rig rig(kBytes, failing_request(1));
  Executor& ex = rig.executor();
  ex.set_mode(Mode::kReactive);
  rig.add(1, kBytes);
  rig.add(2, kBytes);
  const TensorId used[] = {2};
  expect_io_error([&] { ex.before_op(0, used); });
  EXPECT_EQ(ex.location(1), Location::kDevice);
  EXPECT_TRUE(rig.memory().intact(1));
  ex.before_op(1, used);
  EXPECT_EQ(ex.location(1), Location::kSsd);
  EXPECT_EQ(ex.resident_bytes(), kBytes);
}

}  // namespace
}  // namespace teraio::runtime
