#include "iobench_raw.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::cli {
namespace {

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  int status = -1;
  std::string output;
  double seconds = 0;
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    r.output = cat("popen failed: ", std::strerror(errno));
    return r;
  }
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) r.output += buffer.data();
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Makes sure the file holds volume bytes of allocated blocks, without truncating a file that
// is already there (never a delete or truncate of a big file: see WORKLOADS.md).
std::string prepare_file(const std::string& file, std::uint64_t volume) {
  const int fd = open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return cat("cannot create ", file, ": ", std::strerror(errno));
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(volume));
  close(fd);
  if (rc != 0 && rc != EOPNOTSUPP)
    return cat("cannot preallocate ", format_bytes(volume), " in ", file, ": ", std::strerror(rc));
  return {};
}

std::uint64_t dd_block(std::uint64_t volume) {
  for (std::uint64_t bs : {16 * kMiB, 4 * kMiB, kMiB, 64 * kKiB, kPageSize}) {
    if (volume % bs == 0) return bs;
  }
  return kPageSize;
}

// fio's JSON: the "bw_bytes" of the "read" or "write" section of the first job.
double fio_bandwidth(const std::string& json, const std::string& section) {
  const auto at = json.find("\"" + section + "\" : {");
  if (at == std::string::npos) return 0;
  const auto key = json.find("\"bw_bytes\" : ", at);
  if (key == std::string::npos) return 0;
  return std::strtod(json.c_str() + key + std::strlen("\"bw_bytes\" : "), nullptr);
}

}  // namespace

double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

bool drop_page_cache() {
  if (geteuid() != 0) return false;
  sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  drop.flush();
  return static_cast<bool>(drop);
}

RawMeasurement measure_dd(const RawOptions& o, unsigned streams) {
  std::uint64_t bs = dd_block(o.volume);
  while (streams > 1 && (o.volume / bs) % streams != 0 && bs > kPageSize) bs /= 2;
  if ((o.volume / bs) % streams != 0) streams = 1;
  RawMeasurement m;
  m.tool = cat("dd O_DIRECT bs=", format_bytes(bs), streams > 1 ? cat(" x", streams, " streams") : "");
  if (m.problem = prepare_file(o.file, o.volume); !m.problem.empty()) return m;
  const std::uint64_t count = o.volume / bs / streams;
  // One shell runs the streams in parallel and fails if any of them fails.
  const auto script = [&](bool write) {
    std::string text;
    for (unsigned s = 0; s < streams; ++s) {
      const std::uint64_t first = s * count;
      text += write ? cat("dd if=/dev/zero of=", quote(o.file), " bs=", bs, " count=", count, " seek=", first,
                          " oflag=direct conv=notrunc status=none & p", s, "=$!; ")
                    : cat("dd if=", quote(o.file), " of=/dev/null bs=", bs, " count=", count, " skip=", first,
                          " iflag=direct status=none & p", s, "=$!; ");
    }
    text += "rc=0; ";
    for (unsigned s = 0; s < streams; ++s) text += cat("wait $p", s, " || rc=1; ");
    return cat("sh -c ", quote(text + "exit $rc"));
  };
  const std::string write = script(true);
  const std::string read = script(false);
  std::vector<double> writes;
  std::vector<double> reads;
  for (unsigned pass = o.warmup ? 0 : 1; pass <= o.repeat; ++pass) {
    const CommandResult w = run_command(write);
    if (w.status != 0) {
      m.problem = cat("dd write failed (exit ", w.status, "): ", trim(w.output));
      return m;
    }
    if (pass > 0) writes.push_back(w.seconds);
  }
  for (unsigned pass = 1; pass <= o.repeat; ++pass) {
    drop_page_cache();
    const CommandResult r = run_command(read);
    if (r.status != 0) {
      m.problem = cat("dd read failed (exit ", r.status, "): ", trim(r.output));
      return m;
    }
    reads.push_back(r.seconds);
  }
  m.write_bps = static_cast<double>(o.volume) / median(writes);
  m.read_bps = static_cast<double>(o.volume) / median(reads);
  return m;
}

RawMeasurement measure_fio(const RawOptions& o, unsigned jobs) {
  if (o.volume % (static_cast<std::uint64_t>(jobs) * o.request_size) != 0) jobs = 1;
  const unsigned depth = std::max(1U, o.queue_depth / jobs);
  RawMeasurement m;
  if (run_command("command -v fio").status != 0) {
    m.tool = "fio";
    m.problem = "fio not installed";
    return m;
  }
  if (m.problem = prepare_file(o.file, o.volume); !m.problem.empty()) return m;
  for (const char* engine : {"io_uring", "libaio", "psync"}) {
    m.tool = cat("fio ", engine, " bs=", format_bytes(o.request_size), " qd=", depth,
                 jobs > 1 ? cat(" x", jobs, " jobs") : "");
    // Several jobs each take a contiguous share of the file; group_reporting sums them.
    const std::string common = cat(
        "fio --name=teraio-raw --filename=", quote(o.file), " --bs=", o.request_size, " --iodepth=", depth,
        " --ioengine=", engine, " --direct=1 --size=", o.volume / jobs, " --numjobs=", jobs,
        " --offset_increment=", o.volume / jobs, " --group_reporting --output-format=json");
    std::vector<double> writes;
    std::vector<double> reads;
    bool ok = true;
    for (unsigned pass = o.warmup ? 0 : 1; ok && pass <= o.repeat; ++pass) {
      const CommandResult w = run_command(common + " --rw=write");
      const double bps = fio_bandwidth(w.output, "write");
      ok = w.status == 0 && bps > 0;
      if (!ok)
        m.problem = cat(m.tool, " write failed (exit ", w.status, "): ", trim(w.output).substr(0, 300));
      if (ok && pass > 0) writes.push_back(static_cast<double>(o.volume) / bps);
    }
    for (unsigned pass = 1; ok && pass <= o.repeat; ++pass) {
      drop_page_cache();
      const CommandResult r = run_command(common + " --rw=read");
      const double bps = fio_bandwidth(r.output, "read");
      ok = r.status == 0 && bps > 0;
      if (!ok) m.problem = cat(m.tool, " read failed (exit ", r.status, "): ", trim(r.output).substr(0, 300));
      if (ok) reads.push_back(static_cast<double>(o.volume) / bps);
    }
    if (ok) {
      m.problem.clear();
      m.write_bps = static_cast<double>(o.volume) / median(writes);
      m.read_bps = static_cast<double>(o.volume) / median(reads);
      return m;
    }
  }
  return m;
}

}  // namespace teraio::cli
