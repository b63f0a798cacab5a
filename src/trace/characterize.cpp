#include "teraio/trace/characterize.hpp"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::trace {
namespace {

constexpr std::uint64_t kMB = 1000 * 1000;

double share(double part, double whole) {
  return whole > 0 ? part / whole : 0;
}

// An output file whose every failure (open, write, close) becomes an Error naming it.
class OutputFile {
 public:
  explicit OutputFile(const std::filesystem::path& path) : path_(path.string()), out_(path) {
    if (!out_) throw_errno(errno, "cannot create ", path_);
    out_.precision(std::numeric_limits<double>::max_digits10);
  }
  std::ofstream& out() { return out_; }
  void close() {
    out_.close();
    if (!out_) throw Error(ErrorKind::kIo, cat("cannot write ", path_));
  }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace

const std::vector<SizeBucket>& size_buckets() {
  static const std::vector<SizeBucket> buckets = {
      {"<1MB", 0, kMB},
      {"1-10MB", kMB, 10 * kMB},
      {"10-100MB", 10 * kMB, 100 * kMB},
      {"100MB-1GB", 100 * kMB, 1000 * kMB},
      {">=1GB", 1000 * kMB, std::numeric_limits<std::uint64_t>::max()},
  };
  return buckets;
}

std::size_t size_bucket_of(std::uint64_t bytes) {
  const auto& buckets = size_buckets();
  for (std::size_t b = 0; b + 1 < buckets.size(); ++b)
    if (bytes < buckets[b].max_bytes) return b;
  return buckets.size() - 1;
}

namespace {

// Per operator, the bytes of step-local tensors held after their last use up to their release,
// and the summary's percentiles of it.
void held_past_use(const Trace& trace, Characterization& c) {
  const std::size_t n = trace.ops.size();
  std::vector<std::int64_t> change(n + 1, 0);  // a running sum gives each operator's bytes
  CharacterizationSummary& s = c.summary;
  for (const Tensor& t : trace.tensors) {
    if (t.persistent || t.uses.empty() || t.held_after_use == 0) continue;
    s.releases_recorded = true;
    const std::size_t from = std::size_t{t.uses.back()} + 1;
    const std::size_t to = std::min<std::size_t>(release_op(t), n - 1);  // inclusive
    if (from > to) continue;
    change[from] += static_cast<std::int64_t>(t.bytes);
    change[to + 1] -= static_cast<std::int64_t>(t.bytes);
  }
  c.held_past_use_bytes.assign(n, 0);
  std::int64_t held = 0;
  for (std::size_t k = 0; k < n; ++k) {
    held += change[k];
    c.held_past_use_bytes[k] = static_cast<std::uint64_t>(held);
    if (c.held_past_use_bytes[k] > s.held_past_use_max_bytes) {
      s.held_past_use_max_bytes = c.held_past_use_bytes[k];
      s.held_past_use_max_op = k;
    }
  }
  if (n == 0) return;
  std::vector<std::uint64_t> sorted = c.held_past_use_bytes;
  std::sort(sorted.begin(), sorted.end());
  s.held_past_use_p90_bytes = sorted[(n - 1) * 90 / 100];
  s.held_past_use_p99_bytes = sorted[(n - 1) * 99 / 100];
}

}  // namespace

Characterization characterize(const Trace& trace, double idle_threshold_s) {
  Characterization c;
  c.start_s = op_start_times(trace);
  c.demand_bytes = memory_demand(trace);
  c.active_bytes = active_bytes(trace);
  const auto periods = inactive_periods(trace, c.start_s);
  const std::size_t buckets = size_buckets().size();
  c.sizes.assign(buckets, {});
  c.idle_s_by_bucket.assign(buckets, {});

  CharacterizationSummary& s = c.summary;
  s.ops = trace.ops.size();
  s.tensors = trace.tensors.size();
  s.inactive_periods = periods.size();
  s.step_time_s = c.start_s.back();
  s.idle_threshold_s = idle_threshold_s;

  std::uint64_t total_bytes = 0;
  for (const Tensor& t : trace.tensors) {
    SizeMix& mix = c.sizes[size_bucket_of(t.bytes)];
    ++mix.tensors;
    mix.bytes += t.bytes;
    total_bytes += t.bytes;
    s.uses += t.uses.size();
  }

  std::vector<bool> idle_long(trace.tensors.size(), false);
  std::size_t long_periods = 0;
  for (const InactivePeriod& p : periods) {
    const std::size_t b = size_bucket_of(trace.tensors[p.tensor].bytes);
    ++c.sizes[b].inactive_periods;
    c.idle_s_by_bucket[b].push_back(p.idle_s);
    if (p.idle_s > idle_threshold_s) {
      ++long_periods;
      idle_long[p.tensor] = true;
    }
  }
  for (auto& lengths : c.idle_s_by_bucket) std::sort(lengths.begin(), lengths.end());

  std::size_t idle_tensors = 0;
  std::uint64_t idle_bytes = 0;
  for (std::size_t i = 0; i < trace.tensors.size(); ++i)
    if (idle_long[i]) {
      ++idle_tensors;
      idle_bytes += trace.tensors[i].bytes;
    }
  s.share_tensors_idle_over_threshold =
      share(static_cast<double>(idle_tensors), static_cast<double>(s.tensors));
  s.share_bytes_idle_over_threshold =
      share(static_cast<double>(idle_bytes), static_cast<double>(total_bytes));
  s.share_periods_over_threshold =
      share(static_cast<double>(long_periods), static_cast<double>(periods.size()));

  double share_sum = 0;
  std::size_t counted = 0;
  for (std::size_t k = 0; k < trace.ops.size(); ++k) {
    s.peak_demand_bytes = std::max(s.peak_demand_bytes, c.demand_bytes[k]);
    s.max_active_bytes = std::max(s.max_active_bytes, c.active_bytes[k]);
    if (c.demand_bytes[k] == 0) continue;
    const double op_share =
        share(static_cast<double>(c.active_bytes[k]), static_cast<double>(c.demand_bytes[k]));
    share_sum += op_share;
    s.max_active_share = std::max(s.max_active_share, op_share);
    ++counted;
  }
  s.mean_active_share = counted ? share_sum / static_cast<double>(counted) : 0;
  held_past_use(trace, c);
  return c;
}

void write_characterization(const Characterization& c, const std::string& dir, std::size_t cdf_points) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, cat("cannot create directory ", dir, ": ", ec.message()), ec.value());
  const std::filesystem::path root(dir);
  const auto& buckets = size_buckets();

