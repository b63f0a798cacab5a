// The JSON form of a trace (docs/trace-format.md). Parsing goes through nlohmann's DOM and
// then checks every field's type before reading it, so a hostile file can only produce an
// Error{kFormat} naming the JSON path of the bad value. Writing is done by hand: it is much
// faster than building a DOM, and std::to_chars gives the shortest text that reads back to
// the same double.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::trace {
namespace {

using nlohmann::json;

constexpr std::string_view kFormatName = "teraio-trace";
constexpr std::int64_t kVersion = 1;

// A JSON path built only when an error is reported: "tensors[12].uses[3]".
struct Where {
  const char* array = nullptr;
  std::size_t index = 0;
  const char* field = nullptr;
  std::size_t sub_index = std::numeric_limits<std::size_t>::max();

  std::string str() const {
    std::string s = array;
    if (index != std::numeric_limits<std::size_t>::max()) s += cat("[", index, "]");
    if (field) s += cat(".", field);
    if (sub_index != std::numeric_limits<std::size_t>::max()) s += cat("[", sub_index, "]");
    return s;
  }
};

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

[[noreturn]] void fail(const Where& where, std::string_view why) {
  throw Error(ErrorKind::kFormat, cat("trace JSON: ", where.str(), ": ", why));
}

const char* type_name(const json& v) {
  return v.is_number_float() ? "a fractional number" : v.type_name();
}

const json* find(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const json& require(const json& object, const char* key, const Where& where) {
  const json* v = find(object, key);
  if (!v) fail(where, cat("missing member \"", key, "\""));
  return *v;
}

std::uint64_t to_u64(const json& v, const Where& where, std::uint64_t max) {
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (x > max) fail(where, cat("value ", x, " exceeds the limit ", max));
    return x;
  }
  if (v.is_number_integer()) fail(where, cat("value ", v.get<std::int64_t>(), " is negative"));
  fail(where, cat("expected a non-negative integer, got ", type_name(v)));
}

double to_double(const json& v, const Where& where) {
  if (!v.is_number()) fail(where, cat("expected a number, got ", type_name(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(where, "number is not finite");
  return d;
}

const std::string& to_string_ref(const json& v, const Where& where) {
  if (!v.is_string()) fail(where, cat("expected a string, got ", type_name(v)));
  return v.get_ref<const std::string&>();
}

const json& to_array(const json& v, const Where& where) {
  if (!v.is_array()) fail(where, cat("expected an array, got ", type_name(v)));
  return v;
}

const json& to_object(const json& v, const Where& where) {
  if (!v.is_object()) fail(where, cat("expected an object, got ", type_name(v)));
  return v;
}

Operator parse_op(const json& v, std::size_t k) {
  to_object(v, {"ops", k});
  Operator op;
  op.name = to_string_ref(require(v, "name", {"ops", k}), {"ops", k, "name"});
  op.duration_s = to_double(require(v, "duration_s", {"ops", k}), {"ops", k, "duration_s"});
  if (op.duration_s < 0) fail({"ops", k, "duration_s"}, cat("duration ", op.duration_s, " is negative"));
  if (const json* phase = find(v, "phase")) {
    try {
      op.phase = parse_phase(to_string_ref(*phase, {"ops", k, "phase"}));
    } catch (const Error& e) {
      fail({"ops", k, "phase"}, e.what());
    }
  }
  return op;
}

Tensor parse_tensor(const json& v, std::size_t i, std::size_t op_count) {
  to_object(v, {"tensors", i});
  Tensor t;
  t.id = to_u64(require(v, "id", {"tensors", i}), {"tensors", i, "id"},
                std::numeric_limits<std::uint64_t>::max());
  t.bytes = to_u64(require(v, "bytes", {"tensors", i}), {"tensors", i, "bytes"},
                   std::numeric_limits<std::uint64_t>::max());
  if (const json* kind = find(v, "kind")) {
    try {
      t.kind = parse_tensor_kind(to_string_ref(*kind, {"tensors", i, "kind"}));
    } catch (const Error& e) {
      fail({"tensors", i, "kind"}, e.what());
    }
  }
  if (const json* persistent = find(v, "persistent")) {
    if (!persistent->is_boolean())
      fail({"tensors", i, "persistent"}, cat("expected a boolean, got ", type_name(*persistent)));
    t.persistent = persistent->get<bool>();
  }
  if (const json* name = find(v, "name")) t.name = to_string_ref(*name, {"tensors", i, "name"});
  const json& uses = to_array(require(v, "uses", {"tensors", i}), {"tensors", i, "uses"});
  t.uses.reserve(uses.size());
  for (std::size_t u = 0; u < uses.size(); ++u) {
    const Where where{"tensors", i, "uses", u};
    const std::uint64_t op = to_u64(uses[u], where, std::numeric_limits<OpIndex>::max());
    if (op >= op_count)
      fail(where, cat("tensor ", t.id, " is used by operator ", op, ", past the last operator ",
                      op_count == 0 ? std::string("(there are none)") : std::to_string(op_count - 1)));
    if (!t.uses.empty() && op <= t.uses.back())
      fail(where,
           cat("tensor ", t.id, " uses are not sorted and unique (", op, " after ", t.uses.back(), ")"));
    t.uses.push_back(static_cast<OpIndex>(op));
  }
  if (const json* held = find(v, "held_after_use")) {
    const Where where{"tensors", i, "held_after_use"};
    const std::uint64_t ops = to_u64(*held, where, std::numeric_limits<OpIndex>::max());
    if (!t.uses.empty() && ops >= op_count - t.uses.back())
      fail(where, cat("tensor ", t.id, " is held ", ops, " operators after its last use ", t.uses.back(),
                      ", past the last operator ", op_count - 1));
    t.held_after_use = static_cast<std::uint32_t>(ops);
  }
  if (const json* reads = find(v, "read_only_uses")) {
    const json& list = to_array(*reads, {"tensors", i, "read_only_uses"});
    for (std::size_t r = 0; r < list.size(); ++r) {
      const Where where{"tensors", i, "read_only_uses", r};
      const std::uint64_t op = to_u64(list[r], where, std::numeric_limits<OpIndex>::max());
      if (!std::binary_search(t.uses.begin(), t.uses.end(), static_cast<OpIndex>(op)))
        fail(where,
             cat("tensor ", t.id, " has a read-only use at operator ", op, ", which is not one of its uses"));
      if (!t.read_only_uses.empty() && op <= t.read_only_uses.back())
        fail(where, cat("tensor ", t.id, " read-only uses are not sorted and unique (", op, " after ",
                        t.read_only_uses.back(), ")"));
      t.read_only_uses.push_back(static_cast<OpIndex>(op));
    }
  }
  return t;
}

void append_double(std::string& out, double d) {
  char buffer[32];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, d);
  out.append(buffer, r.ptr);
}

void append_string(std::string& out, const std::string& s) {
  out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

Trace parse_trace_json(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::kFormat, cat("trace JSON: syntax error at byte ", e.byte, ": ", e.what()));
  } catch (const json::exception& e) {
    // Numbers too large for a double ("1e4096") are reported as out_of_range.
    throw Error(ErrorKind::kFormat, cat("trace JSON: ", e.what()));
  }
  const Where top{"(top level)", kNone};
  to_object(doc, top);
  const json* format = find(doc, "format");
  if (!format || !format->is_string() || format->get_ref<const std::string&>() != kFormatName) {
    // What it is instead (a plan file, say) tells the user which file they mixed up.
    std::string got = format ? format->dump() : std::string("no \"format\" member");
    if (got.size() > 64) got = got.substr(0, 64) + "...";
    fail({"format", kNone}, cat("not a TeraIO trace: expected \"format\": \"", kFormatName, "\", got ", got));
  }
  const json& version = require(doc, "version", top);
  if (!version.is_number_integer() || version.get<std::int64_t>() != kVersion)
    fail({"version", kNone},
         cat("unsupported version ", version.dump(), " (this build reads version ", kVersion, ")"));

  Trace trace;
  if (const json* source = find(doc, "source")) trace.source = to_string_ref(*source, {"source", kNone});
  if (const json* untracked = find(doc, "untracked_bytes"))
    trace.untracked_bytes =
        to_u64(*untracked, {"untracked_bytes", kNone}, std::numeric_limits<std::uint64_t>::max());

  const json& ops = to_array(require(doc, "ops", top), {"ops", kNone});
  trace.ops.reserve(ops.size());
  for (std::size_t k = 0; k < ops.size(); ++k) trace.ops.push_back(parse_op(ops[k], k));

  if (const json* steps = find(doc, "step_begins")) {
    to_array(*steps, {"step_begins", kNone});
    trace.step_begins.clear();
    for (std::size_t s = 0; s < steps->size(); ++s)
      trace.step_begins.push_back(
          static_cast<OpIndex>(to_u64((*steps)[s], {"step_begins", s}, std::numeric_limits<OpIndex>::max())));
  }

  const json& tensors = to_array(require(doc, "tensors", top), {"tensors", kNone});
  trace.tensors.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    trace.tensors.push_back(parse_tensor(tensors[i], i, trace.ops.size()));

  try {
    validate(trace);
  } catch (const Error& e) {
    throw Error(ErrorKind::kFormat, cat("trace JSON: ", e.what()));
  }
  return trace;
}

std::string trace_to_json(const Trace& trace) {
  validate(trace);
  std::string out;
  out.reserve(64 + trace.ops.size() * 64 + trace.tensors.size() * 96);
  out += "{\"format\": \"teraio-trace\", \"version\": 1,\n\"source\": ";
  append_string(out, trace.source);
  out += cat(",\n\"untracked_bytes\": ", trace.untracked_bytes, ",\n\"step_begins\": [");
  for (std::size_t s = 0; s < trace.step_begins.size(); ++s) {
    if (s) out += ", ";
    out += std::to_string(trace.step_begins[s]);
  }
  out += "],\n\"ops\": [";
  for (std::size_t k = 0; k < trace.ops.size(); ++k) {
    const Operator& op = trace.ops[k];
    out += k ? ",\n  {\"name\": " : "\n  {\"name\": ";
    append_string(out, op.name);
    out += ", \"duration_s\": ";
    append_double(out, op.duration_s);
    out += ", \"phase\": \"";
    out += to_string(op.phase);
    out += "\"}";
  }
  out += "],\n\"tensors\": [";
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    const Tensor& t = trace.tensors[i];
    out += i ? ",\n  {\"id\": " : "\n  {\"id\": ";
    out += std::to_string(t.id);
    out += ", \"bytes\": ";
    out += std::to_string(t.bytes);
    out += ", \"kind\": \"";
    out += to_string(t.kind);
    out += t.persistent ? "\", \"persistent\": true, \"name\": " : "\", \"persistent\": false, \"name\": ";
    append_string(out, t.name);
    out += ", \"uses\": [";
    for (std::size_t u = 0; u < t.uses.size(); ++u) {
      if (u) out += ',';
      out += std::to_string(t.uses[u]);
    }
    out += ']';
    if (t.held_after_use != 0) {
      out += ", \"held_after_use\": ";
      out += std::to_string(t.held_after_use);
    }
    if (!t.read_only_uses.empty()) {
      out += ", \"read_only_uses\": [";
      for (std::size_t r = 0; r < t.read_only_uses.size(); ++r) {
        if (r) out += ',';
        out += std::to_string(t.read_only_uses[r]);
      }
      out += ']';
    }
    out += '}';
  }
  out += "]}\n";
  return out;
}

}  // namespace teraio::trace
