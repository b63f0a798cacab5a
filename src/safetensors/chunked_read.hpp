// The read paths of the loader. run_chunked_read: a byte range of a file carried into a
// destination buffer in chunks, several in flight on an IoBackend, each chunk landing in a
// pinned bounce buffer and copied on (to_device) while later chunks are still being read (the
// O_DIRECT path). run_parallel_read: the buffered path for a file in the page cache, where the
// cost is the kernel's memcpy out of the cache, bound by one core's memory bandwidth; io_uring
// performs such a read inline in the submitting thread, so several threads pread instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/io_backend.hpp"
#include "teraio/io/pinned_pool.hpp"

namespace teraio::safetensors::detail {

struct ChunkedRead {
  io::IoBackend* backend = nullptr;
  io::DeviceCopier* copier = nullptr;
  std::string path;               // for error messages
  std::uint64_t file_offset = 0;  // start of the range in the file
  std::uint64_t length = 0;
  std::byte* destination = nullptr;  // length bytes of device (or host) memory
  bool destination_is_device = true;
  bool direct = false;  // the fd is O_DIRECT: reads must be page-aligned in offset, size and memory
  std::uint64_t chunk_bytes = 16ull << 20;  // ignored with a bounce_pool: its buffer size rules
  unsigned chunks_in_flight = 4;
  // Bounce buffers pinned through copier and kept by the caller across reads; null: the read
  // pins its own for its duration.
  io::PinnedBufferPool* bounce_pool = nullptr;
};

// Runs the read to the end; throws Error naming path, offset and size on the first failure,
// after every request still in flight has completed.
void run_chunked_read(const ChunkedRead& read);

struct ParallelRead {
  int fd = -1;  // opened without O_DIRECT
  io::DeviceCopier* copier = nullptr;
  std::string path;  // for error messages
  std::uint64_t file_offset = 0;
  std::uint64_t length = 0;
  std::byte* destination = nullptr;
  bool destination_is_device = true;
  // Each thread's bounce buffer; it reads pieces of half of it, one while the other is copied
  // to the device. Host destinations are read into directly, in pieces of the same size.
  std::uint64_t chunk_bytes = 16ull << 20;  // ignored with a bounce_pool: its buffer size rules
  unsigned threads = 4;
  io::PinnedBufferPool* bounce_pool = nullptr;  // as ChunkedRead's; at most one buffer per thread used
};

// Same contract as run_chunked_read; the calling thread is one of the readers.
void run_parallel_read(const ParallelRead& read);

}  // namespace teraio::safetensors::detail
