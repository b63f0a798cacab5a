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
    if (!x.persistent && rng() % 3 == 0)
      x.held_after_use = static_cast<std::uint32_t>(rng() % (static_cast<OpIndex>(n) - x.uses.back()));
    for (const OpIndex u : x.uses)
      if (rng() % 2 == 0) x.read_only_uses.push_back(u);
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

// HELD is a later section: a file written before it reads as holding nothing past last uses.
TEST(TraceFormat, BinaryWithoutTheHeldSectionHoldsNothing) {
  Trace t = make_trace({1, 1, 1});
  add_tensor(t, 10, {0}).held_after_use = 2;
  std::vector<std::byte> data = trace_to_binary(t);
  data.resize(data.size() - 8);  // drop the checksum and its flag: the last section goes too
  data[12] = std::byte{0};
  const auto held_section = [&] {
    for (std::size_t at = 16; at + 12 <= data.size();) {
      std::uint64_t length;
      std::memcpy(&length, data.data() + at + 4, 8);
      if (std::memcmp(data.data() + at, "HELD", 4) == 0) return std::pair{at, 12 + length};
      at += 12 + length;
    }
    return std::pair<std::size_t, std::size_t>{0, 0};
  }();
  ASSERT_GT(held_section.second, 0u);
  EXPECT_EQ(parse_trace_binary(data).tensors[0].held_after_use, 2u);
  data.erase(data.begin() + static_cast<std::ptrdiff_t>(held_section.first),
             data.begin() + static_cast<std::ptrdiff_t>(held_section.first + held_section.second));
  EXPECT_EQ(parse_trace_binary(data).tensors[0].held_after_use, 0u);
}

TEST(TraceFormat, ReadOnlyUsesMustBeUsesInOrder) {
  Trace t = make_trace({1, 1, 1});
  add_tensor(t, 10, {0, 2}).read_only_uses = {1};
  EXPECT_THROW(validate(t), Error);
  t.tensors[0].read_only_uses = {2, 0};
  EXPECT_THROW(validate(t), Error);
  t.tensors[0].read_only_uses = {2};
  EXPECT_NO_THROW(validate(t));
  EXPECT_FALSE(only_reads(t.tensors[0], 0));
  EXPECT_TRUE(only_reads(t.tensors[0], 2));
  std::string json = trace_to_json(t);
  EXPECT_NE(json.find("\"read_only_uses\": [2]"), std::string::npos) << json;
  json.replace(json.find("[2]"), 3, "[1]");
  EXPECT_THROW(parse_trace_json(json), Error);
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
