// The JSON plan file (docs/plan-format.md). Every value's type and range is checked before
// it is read, so a malformed file can only produce Error{kFormat} naming the field.
#include "teraio/plan/plan_io.hpp"

#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::plan {
namespace {

using nlohmann::json;

constexpr std::string_view kFormatName = "teraio-plan";

// Reading context: the input's name and the JSON path of the value being read.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(const std::string& where, std::string_view why) const {
    throw Error(ErrorKind::kFormat, cat("plan ", source_, ": ", where, ": ", why));
  }

  const json& member(const json& object, const std::string& where, const char* key) const {
    if (!object.is_object()) fail(where, cat("expected an object, got ", object.type_name()));
    const auto it = object.find(key);
    if (it == object.end()) fail(where, cat("missing member \"", key, "\""));
    return *it;
  }

  std::uint64_t u64(const json& object, const std::string& where, const char* key,
                    std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    const json& v = member(object, where, key);
    const std::string path = cat(where, ".", key);
    if (v.is_number_unsigned()) {
      const auto x = v.get<std::uint64_t>();
      if (x > max) fail(path, cat("value ", x, " exceeds the limit ", max));
      return x;
    }
    if (v.is_number_integer()) fail(path, cat("value ", v.get<std::int64_t>(), " is negative"));
    fail(path, cat("expected a non-negative integer, got ", kind(v)));
  }

  double number(const json& object, const std::string& where, const char* key) const {
    const json& v = member(object, where, key);
    const std::string path = cat(where, ".", key);
    if (!v.is_number()) fail(path, cat("expected a number, got ", kind(v)));
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0) fail(path, cat("value ", d, " is not a finite number >= 0"));
    return d;
  }

  bool boolean(const json& object, const std::string& where, const char* key) const {
    const json& v = member(object, where, key);
    if (!v.is_boolean()) fail(cat(where, ".", key), cat("expected true or false, got ", kind(v)));
    return v.get<bool>();
  }

  const std::string& text(const json& object, const std::string& where, const char* key) const {
    const json& v = member(object, where, key);
    if (!v.is_string()) fail(cat(where, ".", key), cat("expected a string, got ", kind(v)));
    return v.get_ref<const std::string&>();
  }

 private:
  static const char* kind(const json& v) {
    return v.is_number_float() ? "a fractional number" : v.type_name();
  }
  std::string source_;
};

// Written with nlohmann's ordered_json so that members appear in the documented order.
nlohmann::ordered_json hardware_json(const Hardware& hw) {
  return nlohmann::ordered_json{{"gpu_budget", hw.gpu_budget},
                                {"host_capacity", hw.host_capacity},
                                {"ssd_capacity", hw.ssd_capacity},
                                {"d2h_bandwidth", hw.d2h_bandwidth},
                                {"h2d_bandwidth", hw.h2d_bandwidth},
                                {"pcie_duplex_bandwidth", hw.pcie_duplex_bandwidth},
                                {"ssd_write_bandwidth", hw.ssd_write_bandwidth},
                                {"ssd_read_bandwidth", hw.ssd_read_bandwidth},
                                {"gpudirect", hw.gpudirect},
                                {"request_latency_s", hw.request_latency_s}};
}

Hardware read_hardware_json(const Reader& r, const json& j, const std::string& where) {
  Hardware hw;
  hw.gpu_budget = r.u64(j, where, "gpu_budget");
  hw.host_capacity = r.u64(j, where, "host_capacity");
  hw.ssd_capacity = r.u64(j, where, "ssd_capacity");
  hw.d2h_bandwidth = r.number(j, where, "d2h_bandwidth");
  hw.h2d_bandwidth = r.number(j, where, "h2d_bandwidth");
  // Optional: plans written before it was modelled have each direction at its own rate.
  if (j.contains("pcie_duplex_bandwidth"))
    hw.pcie_duplex_bandwidth = r.number(j, where, "pcie_duplex_bandwidth");
  hw.ssd_write_bandwidth = r.number(j, where, "ssd_write_bandwidth");
  hw.ssd_read_bandwidth = r.number(j, where, "ssd_read_bandwidth");
  hw.gpudirect = r.boolean(j, where, "gpudirect");
  hw.request_latency_s = r.number(j, where, "request_latency_s");
  return hw;
}

