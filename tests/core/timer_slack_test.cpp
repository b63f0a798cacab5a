// A thread's timer slack reads back as set, setting it in one thread leaves the others alone,
// and polling threads record what they read back.
#include "teraio/core/timer_slack.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "teraio/core/error.hpp"
#include "teraio/core/units.hpp"

namespace teraio {
namespace {

TEST(TimerSlack, ReadsBackAsSetAndStaysWithTheThread) {
#if defined(__linux__)
  const auto before = timer_slack();
  ASSERT_TRUE(before.has_value());
  std::optional<std::chrono::nanoseconds> inside;
  bool set = false;
  std::thread([&] {
    set = set_timer_slack(kPollingTimerSlack);
    inside = timer_slack();
  }).join();
  EXPECT_TRUE(set);
  EXPECT_EQ(inside, kPollingTimerSlack);
  EXPECT_EQ(timer_slack(), before);
#else
  GTEST_SKIP() << "timer slack is a Linux setting";
#endif
}

TEST(TimerSlack, PollingSlackComesFromTheEnvironmentOrTheDefault) {
  using std::chrono::nanoseconds;
  EXPECT_EQ(parse_polling_timer_slack(nullptr), kPollingTimerSlack);
  EXPECT_EQ(parse_polling_timer_slack(""), kPollingTimerSlack);
  EXPECT_EQ(parse_polling_timer_slack("kernel"), std::nullopt);
  EXPECT_EQ(parse_polling_timer_slack("50us"), nanoseconds(50000));
  EXPECT_EQ(parse_polling_timer_slack("100ns"), nanoseconds(100));
  for (const char* bad : {"0", "-1us", "2ms", "soon", "nan"}) {
    EXPECT_THROW(parse_polling_timer_slack(bad), Error) << bad;
  }
}

TEST(TimerSlack, PollingThreadsRecordTheSlackTheyReadBack) {
  PollingSlack slack;
  EXPECT_EQ(slack.started(), 0);
  EXPECT_EQ(slack.common(), std::nullopt);
  EXPECT_NE(slack.describe().find("not yet known"), std::string::npos);
  std::thread([&] { slack.start(); }).join();
  std::thread([&] { slack.start(); }).join();
  EXPECT_EQ(slack.started(), 2);
#if defined(__linux__)
  // With TERAIO_POLL_SLACK=kernel the threads keep the slack they inherit from this one.
  const auto expected = polling_timer_slack() ? *polling_timer_slack() : *timer_slack();
  EXPECT_EQ(slack.common(), expected);
  EXPECT_EQ(slack.describe(),
            format_duration(std::chrono::duration<double>(expected).count()) + " timer slack");
#endif
}

}  // namespace
}  // namespace teraio
