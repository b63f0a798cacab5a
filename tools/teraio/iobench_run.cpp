#include "iobench_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "iobench_raw.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/pinned_pool.hpp"

namespace teraio::cli {
namespace {

using Clock = std::chrono::steady_clock;

void progress(const std::string& text) {
  std::fprintf(stderr, "iobench: %s\n", text.c_str());
}

double seconds_of(const std::function<void()>& work) {
  const auto start = Clock::now();
  work();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct HostBuffer {
  explicit HostBuffer(std::uint64_t n) : data(static_cast<std::byte*>(std::aligned_alloc(kPageSize, n))) {
    if (data == nullptr)
      throw Error(ErrorKind::kIo, cat("iobench: cannot allocate ", format_bytes(n), " of host memory"));
  }
  ~HostBuffer() { std::free(data); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  std::byte* data;
};

struct DeviceBuffer {
  DeviceBuffer(io::DeviceCopier& c, std::uint64_t n)
      : copier(c), data(static_cast<std::byte*>(c.allocate_device(n))) {}
  ~DeviceBuffer() { copier.free_device(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  io::DeviceCopier& copier;
  std::byte* data;
};

}  // namespace

// Host source and destination (for the SSD tier from host memory and for verification) and
// device source and destination (for the bounce path and the host tier), each of the volume.
struct IobenchRunner::Buffers {
  Buffers(io::DeviceCopier& copier, std::uint64_t volume)
      : host_src(volume), host_dst(volume), device_src(copier, volume), device_dst(copier, volume) {}
  HostBuffer host_src;
  HostBuffer host_dst;
  DeviceBuffer device_src;
  DeviceBuffer device_dst;
};

IobenchRunner::IobenchRunner(const IobenchConfig& config, io::DeviceCopier& copier,
                             std::vector<std::string> paths)
    : config_(config), copier_(copier), paths_(std::move(paths)) {
  progress(cat("allocating ", format_bytes(config_.volume), " x 2 of host memory and x 2 of ", copier_.name(),
               " memory"));
  buffers_ = std::make_unique<Buffers>(copier_, config_.volume);
  fill_source();
}

IobenchRunner::~IobenchRunner() = default;

void IobenchRunner::fill_source() {
  auto* words = reinterpret_cast<std::uint64_t*>(buffers_->host_src.data);
  const std::uint64_t n = config_.volume / sizeof(std::uint64_t);
  // Every 8 bytes differ from their neighbours and from other offsets: a misplaced chunk shows.
  for (std::uint64_t i = 0; i < n; ++i) words[i] = i * 0x9E3779B97F4A7C15ULL + 0x5851F42D4C957F2DULL;
  copier_.to_device(buffers_->device_src.data, buffers_->host_src.data, config_.volume)->wait();
}

// Zeroes both destinations before a read pass: without it a read that silently did nothing
// would find the previous mode's correct bytes there and pass verification.
void IobenchRunner::clear_destinations() {
  std::memset(buffers_->host_dst.data, 0, config_.volume);
  copier_.to_device(buffers_->device_dst.data, buffers_->host_dst.data, config_.volume)->wait();
}

void IobenchRunner::verify(const std::string& what) {
  const std::byte* expected = buffers_->host_src.data;
  const std::byte* actual = buffers_->host_dst.data;
  if (std::memcmp(expected, actual, config_.volume) == 0) return;
  std::uint64_t at = 0;
  while (expected[at] == actual[at]) ++at;
  throw Error(ErrorKind::kInternal,
              cat("iobench: ", what, ": data read back differs from data written at byte ", at));
}

io::EngineConfig IobenchRunner::engine_config() const {
  io::EngineConfig ec;
  ec.stripe_unit = config_.stripe_unit;
  ec.io_threads = config_.threads;
  ec.queue_depth = config_.queue_depth;
  ec.transfer_threads = config_.transfers_in_flight;
  ec.chunk_bytes = config_.request_size;
  ec.bounce_pool_bytes =
      static_cast<std::uint64_t>(config_.transfers_in_flight) * ec.chunks_in_flight * config_.request_size;
  return ec;
}

std::vector<BenchRow> IobenchRunner::ssd_tier(io::BackendChoice backend, io::MemoryKind kind,
                                              const Reference& raw) {
  const bool device = kind == io::MemoryKind::kDevice;
  const std::string mode = device ? cat("bounce ", copier_.name()) : "ssd tier";
  io::EngineConfig ec = engine_config();
  ec.ssd_paths = paths_;
  ec.backend = backend;
  ec.use_cufile = device;
  const std::uint64_t n = paths_.size();
  // Every path holds its share of each striped extent plus a rounding slack: the same size
  // in every mode, so the swap files are preallocated once and reused.
  ec.ssd_capacity_per_path = align_up((config_.volume + n - 1) / n, config_.stripe_unit) +
                             2 * align_up(config_.chunk, config_.stripe_unit);
  progress(cat(mode, " (", to_string(backend), ", ", n, " path(s)): opening swap files of ",
               format_bytes(ec.ssd_capacity_per_path)));
  io::TierStore store(copier_, ec);
  std::vector<io::Extent> extents;
  for (std::uint64_t off = 0; off < config_.volume; off += config_.chunk) {
    const auto extent = store.allocate(io::TierKind::kSsd, std::min(config_.chunk, config_.volume - off));
    if (!extent) throw Error(ErrorKind::kTierFull, cat("iobench: SSD tier full at ", format_bytes(off)));
    extents.push_back(*extent);
  }
  const std::byte* src = device ? buffers_->device_src.data : buffers_->host_src.data;
  std::byte* dst = device ? buffers_->device_dst.data : buffers_->host_dst.data;
  const auto write_all = [&] {
    std::vector<io::Transfer> transfers;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      transfers.push_back(store.write(extents[i], src + i * config_.chunk, kind, cat("iobench extent ", i)));
    }
    for (const auto& t : transfers) t.wait();
  };
  const auto read_all = [&] {
    std::vector<io::Transfer> transfers;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      transfers.push_back(store.read(extents[i], dst + i * config_.chunk, kind));
    }
    for (const auto& t : transfers) t.wait();
  };
  if (config_.warmup && !swap_files_warm_) {
    progress(cat(mode, ": untimed first write (turns preallocated extents into written ones)"));
    write_all();
    swap_files_warm_ = true;
  }
  std::vector<double> writes;
  std::vector<double> reads;
  for (unsigned pass = 1; pass <= config_.repeat; ++pass) {
    progress(cat(mode, " ", to_string(backend), ": write pass ", pass, "/", config_.repeat));
    writes.push_back(seconds_of(write_all));
    clear_destinations();
    drop_page_cache();
    progress(cat(mode, " ", to_string(backend), ": read pass ", pass, "/", config_.repeat));
    reads.push_back(seconds_of(read_all));
    if (device) copier_.to_host(buffers_->host_dst.data, buffers_->device_dst.data, config_.volume)->wait();
    verify(cat(mode, " ", to_string(backend), " pass ", pass));
  }
  const io::TierStoreReport report = store.report();
  for (const auto& e : extents) store.release(e);

  std::string used_backend = report.paths.empty() ? "?" : report.paths.front().backend;
  std::string note = "verified";
  bool all_cufile = !report.paths.empty();
  bool all_registered = !report.paths.empty();
  for (const auto& p : report.paths) {
    all_cufile = all_cufile && p.cufile_active;
    all_registered = all_registered && p.buffers_registered;
    if (p.backend != used_backend) used_backend = "mixed";
    if (!p.direct_io) note += cat("; ", p.path, " buffered: ", p.buffered_reason);
  }
  if (all_registered) note += "; registered buffers";
  if (device) {
    if (all_cufile) {
      used_backend = "cuFile (GDS)";
    } else {
      used_backend += " + bounce";
      if (!report.paths.empty()) note += cat("; cuFile: ", report.paths.front().cufile_detail);
    }
  }
  BenchRow w{mode,
             device ? "device->ssd" : "write",
             used_backend,
             paths_.size(),
             config_.volume,
             median(writes),
             raw.write_bps,
             raw.name,
             note};
  BenchRow r{mode,
             device ? "ssd->device" : "read",
             used_backend,
             paths_.size(),
             config_.volume,
             median(reads),
             raw.read_bps,
             raw.name,
             note};
  progress(cat(mode, " ", used_backend, ": write ", format_bandwidth(w.bps()), ", read ",
               format_bandwidth(r.bps())));
  return {w, r};
}

std::vector<BenchRow> IobenchRunner::raw_copy() {
  progress(cat("raw copy: pinning ", format_bytes(config_.volume), " of host memory"));
  io::PinnedRegion pinned(copier_, config_.volume);
  // One untimed round first: it pays for lazy CUDA initialisation and first-touch page faults.
  copier_.to_host(pinned.data(), buffers_->device_src.data, config_.volume)->wait();
  copier_.to_device(buffers_->device_dst.data, pinned.data(), config_.volume)->wait();
  std::vector<double> d2h;
  std::vector<double> h2d;
  for (unsigned pass = 1; pass <= config_.repeat; ++pass) {
    d2h.push_back(seconds_of(
        [&] { copier_.to_host(pinned.data(), buffers_->device_src.data, config_.volume)->wait(); }));
    h2d.push_back(seconds_of(
        [&] { copier_.to_device(buffers_->device_dst.data, pinned.data(), config_.volume)->wait(); }));
  }
  const std::string how = copier_.is_cuda() ? "cudaMemcpyAsync pinned" : "memcpy";
  BenchRow a{
      "raw copy", "device->host", how, 0, config_.volume, median(d2h), 0, "", "one copy of the whole volume"};
  BenchRow b{
      "raw copy", "host->device", how, 0, config_.volume, median(h2d), 0, "", "one copy of the whole volume"};
  progress(cat("raw copy: device->host ", format_bandwidth(a.bps()), ", host->device ",
               format_bandwidth(b.bps())));
  return {a, b};
}

std::vector<BenchRow> IobenchRunner::host_tier(const Reference& raw_copy) {
  io::EngineConfig ec = engine_config();
  ec.host_capacity = align_up(config_.volume, kPageSize) + align_up(config_.chunk, kPageSize);
  progress(cat("host tier: pinning ", format_bytes(ec.host_capacity)));
  io::TierStore store(copier_, ec);
  std::vector<io::Extent> extents;
  for (std::uint64_t off = 0; off < config_.volume; off += config_.chunk) {
    const auto extent = store.allocate(io::TierKind::kHost, std::min(config_.chunk, config_.volume - off));
    if (!extent) throw Error(ErrorKind::kTierFull, cat("iobench: host tier full at ", format_bytes(off)));
    extents.push_back(*extent);
  }
  const auto run = [&](bool offload) {
    std::vector<io::Transfer> transfers;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      const std::uint64_t off = i * config_.chunk;
      transfers.push_back(
          offload ? store.write(extents[i], buffers_->device_src.data + off, io::MemoryKind::kDevice)
                  : store.read(extents[i], buffers_->device_dst.data + off, io::MemoryKind::kDevice));
    }
    for (const auto& t : transfers) t.wait();
  };
  // One untimed, verified round first, as for the raw copy it is compared with; the arena is
  // fresh then, so an offload that did nothing cannot hide behind earlier data.
  run(true);
  clear_destinations();
  run(false);
  copier_.to_host(buffers_->host_dst.data, buffers_->device_dst.data, config_.volume)->wait();
  verify("host tier first round");
  std::vector<double> offloads;
  std::vector<double> prefetches;
  for (unsigned pass = 1; pass <= config_.repeat; ++pass) {
    progress(cat("host tier: pass ", pass, "/", config_.repeat));
    offloads.push_back(seconds_of([&] { run(true); }));
    clear_destinations();
    prefetches.push_back(seconds_of([&] { run(false); }));
    copier_.to_host(buffers_->host_dst.data, buffers_->device_dst.data, config_.volume)->wait();
    verify(cat("host tier pass ", pass));
  }
  for (const auto& e : extents) store.release(e);
  const std::string backend = copier_.name();
  BenchRow a{"host tier",
             "device->host",
             backend,
             0,
             config_.volume,
             median(offloads),
             raw_copy.write_bps,
             raw_copy.name,
             cat("verified; ", format_bytes(config_.chunk), " transfers")};
  BenchRow b{"host tier",
             "host->device",
             backend,
             0,
             config_.volume,
             median(prefetches),
             raw_copy.read_bps,
             raw_copy.name,
             cat("verified; ", format_bytes(config_.chunk), " transfers")};
  progress(cat("host tier: offload ", format_bandwidth(a.bps()), ", prefetch ", format_bandwidth(b.bps())));
  return {a, b};
}

}  // namespace teraio::cli
