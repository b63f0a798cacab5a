// The debug log's account of an eviction in a planned step (Executor::State::against_plan):
// what the device holds beyond the plan's memory at that operator, in three shares.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "runtime_test_support.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/runtime/next_use.hpp"

namespace teraio::runtime {
namespace {

using testing::offload;
using testing::plan_of;
using testing::prefetch;
using testing::Rig;
using testing::trace_of;

constexpr std::uint64_t kBytes = 16 * kKiB;

trace::Tensor tensor(TensorId id, std::vector<OpIndex> uses, bool persistent) {
  return testing::traced(id, kBytes, std::move(uses), persistent);
}

// The debug log's lines at this level, for as long as it lives.
class DebugLines {
 public:
  DebugLines() : saved_(log::level()) {
    log::set_sink([this](log::Level, std::string_view line) { lines_.emplace_back(line); });
    log::set_level(log::Level::kDebug);
  }
  ~DebugLines() {
    log::set_level(saved_);
    log::set_sink({});
  }
  DebugLines(const DebugLines&) = delete;
  DebugLines& operator=(const DebugLines&) = delete;

  std::vector<std::string> containing(std::string_view text) const {
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  log::Level saved_;
  std::vector<std::string> lines_;
};

// Runs one planned step of `ops` operators over `trace` and `plan`: operator k uses used[k] and
// creates the tensors born[k] (kBytes each, announced as incoming before it unless `announce`
// is false: then after_op makes their room). Returns the debug lines of its evictions.
std::vector<std::string> evictions_of_step(const trace::Trace& trace, const plan::Plan& plan,
                                           const std::vector<TensorId>& resident,
                                           const std::vector<std::vector<TensorId>>& used,
                                           const std::vector<std::vector<TensorId>>& born,
                                           bool announce = true) {
  Rig rig(2 * kBytes);
  Executor& ex = rig.executor();
  for (const TensorId id : resident) rig.add(id, kBytes);
  ex.set_plan(plan);
  ex.set_next_uses(NextUses(trace));
  ex.set_mode(Mode::kPlanned);
  DebugLines log;
  ex.begin_step();
  for (OpIndex k = 0; k < used.size(); ++k) {
    ex.before_op(k, used[k], announce ? born[k].size() * kBytes : 0);
    std::vector<TensorId> touched = used[k];
    for (const TensorId id : born[k]) {
      rig.add(id, kBytes);
      touched.push_back(id);
    }
    ex.after_op(k, touched);
  }
  static_cast<void>(ex.end_step());
  return log.containing("evict tensor");
}

// An eviction in a planned step means the device holds more than the plan's memory there (the
// executor waits for the offloads under way first). The debug line says what: here tensor 1,
// whose planned offload before operator 1 could not go (operator 1 uses it), so that tensor 2
// goes when operator 2's output arrives.
TEST(ExecutorAgainstPlan, AnEvictionsDebugLineNamesWhatTheDeviceHoldsAgainstThePlan) {
  const trace::Trace t =
      trace_of({tensor(1, {1, 3}, true), tensor(2, {0}, true), tensor(3, {2, 3}, false)}, 4);
  const std::vector<std::string> lines = evictions_of_step(
      t, plan_of({offload(1, kBytes, plan::Tier::kHost, 1), prefetch(1, kBytes, plan::Tier::kHost, 3, 3)}),
      {1, 2}, {{2}, {1}, {}, {1, 3}}, {{}, {}, {3}, {}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(
      lines[0].find(cat("evict tensor 2 (", kBytes, " bytes) at operator 2: ", 2 * kBytes, " resident + ",
                        kBytes, " incoming over ", 2 * kBytes, "; against the plan: ", kBytes,
                        " bytes in 1 tensors the plan has away here (largest: tensor 1, ", kBytes,
                        " bytes, device, planned out before operator 1), 0 bytes in 0 past their profiled "
                        "release, 0 bytes in 0 the profile does not know")),
      std::string::npos)
      << lines[0];
}

// The same step without the plan's migrations: tensor 2 goes, and the plan (none) has nothing on
// the device beyond it; the plan itself is over the budget there.
TEST(ExecutorAgainstPlan, AnEvictionThePlanAccountsForHasNothingAgainstIt) {
  const trace::Trace t =
      trace_of({tensor(1, {1, 3}, true), tensor(2, {0}, true), tensor(3, {2, 3}, false)}, 4);
  const std::vector<std::string> lines =
      evictions_of_step(t, plan_of({}), {1, 2}, {{2}, {1}, {}, {1, 3}}, {{}, {}, {3}, {}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("; against the plan: nothing on the device beyond it"), std::string::npos)
      << lines[0];
}

// A step-local tensor's only migration is an offload while the program still holds it past its
// last use (a plan made with recorded releases); before that offload the plan has it on the
// device, not where "the step before left it": it is not born then.
TEST(ExecutorAgainstPlan, AStepLocalTensorIsNotAwayBeforeItsFirstMigration) {
  trace::Tensor held = tensor(5, {0}, false);
  held.held_after_use = 3;  // freed after operator 3
  const trace::Trace t = trace_of({tensor(1, {1, 3}, true), held, tensor(3, {2, 3}, false)}, 4);
  const std::vector<std::string> lines = evictions_of_step(
      t, plan_of({offload(5, kBytes, plan::Tier::kHost, 3)}), {1, 5}, {{5}, {1}, {}, {1}}, {{}, {}, {3}, {}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("at operator 2: "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("; against the plan: nothing on the device beyond it"), std::string::npos)
      << lines[0];
}

// after_op(k) makes room before the program has had a chance to free what operator k used last:
// those are not late yet.
TEST(ExecutorAgainstPlan, WhatTheOperatorJustUsedLastIsNotLateInItsAfterOp) {
  const trace::Trace t =
      trace_of({tensor(1, {3}, true), tensor(2, {0, 1}, false), tensor(3, {1, 2}, false)}, 4);
  const std::vector<std::string> lines =
      evictions_of_step(t, plan_of({}), {1, 2}, {{2}, {2}, {3}, {1}}, {{}, {3}, {}, {}}, false);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("evict tensor 1 "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("at operator 1: "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("; against the plan: nothing on the device beyond it"), std::string::npos)
      << lines[0];
}

// A tensor the program holds past its profiled release whose planned offload could not go is
// counted once, as one the plan has away; one held late without a plan for it, as late.
TEST(ExecutorAgainstPlan, EachTensorCountsInOneShareOnly) {
  trace::Tensor held = tensor(5, {0}, false);
  const trace::Trace t = trace_of({tensor(1, {3}, true), held, tensor(3, {2, 3}, false)}, 4);
  // Operator 1 still uses 5 (against its profile), so the planned offload before it is skipped;
  // after operator 1 the program keeps it.
  const std::vector<std::string> away = evictions_of_step(
      t, plan_of({offload(5, kBytes, plan::Tier::kHost, 1)}), {1, 5}, {{5}, {5}, {}, {1}}, {{}, {}, {3}, {}});
  ASSERT_FALSE(away.empty());
  EXPECT_NE(away[0].find(cat("at operator 2: ", 2 * kBytes, " resident + ", kBytes, " incoming over ",
                             2 * kBytes, "; against the plan: ", kBytes,
                             " bytes in 1 tensors the plan has away here (largest: "
                             "tensor 5, ",
                             kBytes,
                             " bytes, device, planned out before operator 1), 0 bytes in 0 past their "
                             "profiled release, 0 bytes in 0")),
            std::string::npos)
      << away[0];
  const std::vector<std::string> late =
      evictions_of_step(t, plan_of({}), {1, 5}, {{5}, {}, {}, {1}}, {{}, {}, {3}, {}});
  ASSERT_FALSE(late.empty());
  EXPECT_NE(late[0].find(cat("; against the plan: 0 bytes in 0 tensors the plan has away here, ", kBytes,
                             " bytes in 1 past their profiled release (largest: tensor 5), 0 bytes in 0")),
            std::string::npos)
      << late[0];
}

}  // namespace
}  // namespace teraio::runtime
