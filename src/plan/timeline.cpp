#include "teraio/plan/timeline.hpp"

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::plan {
namespace {

constexpr int kPid = 1;
constexpr int kComputeTid = 1;

void append_escaped(std::string& out, std::string_view text) {
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
}

// Trace-event times are microseconds.
std::string micros(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  return buf;
}

void thread_name(std::string& out, int tid, std::string_view name) {
  out += cat(R"({"ph":"M","pid":)", kPid, R"(,"tid":)", tid, R"(,"name":"thread_name","args":{"name":")");
  append_escaped(out, name);
  out += "\"}},\n";
  out += cat(R"({"ph":"M","pid":)", kPid, R"(,"tid":)", tid,
             R"(,"name":"thread_sort_index","args":{"sort_index":)", tid, "}},\n");
}

void span(std::string& out, int tid, std::string_view name, std::string_view category, const TimelineSpan& s,
          const std::string& args) {
  out += R"({"ph":"X","pid":)";
  out += cat(kPid, R"(,"tid":)", tid, R"(,"cat":")", category, R"(","name":")");
  append_escaped(out, name);
  out += cat(R"(","ts":)", micros(s.start_s), R"(,"dur":)", micros(s.end_s - s.start_s), R"(,"args":{)", args,
             "}},\n");
}

}  // namespace

std::string timeline_to_json(const trace::Trace& trace, const Plan& plan, const SimulationResult& result) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += cat(R"({"ph":"M","pid":)", kPid,
             R"(,"name":"process_name","args":{"name":"teraio simulated step"}},)", "\n");
  thread_name(out, kComputeTid, "compute");
  for (std::size_t c = 0; c < kChannelCount; ++c)
    thread_name(out, kComputeTid + 1 + static_cast<int>(c), to_string(static_cast<Channel>(c)));
  const auto& tl = result.timeline;
  for (const TimelineSpan& s : tl.ops) {
    const auto& op = trace.ops[s.index];
    const double stall = s.index < result.stall_per_op.size() ? result.stall_per_op[s.index] : 0.0;
    span(out, kComputeTid, op.name, to_string(op.phase), s,
         cat(R"("op":)", s.index, R"(,"stall_us":)", micros(stall)));
  }
  for (std::size_t c = 0; c < kChannelCount; ++c) {
    for (const TimelineSpan& s : tl.transfers[c]) {
      std::string name = "demand fetch or eviction";
      std::string args;
      if (s.index < plan.migrations.size()) {
        const Migration& m = plan.migrations[s.index];
        name = cat(to_string(m.direction), " ", m.tensor);
        args = cat(R"("migration":)", s.index, R"(,"tensor":)", m.tensor, R"(,"bytes":)", m.bytes,
                   R"(,"tier":")", to_string(m.tier), R"(","issue_before":)", m.issue_before,
                   R"(,"deadline":)", m.deadline, R"(,"urgent":)", m.urgent ? "true" : "false");
      }
      span(out, kComputeTid + 1 + static_cast<int>(c), name, "migration", s, args);
    }
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (const auto& [t, bytes] : tl.memory) {
    char v[64];
    std::snprintf(v, sizeof v, "%.4f,\"budget\":%.4f", double(bytes) / gib, double(result.budget) / gib);
    out += cat(R"({"ph":"C","pid":)", kPid, R"(,"name":"device memory GiB","ts":)", micros(t),
               R"(,"args":{"used":)", v, "}},\n");
  }
  // A closing event keeps the JSON valid without tracking the last comma.
  out +=
      cat(R"({"ph":"M","pid":)", kPid, R"(,"name":"process_sort_index","args":{"sort_index":0}})", "\n]}\n");
  return out;
}

void write_timeline(const trace::Trace& trace, const Plan& plan, const SimulationResult& result,
                    const std::string& path) {
  const std::string json = timeline_to_json(trace, plan, result);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw_errno(errno, "cannot open timeline file ", path);
  file.write(json.data(), static_cast<std::streamsize>(json.size()));
  file.close();
  if (!file) throw_errno(errno, "cannot write timeline file ", path);
}

}  // namespace teraio::plan
