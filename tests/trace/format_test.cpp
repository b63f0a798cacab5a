#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "teraio/core/error.hpp"
#include "teraio/trace/trace.hpp"
#include "trace_builders.hpp"

namespace teraio::trace {
namespace {

using testing::add_tensor;
using testing::make_trace;

Trace random_trace(std::mt19937_64& rng) {
  Trace t;
  const int n = 1 + static_cast<int>(rng() % 60);
  const char* names[] = {"aten::mm", "aten::add_", "odd \"name\"\\\n\t", "caf\xc3\xa9", ""};
  std::uniform_real_distribution<double> unit(0, 1);
  for (int k = 0; k < n; ++k) {
    double d = unit(rng) * std::pow(10.0, -static_cast<double>(rng() % 12));
    if (rng() % 10 == 0) d = 0;
    if (rng() % 10 == 0) d = std::numeric_limits<double>::denorm_min() * static_cast<double>(rng() % 1000);
    t.ops.push_back({names[rng() % 5], d, static_cast<Phase>(rng() % 4)});
  }
  for (int k = 1; k < n; ++k)
    if (rng() % 15 == 0) t.step_begins.push_back(static_cast<OpIndex>(k));
  t.untracked_bytes = rng();
  t.source = rng() % 2 ? "synthetic \"x\"" : "";
  const int m = static_cast<int>(rng() % 30);
  for (int i = 0; i < m; ++i) {
    std::vector<OpIndex> uses;
    for (int k = 0; k < n; ++k)
      if (rng() % 5 == 0) uses.push_back(static_cast<OpIndex>(k));
    if (uses.empty()) uses.push_back(0);
    Tensor& x = add_tensor(t, rng() >> (rng() % 64), uses, rng() % 2, static_cast<TensorKind>(rng() % 6));
    x.id = rng();
    if (rng() % 3 == 0) x.name = "";
  }
  return t;
}

TEST(TraceFormat, JsonAndBinaryRoundTripExactly) {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 200; ++round) {
    const Trace t = random_trace(rng);
    ASSERT_EQ(parse_trace_json(trace_to_json(t)), t) << "round " << round;
    ASSERT_EQ(parse_trace_binary(trace_to_binary(t)), t) << "round " << round;
  }
}

TEST(TraceFormat, EmptyTraceRoundTrips) {
  const Trace t;
  EXPECT_EQ(parse_trace_json(trace_to_json(t)), t);
  EXPECT_EQ(parse_trace_binary(trace_to_binary(t)), t);
}

TEST(TraceFormat, SavingAnInvalidTraceIsRefused) {
  Trace t = make_trace({1});
  add_tensor(t, 1, {3});
  EXPECT_THROW(trace_to_json(t), Error);
  EXPECT_THROW(trace_to_binary(t), Error);
}

TEST(TraceFormat, OverlongOperatorNamesAreRefusedByBothForms) {
  // The binary reader caps names (hostile files); both forms must agree on what is valid.
  Trace t = make_trace({1});
  t.ops[0].name = std::string(kMaxOperatorName, 'x');
  add_tensor(t, 1, {0});
  EXPECT_EQ(parse_trace_json(trace_to_json(t)), t);
  EXPECT_EQ(parse_trace_binary(trace_to_binary(t)), t);
  const std::string json = trace_to_json(t);
  t.ops[0].name += 'x';
  EXPECT_THROW(trace_to_json(t), Error);
  EXPECT_THROW(trace_to_binary(t), Error);
  std::string longer = json;
  longer.insert(longer.find("xxx"), "x");
  try {
    parse_trace_json(longer);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operator 0 has a name of 1025 bytes"), std::string::npos)
        << e.what();
  }
}

class TraceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("teraio_trace_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(TraceFileTest, SaveChoosesByExtensionAndLoadDetectsByContent) {
  std::mt19937_64 rng(5);
  const Trace t = random_trace(rng);
  save_trace(t, path("a.json"));
  save_trace(t, path("a.tiotrace"));
  save_trace(t, path("b.data"), TraceFormat::kJson);
  std::ifstream json_file(path("a.json"));
  EXPECT_EQ(json_file.get(), '{');
  std::ifstream binary_file(path("a.tiotrace"));
  EXPECT_EQ(binary_file.get(), 'T');
  EXPECT_EQ(load_trace(path("a.json")), t);
  EXPECT_EQ(load_trace(path("a.tiotrace")), t);
  EXPECT_EQ(load_trace(path("b.data")), t);
  EXPECT_FALSE(std::filesystem::exists(path("a.json.tmp")));
}

TEST_F(TraceFileTest, ErrorsNameThePath) {
  try {
    load_trace(path("missing.json"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
    EXPECT_EQ(e.sys_errno(), ENOENT);
  }
  std::ofstream(path("junk")) << "hello";
  try {
    load_trace(path("junk"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("junk: not a TeraIO trace"), std::string::npos) << e.what();
  }
}

TEST_F(TraceFileTest, SaveErrorsNameThePathTheUserGave) {
  Trace t = make_trace({1});
  add_tensor(t, 1, {0});
  try {
    save_trace(t, path("no/such/dir/t.json"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create trace file " + path("no/such/dir/t.json")),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.sys_errno(), ENOENT);
  }
  save_trace(t, path("t.tiotrace"));
  EXPECT_EQ(load_trace(path("t.tiotrace")), t);
  EXPECT_FALSE(std::filesystem::exists(path("t.tiotrace.tmp")));
}

}  // namespace
}  // namespace teraio::trace