json parse(const Reader& r, std::string_view text) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    r.fail(cat("byte ", e.byte), cat("not valid JSON (", e.what(), ")"));
  } catch (const json::exception& e) {
    // Valid syntax the parser still refuses, such as a number too large for a double.
    r.fail("$", cat("not readable JSON (", e.what(), ")"));
  }
}

Migration read_migration(const Reader& r, const json& m, const std::string& where) {
  Migration out;
  out.tensor = r.u64(m, where, "tensor");
  out.bytes = r.u64(m, where, "bytes");
  if (out.bytes == 0) r.fail(cat(where, ".bytes"), "a migration of 0 bytes");
  const std::string& direction = r.text(m, where, "direction");
  if (direction == to_string(Direction::kOffload))
    out.direction = Direction::kOffload;
  else if (direction == to_string(Direction::kPrefetch))
    out.direction = Direction::kPrefetch;
  else
    r.fail(cat(where, ".direction"), cat("expected \"offload\" or \"prefetch\", got \"", direction, "\""));
  const std::string& tier = r.text(m, where, "tier");
  if (tier == to_string(Tier::kSsd))
    out.tier = Tier::kSsd;
  else if (tier == to_string(Tier::kHost))
    out.tier = Tier::kHost;
  else
    r.fail(cat(where, ".tier"), cat("expected \"ssd\" or \"host\", got \"", tier, "\""));
  constexpr std::uint64_t kMaxOp = std::numeric_limits<trace::OpIndex>::max();
  out.issue_before = static_cast<trace::OpIndex>(r.u64(m, where, "issue_before", kMaxOp));
  out.deadline = static_cast<trace::OpIndex>(r.u64(m, where, "deadline", kMaxOp));
  if (out.issue_before == out.deadline)
    r.fail(where, cat("issue_before and deadline are both operator ", out.deadline));
  out.urgent = r.boolean(m, where, "urgent");
  // Optional: plans written before copies were kept have none.
  if (m.contains("kept_copy")) out.kept_copy = r.boolean(m, where, "kept_copy");
  return out;
}

std::string read_file(const std::filesystem::path& path) {
  // A directory opens as a stream and reads as empty: say what it is instead.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorKind::kInvalidArgument, cat(path.string(), " is a directory, not a plan file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_errno(errno, "cannot open plan file ", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_errno(errno, "cannot read plan file ", path.string());
  return std::move(text).str();
}

}  // namespace

std::string plan_to_json(const Plan& plan) {
  const nlohmann::ordered_json head{{"format", kFormatName},
                                    {"version", Plan::kFormatVersion},
                                    {"hardware", hardware_json(plan.hardware)},
                                    {"peak_before", plan.peak_before},
                                    {"peak_after", plan.peak_after},
                                    {"feasible", plan.feasible}};
  // One migration per line: plans hold up to millions of them, and a line each keeps the
  // file small and diffable.
  std::string text = head.dump(1);
  text.resize(text.size() - 2);  // "\n}": the migrations follow
  text += ",\n \"migrations\": [";
  for (std::size_t i = 0; i < plan.migrations.size(); ++i) {
    const Migration& m = plan.migrations[i];
    text += i == 0 ? "\n  " : ",\n  ";
    nlohmann::ordered_json line{{"tensor", m.tensor},
                                {"bytes", m.bytes},
                                {"direction", to_string(m.direction)},
                                {"tier", to_string(m.tier)},
                                {"issue_before", m.issue_before},
                                {"deadline", m.deadline},
                                {"urgent", m.urgent}};
    if (m.kept_copy) line["kept_copy"] = true;
    text += line.dump();
  }
  text += plan.migrations.empty() ? "]\n}\n" : "\n ]\n}\n";
  return text;
}

