#include "iobench_report.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::cli {
namespace {

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
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
  // Ordered, so that the file lists facts and rows in the order the table shows them.
  nlohmann::ordered_json facts = nlohmann::ordered_json::object();
  for (const auto& [name, value] : report.facts) facts[name] = value;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const BenchRow& r : report.rows) {
    results.push_back({{"mode", r.mode},
                       {"direction", r.direction},
                       {"backend", r.backend},
                       {"paths", r.paths},
                       {"bytes", r.bytes},
                       {"seconds", r.seconds},
                       {"gb_per_s", r.bps() / 1e9},
                       {"raw_gb_per_s", r.raw_bps / 1e9},
                       {"raw", r.raw_name},
                       {"ratio", r.ratio()},
                       {"note", r.note}});
  }
  const nlohmann::ordered_json document = {{"facts", facts}, {"results", results}};
  return document.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace teraio::cli
