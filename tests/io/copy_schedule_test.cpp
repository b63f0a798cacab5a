// The order in which the CUDA copier feeds one direction's copies to its stream.
#include "teraio/io/copy_schedule.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "teraio/core/error.hpp"

namespace teraio::io {
namespace {

constexpr auto kAll = [](CopySchedule::Id) { return true; };

// The ids of the chunks handed out until nothing is ready.
std::vector<CopySchedule::Id> drain(CopySchedule& s,
                                    const std::function<bool(CopySchedule::Id)>& ready = kAll) {
  std::vector<CopySchedule::Id> ids;
  while (auto chunk = s.next(ready)) ids.push_back(chunk->id);
  return ids;
}

TEST(CopySchedule, UrgentFirstThenEarliestDeadlineThenIssueOrder) {
  CopySchedule s(100);
  const auto far = s.add(50, {false, 900});
  const auto near = s.add(50, {false, 300});
  const auto urgent = s.add(50, {true, 1000});
  const auto near_too = s.add(50, {false, 300});
  EXPECT_EQ(drain(s), (std::vector{urgent, near, near_too, far}));
  EXPECT_TRUE(s.empty());
}

TEST(CopySchedule, ALargeCopyGoesOutInChunksAndYieldsToAMorePressingOneBetweenThem) {
  CopySchedule s(100);
  const auto big = s.add(250, {false, 500});
  auto first = s.next(kAll);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->id, big);
  EXPECT_EQ(first->offset, 0u);
  EXPECT_EQ(first->bytes, 100u);
  EXPECT_FALSE(first->last);
  const auto sooner = s.add(100, {false, 200});
  auto second = s.next(kAll);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->id, sooner);
  EXPECT_TRUE(second->last);
  auto third = s.next(kAll);
  auto fourth = s.next(kAll);
  ASSERT_TRUE(third && fourth);
  EXPECT_EQ(third->offset, 100u);
  EXPECT_EQ(fourth->offset, 200u);
  EXPECT_EQ(fourth->bytes, 50u);
  EXPECT_TRUE(fourth->last);
  EXPECT_FALSE(s.next(kAll));
}

TEST(CopySchedule, ACopyNotYetReadyIsPassedOverUntilItIs) {
  CopySchedule s(100);
  const auto waiting = s.add(10, {true, 0});
  const auto later = s.add(10, {false, 800});
  bool go = false;
  const auto ready = [&](CopySchedule::Id id) { return id != waiting || go; };
  EXPECT_EQ(drain(s, ready), (std::vector{later}));
  EXPECT_EQ(s.pending(), 1u);
  go = true;
  EXPECT_EQ(drain(s, ready), (std::vector{waiting}));
}

TEST(CopySchedule, HasReadySaysWhetherNextWouldHandOutAChunkAndChangesNothing) {
  CopySchedule s(100);
  EXPECT_FALSE(s.has_ready(kAll));  // nothing pending
  const auto waiting = s.add(150, {true, 0});
  bool go = false;
  const auto ready = [&](CopySchedule::Id id) { return id != waiting || go; };
  EXPECT_FALSE(s.has_ready(ready));
  go = true;
  EXPECT_TRUE(s.has_ready(ready));
  EXPECT_TRUE(s.has_ready(ready));  // asking twice hands nothing out
  auto first = s.next(ready);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->offset, 0u);  // the whole copy was still there
  EXPECT_EQ(first->bytes, 100u);
}

TEST(CopySchedule, TheRestOfACopyCanBeTakenAtOnce) {
  CopySchedule s(100);
  const auto big = s.add(250, {false, 500});
  const auto other = s.add(10, {false, 900});
  EXPECT_EQ(s.remaining(big), 250u);
  ASSERT_TRUE(s.next(kAll));  // big's first 100 bytes
  EXPECT_EQ(s.remaining(big), 150u);
  const auto rest = s.take_rest(big);
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->offset, 100u);
  EXPECT_EQ(rest->bytes, 150u);
  EXPECT_TRUE(rest->last);
  EXPECT_FALSE(s.take_rest(big));
  EXPECT_EQ(s.remaining(big), 0u);  // taken: nothing of it left to hand out
  EXPECT_EQ(drain(s), (std::vector{other}));
  EXPECT_EQ(s.remaining(other), 0u);
}

TEST(CopySchedule, AnEmptyCopyIsOneLastChunk) {
  CopySchedule s(100);
  const auto id = s.add(0, {});
  auto chunk = s.next(kAll);
  ASSERT_TRUE(chunk);
  EXPECT_EQ(chunk->id, id);
  EXPECT_EQ(chunk->bytes, 0u);
  EXPECT_TRUE(chunk->last);
  EXPECT_TRUE(s.empty());
}

TEST(CopySchedule, RefusesAZeroChunkSize) {
  EXPECT_THROW(CopySchedule(0), Error);
}

}  // namespace
}  // namespace teraio::io
