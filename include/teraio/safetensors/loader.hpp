// safetensors/loader: loads a whole safetensors file into ONE destination buffer (device
// memory through a DeviceCopier, or host memory) with parallel chunked reads: cuFile straight
// into device memory where GPUDirect Storage really works, else O_DIRECT reads into pinned
// bounce buffers overlapped with the copies to the device, else buffered reads by several
// threads when the page cache already holds the file (copying out of the cache is bound by one
// core's memory bandwidth). Tensors are then views into that buffer. The mode that ran,
// and why, is reported in LoadStats, never guessed. Sharded Hugging Face checkpoints
// (model.safetensors.index.json) load shard by shard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/safetensors/header.hpp"

namespace teraio::safetensors {

enum class IoMode {
  kAuto,      // cuFile if usable, else direct unless the file is mostly in the page cache
  kCuFile,    // cuFile into device memory; fails when GDS is not usable
  kDirect,    // O_DIRECT into pinned bounce buffers
  kBuffered,  // ordinary reads through the page cache
};
std::string_view to_string(IoMode mode);
// "auto", "cufile", "direct", "buffered"; throws Error{kInvalidArgument}.
IoMode parse_io_mode(std::string_view text);

// min(16, hardware threads): enough pread threads to saturate host memory bandwidth on a GPU
// host, few enough that several files loading at once do not swamp the machine.
unsigned default_read_threads();

struct LoadOptions {
  IoMode io_mode = IoMode::kAuto;
  // Where the data region goes: device memory (copier.allocate_device) or host memory.
  io::MemoryKind destination = io::MemoryKind::kDevice;
  // One O_DIRECT read, rounded up to 4 KiB; a buffered read thread's bounce buffer, which it
  // reads half of at a time.
  std::uint64_t chunk_bytes = 16ull << 20;
  unsigned chunks_in_flight = 4;              // O_DIRECT reads in flight (each in a bounce buffer)
  unsigned threads = default_read_threads();  // buffered read threads; POSIX backend threads
  bool use_uring = true;  // io_uring for O_DIRECT reads when built in and the kernel allows it
  // Bounce buffers pinned through the copier of the load, kept by the caller so that memory is
  // pinned once rather than per load (cudaHostRegister costs about 0.5 ms per MiB); from
  // make_bounce_pool. Null: each load pins its own. Its buffer size then replaces chunk_bytes.
  // A pool serves one load at a time.
  io::PinnedBufferPool* bounce_pool = nullptr;
  // Auto picks buffered reads when at least this share of the data region is cached.
  double cached_threshold = 0.5;
};

struct LoadStats {
  std::string mode;     // "cufile", "direct", "buffered"
  std::string backend;  // "io_uring", "posix", "cufile"
  std::string reason;   // why this mode ran (auto's decision, a fallback's cause)
  std::uint64_t bytes = 0;
  double seconds = 0;
  double gigabytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// The destination buffer: device memory freed through its copier, or host memory.
class DataBuffer {
 public:
  DataBuffer() = default;
  // n == 0 allocates nothing.
  DataBuffer(io::DeviceCopier& copier, io::MemoryKind kind, std::size_t n);
  ~DataBuffer();
  DataBuffer(DataBuffer&& other) noexcept;
  DataBuffer& operator=(DataBuffer&& other) noexcept;
  DataBuffer(const DataBuffer&) = delete;
  DataBuffer& operator=(const DataBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  io::MemoryKind kind() const { return kind_; }

 private:
  void release() noexcept;

  io::DeviceCopier* copier_ = nullptr;
  io::MemoryKind kind_ = io::MemoryKind::kHost;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

struct LoadedFile {
  std::string path;
  Header header;
  DataBuffer buffer;  // the data region; tensor t lives at [t.begin, t.end) of it
  LoadStats stats;

  // Start of a tensor's bytes in the buffer (device or host memory); throws Error{kInvalidArgument}
  // naming the file for an unknown tensor.
  std::byte* tensor_data(std::string_view name) const;
};

LoadedFile load_file(const std::string& path, io::DeviceCopier& copier, const LoadOptions& options = {});

// Pinned bounce buffers for LoadOptions::bounce_pool: chunk_bytes each, enough for every read
// that options keep in flight.
std::unique_ptr<io::PinnedBufferPool> make_bounce_pool(io::DeviceCopier& copier, const LoadOptions& options);
// Whether a pool from make_bounce_pool serves loads with these options as one made for them would.
bool bounce_pool_suits(const io::PinnedBufferPool& pool, const LoadOptions& options);

// Reads bytes [begin, end) of the data region of a file whose header was read already (by
// read_header) into a destination the caller owns: end - begin bytes of memory of kind
// options.destination (device memory may come from any allocator, e.g. PyTorch's). The read
// paths and the choice among them are load_file's; it returns once every byte has arrived.
// Throws Error{kInvalidArgument} for a range outside the data region or a null destination.
LoadStats load_range(const std::string& path, const Header& header, std::uint64_t begin, std::uint64_t end,
                     std::byte* destination, io::DeviceCopier& copier, const LoadOptions& options = {});

// model.safetensors.index.json: which shard holds each tensor.
struct CheckpointIndex {
  std::string path;       // the index file
  std::string directory;  // where its shards are
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shards;                // distinct shard files, sorted
};

// Parses an index file; shard names must be relative paths inside the index's directory.
CheckpointIndex parse_index(const std::string& index_path);

struct LoadedCheckpoint {
  CheckpointIndex index;  // for a single-file checkpoint: one shard, every tensor mapped to it
  std::vector<LoadedFile> shards;
  LoadStats stats;  // totals over all shards; mode/backend joined when they differ

  // (shard, tensor) of a mapped tensor, or nullopt-like {nullptr, nullptr}.
  std::pair<const LoadedFile*, const TensorInfo*> find(std::string_view name) const;
};

// What load_index would load, without loading it: the index of an index file, of a directory
// holding model.safetensors.index.json, or a one-shard index for a directory holding
// model.safetensors or for a .safetensors path (then weight_map is empty: the shard's header
// says which tensors it holds).
CheckpointIndex resolve_checkpoint(const std::string& path);

// Loads an index file, a directory holding model.safetensors.index.json or model.safetensors,
// or a single .safetensors file. Every tensor the index maps must exist in its shard
// (Error{kFormat} naming both otherwise); a missing shard file is an Error{kIo} naming it.
LoadedCheckpoint load_index(const std::string& path, io::DeviceCopier& copier,
                            const LoadOptions& options = {});

}  // namespace teraio::safetensors