Plan plan_from_json(std::string_view text, std::string_view source) {
  const Reader r(source);
  const json j = parse(r, text);
  if (r.text(j, "$", "format") != kFormatName)
    r.fail("$.format", cat("expected \"", kFormatName, "\", got \"", r.text(j, "$", "format"), "\""));
  const std::uint64_t version = r.u64(j, "$", "version");
  if (version != static_cast<std::uint64_t>(Plan::kFormatVersion))
    r.fail("$.version",
           cat("unsupported version ", version, " (this build reads version ", Plan::kFormatVersion, ")"));
  Plan plan;
  plan.hardware = read_hardware_json(r, r.member(j, "$", "hardware"), "$.hardware");
  plan.peak_before = r.u64(j, "$", "peak_before");
  plan.peak_after = r.u64(j, "$", "peak_after");
  plan.feasible = r.boolean(j, "$", "feasible");
  const json& migrations = r.member(j, "$", "migrations");
  if (!migrations.is_array()) r.fail("$.migrations", cat("expected an array, got ", migrations.type_name()));
  plan.migrations.reserve(migrations.size());
  for (std::size_t i = 0; i < migrations.size(); ++i) {
    const std::string where = cat("$.migrations[", i, "]");
    plan.migrations.push_back(read_migration(r, migrations[i], where));
    if (i > 0) {
      const Migration& a = plan.migrations[i - 1];
      const Migration& b = plan.migrations[i];
      if (std::tie(a.issue_before, a.tensor, a.direction) >= std::tie(b.issue_before, b.tensor, b.direction))
        r.fail(where, "migrations are not sorted by issue_before, tensor, direction (or one appears twice)");
    }
  }
  return plan;
}

void write_plan(const Plan& plan, const std::filesystem::path& path) {
  const std::string text = plan_to_json(plan);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw_errno(errno, "cannot create plan file ", path.string());
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out) throw_errno(errno, "cannot write plan file ", path.string());
}

Plan read_plan(const std::filesystem::path& path) {
  return plan_from_json(read_file(path), path.string());
}

std::string hardware_to_json(const Hardware& hardware) {
  return hardware_json(hardware).dump(1) + "\n";
}

Hardware hardware_from_json(std::string_view text, std::string_view source) {
  const Reader r(source);
  return read_hardware_json(r, parse(r, text), "$");
}

void validate(const Plan& plan, const trace::Trace& trace) {
  const Reader r("(against its trace)");
  std::unordered_map<trace::TensorId, const trace::Tensor*> by_id;
  by_id.reserve(trace.tensors.size());
  for (const trace::Tensor& t : trace.tensors) by_id.emplace(t.id, &t);
  // Offloads waiting for their prefetch, by tensor; std::map keeps the error order stable.
  std::map<trace::TensorId, int> pending;
  for (std::size_t i = 0; i < plan.migrations.size(); ++i) {
    const Migration& m = plan.migrations[i];
    const std::string where = cat("migrations[", i, "] (tensor ", m.tensor, ")");
    const auto it = by_id.find(m.tensor);
    if (it == by_id.end()) r.fail(where, "no tensor with this id in the trace");
    if (it->second->bytes != m.bytes)
      r.fail(where, cat(m.bytes, " bytes, but the trace says ", it->second->bytes));
    if (m.issue_before >= trace.ops.size() || m.deadline >= trace.ops.size())
      r.fail(where, cat("operator ", std::max(m.issue_before, m.deadline), " is past the trace's ",
                        trace.ops.size(), " operators"));
    pending[m.tensor] += m.direction == Direction::kOffload ? 1 : -1;
  }
  for (const auto& [tensor, balance] : pending) {
    // A tensor the program holds past its last use may leave then and never come back.
    const trace::Tensor& t = *by_id.at(tensor);
    if (balance == 1 && !t.persistent && t.held_after_use > 0) continue;
    if (balance != 0) r.fail(cat("tensor ", tensor), cat("offloads and prefetches differ by ", balance));
  }
}

}  // namespace teraio::plan
