#include "teraio/plan/plan_io.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include "planner_test_util.hpp"
#include "teraio/core/error.hpp"
#include "teraio/plan/planner.hpp"

namespace teraio::plan {
namespace {

Plan sample_plan() {
  Plan p;
  p.hardware.gpu_budget = 24ull << 30;
  p.hardware.host_capacity = 64ull << 30;
  p.hardware.ssd_capacity = 200ull << 30;
  p.hardware.d2h_bandwidth = 55.123456789012345e9;
  p.hardware.h2d_bandwidth = 1.0 / 3.0 * 1e11;
  p.hardware.pcie_duplex_bandwidth = 94e9;
  p.hardware.ssd_read_bandwidth = 0.1;
  p.hardware.gpudirect = true;
  p.hardware.request_latency_s = 2.5e-5;
  p.peak_before = (80ull << 30) + 17;
  p.peak_after = 24ull << 30;
  p.feasible = true;
  p.migrations = {{18446744073709551615ull, 4096, Direction::kOffload, Tier::kSsd, 3, 9, false},
                  {7, 1, Direction::kOffload, Tier::kHost, 5, 6, true},
                  {18446744073709551615ull, 4096, Direction::kPrefetch, Tier::kSsd, 20, 2, false, true}};
  return p;
}

void expect_equal(const Plan& a, const Plan& b) {
  EXPECT_EQ(plan_to_json(a), plan_to_json(b));
  EXPECT_EQ(a.hardware.d2h_bandwidth, b.hardware.d2h_bandwidth);
  EXPECT_EQ(a.hardware.h2d_bandwidth, b.hardware.h2d_bandwidth);
  EXPECT_EQ(a.hardware.pcie_duplex_bandwidth, b.hardware.pcie_duplex_bandwidth);
  EXPECT_EQ(a.hardware.request_latency_s, b.hardware.request_latency_s);
  EXPECT_EQ(a.hardware.gpudirect, b.hardware.gpudirect);
  EXPECT_EQ(a.peak_before, b.peak_before);
  ASSERT_EQ(a.migrations.size(), b.migrations.size());
  for (std::size_t i = 0; i < a.migrations.size(); ++i) {
    const Migration& x = a.migrations[i];
    const Migration& y = b.migrations[i];
    EXPECT_EQ(x.tensor, y.tensor);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.direction, y.direction);
    EXPECT_EQ(x.tier, y.tier);
    EXPECT_EQ(x.issue_before, y.issue_before);
    EXPECT_EQ(x.deadline, y.deadline);
    EXPECT_EQ(x.urgent, y.urgent);
    EXPECT_EQ(x.kept_copy, y.kept_copy);
  }
}

TEST(PlanIo, RoundTripIsExact) {
  const Plan p = sample_plan();
  expect_equal(plan_from_json(plan_to_json(p)), p);
  const Plan empty;
  expect_equal(plan_from_json(plan_to_json(empty)), empty);
}

TEST(PlanIo, FileRoundTripOfARealPlan) {
  const trace::Trace t = testing::random_trace(3, 200, 100);
  Hardware hw = testing::uniform_hardware(0, 20e9);
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  hw.gpu_budget = *std::max_element(demand.begin(), demand.end()) / 2;
  const Plan p = make_plan(t, hw).plan;
  ASSERT_FALSE(p.migrations.empty());
  const auto path =
      std::filesystem::temp_directory_path() / ("teraio_plan_io_" + std::to_string(::getpid()) + ".json");
  write_plan(p, path);
  const Plan back = read_plan(path);
  std::filesystem::remove(path);
  expect_equal(back, p);
  EXPECT_NO_THROW(validate(back, t));
}

TEST(PlanIo, HardwareRoundTrip) {
  const Hardware hw = sample_plan().hardware;
  const Hardware back = hardware_from_json(hardware_to_json(hw));
  EXPECT_EQ(hardware_to_json(back), hardware_to_json(hw));
  EXPECT_EQ(back.h2d_bandwidth, hw.h2d_bandwidth);
  EXPECT_EQ(back.pcie_duplex_bandwidth, 94e9);
}

// Each malformed input must be rejected with Error{kFormat} whose message contains `where`.
void expect_rejected(const std::string& text, const std::string& where) {
  try {
    plan_from_json(text, "bad.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// Plans written before the shared cap was modelled have no such member: each direction at its own rate.
TEST(PlanIo, APlanWithoutTheDuplexCapReadsAsNone) {
  const std::string old =
      replace(plan_to_json(sample_plan()), "\"pcie_duplex_bandwidth\": 94000000000.0,", "");
  EXPECT_EQ(plan_from_json(old).hardware.pcie_duplex_bandwidth, 0.0);
  expect_rejected(
      replace(plan_to_json(sample_plan()), "\"pcie_duplex_bandwidth\": 9", "\"pcie_duplex_bandwidth\": -9"),
      "$.hardware.pcie_duplex_bandwidth");
}

TEST(PlanIo, MalformedFilesAreRejectedWithWhereAndWhy) {
  const std::string good = plan_to_json(sample_plan());
  expect_rejected("", "not valid JSON");
  expect_rejected(good.substr(0, good.size() / 2), "not valid JSON");
  expect_rejected("[]", "expected an object");
  expect_rejected(replace(good, "\"peak_before\": ", "\"peak_before\": 9E99999"), "not readable JSON");
  expect_rejected(replace(good, "\"teraio-plan\"", "\"teraio-trace\""), "$.format");
  expect_rejected(replace(good, "\"version\": 1", "\"version\": 2"), "unsupported version 2");
  expect_rejected(replace(good, "\"gpu_budget\"", "\"gpu_budgt\""),
                  "$.hardware: missing member \"gpu_budget\"");
  expect_rejected(replace(good, "\"d2h_bandwidth\": 5", "\"d2h_bandwidth\": -5"), "$.hardware.d2h_bandwidth");
  expect_rejected(replace(good, "\"direction\":\"prefetch\"", "\"direction\":\"sideways\""),
                  "$.migrations[2].direction: expected \"offload\" or \"prefetch\"");
  expect_rejected(replace(good, "\"tier\":\"host\"", "\"tier\":\"tape\""), "$.migrations[1].tier");
  expect_rejected(replace(good, "\"deadline\":9", "\"deadline\":4294967296"), "$.migrations[0].deadline");
  expect_rejected(replace(good, "\"deadline\":9", "\"deadline\":-9"), "is negative");
  expect_rejected(replace(good, "\"deadline\":9", "\"deadline\":3"),
                  "$.migrations[0]: issue_before and deadline");
  expect_rejected(replace(good, "\"bytes\":1,", "\"bytes\":0,"), "$.migrations[1].bytes");
  expect_rejected(replace(good, "\"urgent\":true", "\"urgent\":1"), "$.migrations[1].urgent");
  expect_rejected(replace(good, "\"issue_before\":5", "\"issue_before\":1"), "not sorted");
  expect_rejected(replace(good, "\"peak_after\": 25769803776", "\"peak_after\": 1.5"), "$.peak_after");
}

TEST(PlanIo, ValidateAgainstTheTrace) {
  trace::Trace t = testing::ops_trace(10);
  testing::add_tensor(t, 4096, {0, 9});
  Plan p;
  const trace::TensorId id = t.tensors[0].id;
  p.migrations = {{id, 4096, Direction::kOffload, Tier::kSsd, 1, 2, false},
                  {id, 4096, Direction::kPrefetch, Tier::kSsd, 7, 9, false}};
  EXPECT_NO_THROW(validate(p, t));
  p.migrations[1].bytes = 1;
  EXPECT_THROW(validate(p, t), Error);
  p.migrations[1].bytes = 4096;
  p.migrations[1].deadline = 10;
  EXPECT_THROW(validate(p, t), Error);
  p.migrations.pop_back();
  EXPECT_THROW(validate(p, t), Error);
  p.migrations[0].tensor = 5;
  EXPECT_THROW(validate(p, t), Error);
  EXPECT_THROW(read_plan("/nonexistent/plan.json"), Error);
}

}  // namespace
}  // namespace teraio::plan
