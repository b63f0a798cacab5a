#include "iobench_report.hpp"

#include <cstdio>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::cli {
namespace {

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Left-aligned in width columns, and always followed by at least one space.
std::string pad(const std::string& text, std::size_t width) {
  return text.size() + 1 >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

}  // namespace

std::string format_table(const BenchReport& report) {
  std::string out;
  out += cat(pad("mode", 18), pad("direction", 14), pad("backend", 30), pad("paths", 6), pad("bytes", 11),
             pad("seconds", 9), pad("GB/s", 8), pad("raw GB/s", 9), pad("ratio", 7), "note\n");
  for (const BenchRow& r : report.rows) {
    out += cat(pad(r.mode, 18), pad(r.direction, 14), pad(r.backend, 30),
               pad(r.paths > 0 ? std::to_string(r.paths) : "-", 6), pad(format_bytes(r.bytes), 11),
               pad(fixed(r.seconds, 3), 9), pad(fixed(r.bps() / 1e9, 2), 8),
               pad(r.raw_bps > 0 ? fixed(r.raw_bps / 1e9, 2) : "-", 9),
               pad(r.raw_bps > 0 ? cat(fixed(100 * r.ratio(), 0), "%") : "-", 7), r.note, "\n");
  }
  return out;
}

std::string to_json(const BenchReport& report) {
  std::string out = "{\n  \"facts\": {";
  for (std::size_t i = 0; i < report.facts.size(); ++i) {
    out += cat(i == 0 ? "\n" : ",\n", "    ", json_string(report.facts[i].first), ": ",
               json_string(report.facts[i].second));
  }
  out += "\n  },\n  \"results\": [";
  for (std::size_t i = 0; i < report.rows.size(); ++i) {
    const BenchRow& r = report.rows[i];
    out += cat(i == 0 ? "\n" : ",\n", "    {\"mode\": ", json_string(r.mode),
               ", \"direction\": ", json_string(r.direction), ", \"backend\": ", json_string(r.backend),
               ", \"paths\": ", r.paths, ", \"bytes\": ", r.bytes, ", \"seconds\": ", fixed(r.seconds, 6),
               ", \"gb_per_s\": ", fixed(r.bps() / 1e9, 4), ", \"raw_gb_per_s\": ", fixed(r.raw_bps / 1e9, 4),
               ", \"raw\": ", json_string(r.raw_name), ", \"ratio\": ", fixed(r.ratio(), 4),
               ", \"note\": ", json_string(r.note), "}");
  }
  out += "\n  ]\n}\n";
  return out;
}

}  // namespace teraio::cli