  OutputFile memory(root / "memory.csv");
  memory.out() << "op,start_s,demand_bytes,active_bytes,active_share,held_past_use_bytes\n";
  for (std::size_t k = 0; k < c.demand_bytes.size(); ++k)
    memory.out() << k << ',' << c.start_s[k] << ',' << c.demand_bytes[k] << ',' << c.active_bytes[k] << ','
                 << share(static_cast<double>(c.active_bytes[k]), static_cast<double>(c.demand_bytes[k]))
                 << ',' << (k < c.held_past_use_bytes.size() ? c.held_past_use_bytes[k] : 0) << '\n';
  memory.close();

  OutputFile sizes(root / "sizes.csv");
  sizes.out() << "bucket,min_bytes,max_bytes,tensors,bytes,inactive_periods\n";
  for (std::size_t b = 0; b < buckets.size(); ++b)
    sizes.out() << buckets[b].label << ',' << buckets[b].min_bytes << ','
                << (b + 1 < buckets.size() ? std::to_string(buckets[b].max_bytes) : std::string()) << ','
                << c.sizes[b].tensors << ',' << c.sizes[b].bytes << ',' << c.sizes[b].inactive_periods
                << '\n';
  sizes.close();

  // The CDF is sampled at evenly spaced ranks so large traces give small files; the
  // longest period of each bucket is always kept.
  OutputFile cdf(root / "inactive_cdf.csv");
  cdf.out() << "bucket,idle_s,cdf\n";
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& lengths = c.idle_s_by_bucket[b];
    const std::size_t n = lengths.size();
    const std::size_t points = std::min(n, std::max<std::size_t>(cdf_points, 2));
    for (std::size_t p = 0; p < points; ++p) {
      const std::size_t rank = points == 1 ? n - 1 : p * (n - 1) / (points - 1);
      cdf.out() << buckets[b].label << ',' << lengths[rank] << ','
                << static_cast<double>(rank + 1) / static_cast<double>(n) << '\n';
    }
  }
  cdf.close();

  const CharacterizationSummary& s = c.summary;
  const nlohmann::ordered_json summary = {
      {"ops", s.ops},
      {"tensors", s.tensors},
      {"uses", s.uses},
      {"inactive_periods", s.inactive_periods},
      {"step_time_s", s.step_time_s},
      {"peak_demand_bytes", s.peak_demand_bytes},
      {"max_active_bytes", s.max_active_bytes},
      {"mean_active_share", s.mean_active_share},
      {"max_active_share", s.max_active_share},
      {"idle_threshold_s", s.idle_threshold_s},
      {"share_tensors_idle_over_threshold", s.share_tensors_idle_over_threshold},
      {"share_bytes_idle_over_threshold", s.share_bytes_idle_over_threshold},
      {"share_periods_over_threshold", s.share_periods_over_threshold},
      {"releases_recorded", s.releases_recorded},
      {"held_past_use_p90_bytes", s.held_past_use_p90_bytes},
      {"held_past_use_p99_bytes", s.held_past_use_p99_bytes},
      {"held_past_use_max_bytes", s.held_past_use_max_bytes},
      {"held_past_use_max_op", s.held_past_use_max_op},
  };
  OutputFile json(root / "summary.json");
  json.out() << summary.dump(2) << '\n';
  json.close();
  OutputFile csv(root / "summary.csv");
  csv.out() << "metric,value\n";
  for (const auto& [key, value] : summary.items()) csv.out() << key << ',' << value.dump() << '\n';
  csv.close();
}

}  // namespace teraio::trace
