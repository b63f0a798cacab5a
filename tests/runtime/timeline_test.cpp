// The runtime timeline: valid trace-event JSON with the operators, transfers and stalls of
// executed steps on their tracks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime_test_support.hpp"
#include "teraio/runtime/timeline.hpp"

namespace teraio::runtime {
namespace {

using nlohmann::json;

std::vector<StepStats> one_step() {
  StepStats step;
  step.step = 3;
  step.transfers.push_back(
      TransferSpan{7, plan::Direction::kOffload, plan::Tier::kSsd, 4096, true, 0.001, 0.002});
  step.transfers.push_back(
      TransferSpan{7, plan::Direction::kPrefetch, plan::Tier::kHost, 4096, false, 0.003, 0.0045});
  step.stalls.push_back(StallSpan{2, 0.004, 0.0045});
  return {step};
}

// Events of phase X by track name.
std::map<std::string, std::vector<json>> spans_by_track(const json& doc) {
  std::map<int, std::string> names;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[e.at("tid")] = e.at("args").at("name");
  }
  std::map<std::string, std::vector<json>> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") out[names.at(e.at("tid"))].push_back(e);
  }
  return out;
}

TEST(Timeline, TracksHoldTheOperatorsTransfersAndStalls) {
  const std::vector<OpSpan> ops = {{"aten::mm", 0.0, 0.001, 3}, {"aten::relu", 0.0045, 0.005, 3}};
  const std::vector<StepStats> steps = one_step();
  const json doc = json::parse(timeline_json(ops, steps));
  auto tracks = spans_by_track(doc);
  ASSERT_EQ(tracks["compute"].size(), 2u);
  EXPECT_EQ(tracks["compute"][1].at("name"), "aten::relu");
  EXPECT_DOUBLE_EQ(tracks["compute"][1].at("ts").get<double>(), 4500.0);
  EXPECT_NEAR(tracks["compute"][1].at("dur").get<double>(), 500.0, 1e-6);
  ASSERT_EQ(tracks["offload"].size(), 1u);
  EXPECT_EQ(tracks["offload"][0].at("name"), "tensor 7 -> ssd");
  EXPECT_EQ(tracks["offload"][0].at("args").at("bytes"), 4096);
  ASSERT_EQ(tracks["prefetch"].size(), 1u);
  EXPECT_EQ(tracks["prefetch"][0].at("name"), "tensor 7 <- host");
  EXPECT_EQ(tracks["prefetch"][0].at("args").at("planned"), false);
  ASSERT_EQ(tracks["stall"].size(), 1u);
  EXPECT_EQ(tracks["stall"][0].at("args").at("op"), 2);
}

TEST(Timeline, ExecutedStepExportsItsTransfers) {
  testing::Rig rig(0);
  Executor& ex = rig.executor();
  rig.add(1, 8192);
  ex.set_plan(testing::plan_of({testing::offload(1, 8192, plan::Tier::kHost, 0)}));
  ex.set_mode(Mode::kPlanned);
  ex.begin_step();
  const double start = ex.now_s();
  ex.before_op(0, {});
  ex.drain();
  const std::vector<OpSpan> ops = {{"op0", start, ex.now_s(), 0}};
  const std::vector<StepStats> steps = {ex.end_step()};
  auto tracks = spans_by_track(json::parse(timeline_json(ops, steps)));
  ASSERT_EQ(tracks["offload"].size(), 1u);
  EXPECT_EQ(tracks["offload"][0].at("name"), "tensor 1 -> host");
  EXPECT_GE(tracks["offload"][0].at("ts").get<double>(), start * 1e6);
}

TEST(Timeline, WriteReplacesTheFileWhole) {
  testing::TempDir dir;
  const std::string path = dir.file("timeline.json");
  const std::vector<StepStats> steps = one_step();
  write_timeline(path, {}, steps);
  std::ifstream in(path);
  const json doc = json::parse(in);
  EXPECT_EQ(spans_by_track(doc)["offload"].size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Timeline, UnwritablePathIsNamed) {
  const std::string path = "/nonexistent-teraio-dir/timeline.json";
  try {
    write_timeline(path, {}, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace teraio::runtime
