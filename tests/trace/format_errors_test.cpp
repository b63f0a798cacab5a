// Every malformation the readers reject, and that the message says where and why.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/trace/trace.hpp"
#include "trace_builders.hpp"

namespace teraio::trace {
namespace {

std::string error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

std::string json_error(const std::string& text) {
  return error_of([&] { parse_trace_json(text); });
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

const std::string kValid =
    R"({"format": "teraio-trace", "version": 1, "step_begins": [0],
        "ops": [{"name": "a", "duration_s": 1, "phase": "forward"}, {"name": "b", "duration_s": 2}],
        "tensors": [{"id": 1, "bytes": 10, "kind": "parameter", "persistent": true, "uses": [0, 1]},
                    {"id": 2, "bytes": 20, "uses": [1]}]})";

struct JsonCase {
  const char* from;
  const char* to;
  const char* message;
};

TEST(TraceJsonErrors, EachMalformationIsNamed) {
  ASSERT_EQ(parse_trace_json(kValid).tensors.size(), 2u);
  const JsonCase cases[] = {
      {"\"teraio-trace\"", "\"other\"", "format: not a TeraIO trace"},
      {"\"version\": 1", "\"version\": 2", "version: unsupported version 2"},
      {"\"version\": 1", "\"version\": \"1\"", "unsupported version \"1\""},
      {"\"ops\"", "\"opz\"", "(top level): missing member \"ops\""},
      {"\"ops\": [", "\"ops\": 3, \"x\": [", "ops: expected an array, got number"},
      {"\"duration_s\": 2", "\"duration_s\": \"2\"", "ops[1].duration_s: expected a number, got string"},
      {"\"duration_s\": 2", "\"duration_s\": -2", "ops[1].duration_s: duration -2 is negative"},
      {"\"duration_s\": 2", "\"duration_s\": 1e300", "operator 1 (b) has an invalid duration"},
      {"\"duration_s\": 2", "\"duration_s\": 1e400", "number overflow parsing '1e400'"},
      {"\"duration_s\": 2", "\"duration_s\": null", "ops[1].duration_s: expected a number, got null"},
      {"\"duration_s\": 2", "\"time\": 2", "ops[1]: missing member \"duration_s\""},
      {"\"forward\"", "\"sideways\"", "ops[0].phase: unknown phase 'sideways'"},
      {"{\"name\": \"b\"", "[\"name\", \"b\"], {\"name\": \"c\"", "ops[1]: expected an object, got array"},
      {"\"bytes\": 20", "\"bytes\": -20", "tensors[1].bytes: value -20 is negative"},
      {"\"bytes\": 20", "\"bytes\": 2.5",
       "tensors[1].bytes: expected a non-negative integer, got a fractional"},
      {"\"kind\": \"parameter\"", "\"kind\": \"weight\"", "tensors[0].kind: unknown tensor kind 'weight'"},
      {"\"persistent\": true", "\"persistent\": 1", "tensors[0].persistent: expected a boolean"},
      {"\"uses\": [1]", "\"uses\": [5]",
       "tensors[1].uses[0]: tensor 2 is used by operator 5, past the last operator 1"},
      {"\"uses\": [0, 1]", "\"uses\": [1, 0]", "tensors[0].uses[1]: tensor 1 uses are not sorted and unique"},
      {"\"uses\": [0, 1]", "\"uses\": [1, 1]", "tensors[0].uses[1]: tensor 1 uses are not sorted and unique"},
      {"\"uses\": [1]", "\"uses\": [4294967296]", "tensors[1].uses[0]: value 4294967296 exceeds the limit"},
      {"\"uses\": [1]", "\"uses\": []", "tensor 2 has no use"},
      {"\"uses\": [1]", "\"uses\": [0], \"held_after_use\": 2",
       "tensors[1].held_after_use: tensor 2 is held 2 operators after its last use 0, past the last operator "
       "1"},
      {"\"uses\": [1]", "\"uses\": [0], \"held_after_use\": -1",
       "tensors[1].held_after_use: value -1 is negative"},
      {"\"id\": 2", "\"id\": 1", "tensor 1 appears twice"},
      {"\"step_begins\": [0]", "\"step_begins\": [0, 7]", "step_begins[1] = 7 is not increasing"},
      {"\"step_begins\": [0]", "\"step_begins\": [1]", "step_begins must start with operator 0"},
      {"\"step_begins\": [0]", "\"step_begins\": [-1]", "step_begins[0]: value -1 is negative"},
      {"\"version\": 1,", "\"version\": 1, \"untracked_bytes\": true,",
       "untracked_bytes: expected a non-negative integer, got boolean"},
  };
  for (const JsonCase& c : cases) {
    const std::string message = json_error(replaced(kValid, c.from, c.to));
    EXPECT_NE(message.find(c.message), std::string::npos) << "want: " << c.message << "\ngot:  " << message;
  }
}

TEST(TraceJsonErrors, SyntaxErrorsGiveTheByteOffset) {
  EXPECT_NE(json_error(kValid.substr(0, 80)).find("syntax error at byte"), std::string::npos);
  EXPECT_NE(json_error("").find("syntax error"), std::string::npos);
  EXPECT_NE(json_error("[1, 2]").find("(top level): expected an object, got array"), std::string::npos);
  // Every truncation of a valid file is an error, never a crash or a partial trace.
  for (std::size_t cut = 0; cut < kValid.size() - 1; ++cut) json_error(kValid.substr(0, cut));
}

std::vector<std::byte> valid_binary() {
  Trace t = testing::make_trace({1, 2, 3});
  testing::add_tensor(t, 10, {0, 2}, true);
  testing::add_tensor(t, 20, {1});
  return trace_to_binary(t);
}

std::string binary_error(const std::vector<std::byte>& data) {
  return error_of([&] { parse_trace_binary(data); });
}

// Drops the checksum so that edits reach the section readers.
std::vector<std::byte> without_checksum(std::vector<std::byte> data) {
  data.resize(data.size() - 8);
  data[12] = std::byte{0};
  return data;
}

template <typename T>
void put(std::vector<std::byte>& data, std::size_t at, T value) {
  std::memcpy(data.data() + at, &value, sizeof value);
}

std::size_t find_section(const std::vector<std::byte>& data, const char* tag) {
  for (std::size_t at = 16; at + 12 <= data.size();) {
    if (std::memcmp(data.data() + at, tag, 4) == 0) return at;
    std::uint64_t length;
    std::memcpy(&length, data.data() + at + 4, 8);
    at += 12 + length;
  }
  ADD_FAILURE() << "no section " << tag;
  return 0;
}

TEST(TraceBinaryErrors, HeaderVersionAndChecksum) {
  const auto good = valid_binary();
  EXPECT_EQ(parse_trace_binary(without_checksum(good)), parse_trace_binary(good));
  EXPECT_NE(binary_error({}).find("missing the TIOTRACE header"), std::string::npos);
  auto v = good;
  put<std::uint32_t>(v, 8, 2);
  EXPECT_NE(binary_error(v).find("unsupported version 2"), std::string::npos);
  auto f = good;
  put<std::uint32_t>(f, 12, 6);
  EXPECT_NE(binary_error(f).find("unknown flags"), std::string::npos);
  auto c = good;
  c[40] ^= std::byte{1};
  EXPECT_NE(binary_error(c).find("checksum mismatch"), std::string::npos);
  for (std::size_t cut = 0; cut < good.size(); ++cut)
    binary_error(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
}

TEST(TraceBinaryErrors, HostileLengthsAreCheckedBeforeAllocating) {
  const auto base = without_checksum(valid_binary());
  auto section_length = base;
  put<std::uint64_t>(section_length, find_section(base, "OPS_") + 4, std::uint64_t{1} << 60);
  EXPECT_NE(binary_error(section_length).find("claims 1152921504606846976 bytes"), std::string::npos);

  auto op_names = base;
  put<std::uint64_t>(op_names, find_section(base, "OPS_") + 12, std::uint64_t{1} << 50);
  EXPECT_NE(binary_error(op_names).find("section OPS_ at byte"), std::string::npos);
  EXPECT_NE(binary_error(op_names).find("operator name count = 1125899906842624 needs at least"),
            std::string::npos);

  auto tensors = base;
  put<std::uint64_t>(tensors, find_section(base, "TENS") + 12, 1000000);
  EXPECT_NE(binary_error(tensors).find("tensor count = 1000000 needs at least"), std::string::npos);

  auto truncated = base;
  truncated.resize(find_section(base, "USES") + 5);
  EXPECT_NE(binary_error(truncated).find("truncated section header"), std::string::npos);
  truncated.resize(find_section(base, "USES"));
  EXPECT_NE(binary_error(truncated).find("missing section USES"), std::string::npos);
}

TEST(TraceBinaryErrors, InconsistentContentIsNamed) {
  const auto base = without_checksum(valid_binary());
  const std::size_t uses = find_section(base, "USES") + 12;
  auto past_end = base;
  put<std::uint32_t>(past_end, uses + 8 + 4, 9);  // the second use of the first tensor
  EXPECT_NE(binary_error(past_end).find("tensor 101 use 1 points to operator 9 past the last operator 2"),
            std::string::npos);
  auto count = base;
  put<std::uint64_t>(count, uses, 2);
  EXPECT_NE(binary_error(count).find("holds 2 uses but the tensors' use counts add up to 3"),
            std::string::npos);
  const std::size_t held = find_section(base, "HELD") + 12;
  auto held_count = base;
  put<std::uint64_t>(held_count, held, 1);
  EXPECT_NE(binary_error(held_count).find("holds 1 tensors but the TENS section has 2"), std::string::npos);
  auto held_past_end = base;
  put<std::uint32_t>(held_past_end, held + 8 + 4, 2);  // the second tensor, last used by operator 1 of 3
  EXPECT_NE(binary_error(held_past_end).find("tensor 102 is held 2 operators after its last use 1"),
            std::string::npos);
  auto phase = base;
  const std::size_t ops = find_section(base, "OPS_") + 12;
  // 1 name table entry per op ("op0".."op2", 4+3 bytes each), then the count, indices, durations.
  const std::size_t phases = ops + 8 + 3 * 7 + 8 + 3 * 4 + 3 * 8;
  phase[phases + 1] = std::byte{9};
  EXPECT_NE(binary_error(phase).find("operator 1 has unknown phase code 9"), std::string::npos);
  auto duration = base;
  put<double>(duration, phases - 8, std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(binary_error(duration).find("operator 2 (op2) has an invalid duration nan"), std::string::npos);
}

// A cheap in-process fuzz: every single-byte corruption either parses or is a format error.
TEST(TraceBinaryErrors, SingleByteCorruptionsNeverCrash) {
  const auto base = without_checksum(valid_binary());
  for (std::size_t at = 0; at < base.size(); ++at)
    for (std::byte value : {std::byte{0}, std::byte{0x7f}, std::byte{0xff}}) {
      auto data = base;
      data[at] = value;
      try {
        parse_trace_binary(data);
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
      }
    }
}

}  // namespace
}  // namespace teraio::trace
