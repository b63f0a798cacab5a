// Warm (page-cache) reads of one safetensors file's data region through the host copier: the loader's
// buffered path into "device" memory (through the pinned bounce buffers) and into host memory.
// The file (TERAIO_ST_BENCH_FILE, default /tmp/teraio-st-bench.safetensors, of
// TERAIO_ST_BENCH_MIB MiB, default 1024) is written once and read whole before timing, so
// every load finds it cached. Arguments: destination (0 host, 1 device), read threads,
// chunk MiB, and whether a bounce pool is kept across loads (1) or made per load (0).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/safetensors/loader.hpp"
#include "teraio/safetensors/writer.hpp"

namespace {

namespace st = teraio::safetensors;
namespace io = teraio::io;

std::string bench_file() {
  const char* path = std::getenv("TERAIO_ST_BENCH_FILE");
  const char* mib_text = std::getenv("TERAIO_ST_BENCH_MIB");
  const std::string file = path != nullptr ? path : "/tmp/teraio-st-bench.safetensors";
  const std::int64_t mib = mib_text != nullptr ? std::atoll(mib_text) : 1024;
  if (!std::filesystem::exists(file)) {
    // Tensors of 64 MiB, like the large matrices of a model, filled with a cheap pattern.
    std::vector<std::vector<std::byte>> data;
    std::vector<st::TensorView> views;
    for (std::int64_t i = 0; i < mib / 64; ++i) {
      data.emplace_back(std::size_t{64} << 20, static_cast<std::byte>(i));
      views.push_back(
          {"t" + std::to_string(i), st::Dtype::kU8, {std::int64_t{64} << 20}, data.back().data()});
    }
    st::save_file(views, {}, file);
  }
  std::ifstream in(file, std::ios::binary);
  std::vector<char> block(std::size_t{16} << 20);
  while (in.read(block.data(), static_cast<std::streamsize>(block.size()))) {
  }
  return file;
}

void BM_WarmLoad(benchmark::State& state) {
  static const std::string file = bench_file();
  const std::unique_ptr<io::DeviceCopier> copier = io::make_host_copier();
  st::LoadOptions options;
  options.io_mode = st::IoMode::kBuffered;
  options.destination = state.range(0) != 0 ? io::MemoryKind::kDevice : io::MemoryKind::kHost;
  options.threads = static_cast<unsigned>(state.range(1));
  options.chunk_bytes = static_cast<std::uint64_t>(state.range(2)) << 20;
  std::unique_ptr<io::PinnedBufferPool> pool;
  if (state.range(3) != 0) {
    pool = st::make_bounce_pool(*copier, options);
    options.bounce_pool = pool.get();
  }
  // One destination, touched before timing: device memory has no first-touch faults, and
  // they would swamp the reads on the host copier's "device".
  const st::Header header = st::read_header(file);
  st::DataBuffer destination(*copier, options.destination, static_cast<std::size_t>(header.data_bytes));
  std::memset(destination.data(), 1, destination.size());
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    bytes += st::load_range(file, header, 0, header.data_bytes, destination.data(), *copier, options).bytes;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

BENCHMARK(BM_WarmLoad)
    ->ArgNames({"device", "threads", "chunk_mib", "pool"})
    ->ArgsProduct({{0, 1}, {1, 2, 4, 16}, {4, 16}, {1}})
    ->Args({1, 2, 16, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
