// The timed modes of `teraio iobench`, each carried out through the TierStore API exactly as
// the runtime uses it: the SSD tier per backend (host memory), the bounce path between the
// SSD tier and device memory, the host tier, and the raw device copy it is judged against.
#pragma once

#include <string>
#include <vector>

#include "iobench_config.hpp"
#include "iobench_report.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::cli {

struct Reference {
  double write_bps = 0;
  double read_bps = 0;
  std::string name;
};

class IobenchRunner {
 public:
  IobenchRunner(const IobenchConfig& config, io::DeviceCopier& copier, std::vector<std::string> paths);
  ~IobenchRunner();
  IobenchRunner(const IobenchRunner&) = delete;
  IobenchRunner& operator=(const IobenchRunner&) = delete;

  // Write then read of the whole volume on the SSD tier; kind kDevice is the bounce path (or
  // cuFile where a file registers). Two rows, judged against raw.
  std::vector<BenchRow> ssd_tier(io::BackendChoice backend, io::MemoryKind kind, const Reference& raw);
  // One copy of the whole volume each way between pinned host memory and device memory: the
  // reference of the host tier ("raw pinned cudaMemcpyAsync" on CUDA, memcpy on the host copier).
  std::vector<BenchRow> raw_copy();
  // Offload (device -> host tier) and prefetch (host tier -> device) of the volume in chunks.
  std::vector<BenchRow> host_tier(const Reference& raw_copy);

 private:
  struct Buffers;
  io::EngineConfig engine_config() const;
  void fill_source();
  void clear_destinations();
  void verify(const std::string& what);

  const IobenchConfig& config_;
  io::DeviceCopier& copier_;
  std::vector<std::string> paths_;
  std::unique_ptr<Buffers> buffers_;
  bool swap_files_warm_ = false;
};

}  // namespace teraio::cli
