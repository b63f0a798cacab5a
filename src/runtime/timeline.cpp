#include "teraio/runtime/timeline.hpp"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::runtime {
namespace {

using nlohmann::json;

constexpr int kPid = 1;
enum Track : int { kCompute = 1, kOffload, kPrefetch, kStall };

json thread_name(Track track, std::string_view name) {
  return {{"ph", "M"}, {"pid", kPid}, {"tid", track}, {"name", "thread_name"}, {"args", {{"name", name}}}};
}

// Trace-event times are microseconds.
json span(Track track, std::string name, double start_s, double end_s, json args) {
  return {{"ph", "X"},
          {"pid", kPid},
          {"tid", track},
          {"name", std::move(name)},
          {"ts", start_s * 1e6},
          {"dur", (end_s - start_s) * 1e6},
          {"args", std::move(args)}};
}

std::string transfer_name(const TransferSpan& t) {
  const bool out = t.direction == plan::Direction::kOffload;
  return cat("tensor ", t.tensor, out ? " -> " : " <- ", plan::to_string(t.tier));
}

}  // namespace

std::string timeline_json(std::span<const OpSpan> ops, std::span<const StepStats> steps) {
  json events = json::array();
  events.push_back(
      {{"ph", "M"}, {"pid", kPid}, {"name", "process_name"}, {"args", {{"name", "teraio runtime"}}}});
  events.push_back(thread_name(kCompute, "compute"));
  events.push_back(thread_name(kOffload, "offload"));
  events.push_back(thread_name(kPrefetch, "prefetch"));
  events.push_back(thread_name(kStall, "stall"));
  for (const OpSpan& op : ops)
    events.push_back(span(kCompute, op.name, op.start_s, op.end_s, {{"step", op.step}}));
  for (const StepStats& step : steps) {
    for (const TransferSpan& t : step.transfers) {
      const Track track = t.direction == plan::Direction::kOffload ? kOffload : kPrefetch;
      events.push_back(
          span(track, transfer_name(t), t.start_s, t.end_s,
               {{"step", step.step}, {"tensor", t.tensor}, {"bytes", t.bytes}, {"planned", t.planned}}));
    }
    for (const StallSpan& s : step.stalls) {
      events.push_back(span(kStall, cat("stall before op ", s.op, " (", to_string(s.cause), ")"), s.start_s,
                            s.end_s, {{"step", step.step}, {"op", s.op}, {"cause", to_string(s.cause)}}));
    }
  }
  return json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}}.dump();
}

void write_timeline(const std::string& path, std::span<const OpSpan> ops, std::span<const StepStats> steps) {
  const std::string text = timeline_json(ops, steps);
  const std::string partial = path + ".tmp";
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    if (!file) throw_errno(errno, "cannot open timeline file ", partial);
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
    file.close();
    if (!file) {
      const int err = errno;
      std::remove(partial.c_str());
      throw_errno(err, "cannot write timeline file ", partial);
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(partial.c_str());
    throw_errno(err, "cannot move the timeline into place at ", path);
  }
}

}  // namespace teraio::runtime
