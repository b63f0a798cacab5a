// `teraio iobench`: sequential write and read of a volume through each SSD backend, the bounce
// path to device memory and the host tier, each printed beside a raw reference measured in
// the same run on the same paths (dd / fio with O_DIRECT, one pinned device copy).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "command.hpp"
#include "iobench_config.hpp"
#include "iobench_probe.hpp"
#include "iobench_raw.hpp"
#include "iobench_report.hpp"
#include "iobench_run.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::cli {
namespace {

namespace fs = std::filesystem;

// The temp directory iobench made for itself when no --paths were given; removed at the end
// unless asked to keep it. Never used for --paths: big deletes stall some disks for minutes.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string pattern = (fs::temp_directory_path() / "teraio-iobench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw_errno(errno, "mkdtemp ", pattern);
    path_ = pattern;
  }
  ~ScratchDirectory() {
    if (keep_) return;
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  const std::string& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

std::size_t distinct_devices(const std::vector<std::string>& paths) {
  std::set<dev_t> devices;
  for (const auto& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) == 0) devices.insert(st.st_dev);
  }
  return std::max<std::size_t>(1, devices.size());
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += out.empty() ? item : ", " + item;
  return out;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

int run_iobench(const std::vector<std::string>& args) {
  std::string help;
  const auto parsed = parse_iobench_args(args, help);
  if (!parsed) {
    std::printf("%s", help.c_str());
    return 0;
  }
  IobenchConfig config = *parsed;
  std::unique_ptr<ScratchDirectory> scratch;
  if (config.paths.empty()) {
    scratch = std::make_unique<ScratchDirectory>();
    config.paths.push_back(scratch->path());
    if (config.keep_files) scratch->keep();
  }

  const MachineProbe machine = probe_machine(config.paths.front());
  for (const auto& path : config.paths) {
    const PathProbe p = probe_path(path, machine);
    if (!p.usable)
      throw Error(ErrorKind::kInvalidArgument, cat("iobench: path ", path, " is not usable: ", p.problem));
    const std::uint64_t need =
        config.volume * (path == config.paths.front() ? 2 : 1) / config.paths.size() + kGiB / 4;
    if (p.free_bytes < need) {
      throw Error(ErrorKind::kNoSpace, cat("iobench: ", path, " has ", format_bytes(p.free_bytes),
                                           " free, needs about ", format_bytes(need)));
    }
  }
  auto copier = config.cuda ? io::make_cuda_copier(0, io::CopyOrder::kIssue) : io::make_host_copier();
  const bool can_drop = drop_page_cache();

  BenchReport report;
  report.facts = {
      {"date", now_utc()},
      {"kernel", machine.kernel},
      {"cpus", std::to_string(machine.cpus)},
      {"copier", copier->name()},
      {"cuda devices", machine.cuda_devices.empty() ? machine.cuda_detail : join(machine.cuda_devices)},
      {"cufile", machine.cufile_detail},
      {"io_uring", machine.uring_detail},
      {"paths", join(config.paths)},
      {"distinct devices", std::to_string(distinct_devices(config.paths))},
      {"volume", format_bytes(config.volume)},
      {"chunk (bytes per transfer)", format_bytes(config.chunk)},
      {"request size", format_bytes(config.request_size)},
      {"stripe unit", format_bytes(config.stripe_unit)},
      {"threads per path (posix)", std::to_string(config.threads)},
      {"queue depth per path (io_uring)", std::to_string(config.queue_depth)},
      {"transfers in flight", std::to_string(config.transfers_in_flight)},
      {"repeat (median reported)", std::to_string(config.repeat)},
      {"page cache dropped before reads",
       can_drop ? "yes (root)" : "no (not root; O_DIRECT bypasses it anyway)"},
  };

  // Raw reference on the first path; paths on distinct devices scale it (assumed identical disks).
  Reference raw{0, 0, "none"};
  if (config.raw_reference) {
    RawOptions ro{(fs::path(config.paths.front()) / "teraio-iobench-raw.dat").string(),
                  config.volume,
                  config.request_size,
                  config.queue_depth,
                  config.repeat,
                  config.warmup};
    // Only the first reference pays the untimed first write of the preallocated file.
    RawOptions later = ro;
    later.warmup = false;
    std::vector<std::pair<std::string, std::function<RawMeasurement()>>> tools{
        {"dd", [&] { return measure_dd(ro, 1); }},
        {"dd x4", [&] { return measure_dd(later, 4); }},
        {"fio", [&] { return measure_fio(later, 1); }},
        {"fio x4", [&] { return measure_fio(later, 4); }},
    };
    for (const auto& [name, measure] : tools) {
      std::fprintf(stderr, "iobench: raw reference %s\n", name.c_str());
      const RawMeasurement m = measure();
      if (!m.problem.empty()) {
        std::fprintf(stderr, "iobench: %s: %s\n", m.tool.c_str(), m.problem.c_str());
        report.facts.emplace_back(cat("raw ", m.tool), m.problem);
        continue;
      }
      report.rows.push_back(
          {"raw O_DIRECT", "write", m.tool, 1, config.volume, config.volume / m.write_bps, 0, "", ""});
      report.rows.push_back(
          {"raw O_DIRECT", "read", m.tool, 1, config.volume, config.volume / m.read_bps, 0, "", ""});
      raw.write_bps = std::max(raw.write_bps, m.write_bps);
      raw.read_bps = std::max(raw.read_bps, m.read_bps);
    }
    const double scale = static_cast<double>(distinct_devices(config.paths));
    raw.write_bps *= scale;
    raw.read_bps *= scale;
    raw.name = scale > 1 ? cat("best raw x ", scale, " devices") : "best raw";
  }

  IobenchRunner runner(config, *copier, config.paths);
  for (const auto& b : config.backends) {
    if (b == "io_uring" && !machine.uring_works) {
      report.facts.emplace_back("io_uring skipped", machine.uring_detail);
      continue;
    }
    const auto choice = io::parse_backend_choice(b);
    for (auto& row : runner.ssd_tier(choice, io::MemoryKind::kHost, raw)) report.rows.push_back(row);
  }
  if (config.cuda) {
    for (auto& row : runner.ssd_tier(io::BackendChoice::kAuto, io::MemoryKind::kDevice, raw)) {
      report.rows.push_back(row);
    }
  }
  if (config.host_tier) {
    const auto copies = runner.raw_copy();
    const Reference copy_ref{copies[0].bps(), copies[1].bps(), cat("raw ", copies[0].backend)};
    for (const auto& row : copies) report.rows.push_back(row);
    for (auto& row : runner.host_tier(copy_ref)) report.rows.push_back(row);
  }

  for (const auto& [key, value] : report.facts) std::printf("%-34s %s\n", key.c_str(), value.c_str());
  std::printf("\n%s", format_table(report).c_str());
  if (!config.json_path.empty()) {
    std::ofstream out(config.json_path);
    out << to_json(report);
    if (!out) throw_errno(errno, "iobench: cannot write ", config.json_path);
    std::printf("\nresults written to %s\n", config.json_path.c_str());
  }
  if (!scratch || config.keep_files) {
    std::printf("data files left in place (swap files teraio-rank0.swap, teraio-iobench-raw.dat): %s\n",
                join(config.paths).c_str());
  }
  return 0;
}

const CommandRegistration kRegistration{
    "iobench", "measure the storage engine against raw O_DIRECT and device copies", run_iobench};

}  // namespace
}  // namespace teraio::cli
