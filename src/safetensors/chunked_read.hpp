// The read pipeline of the loader: a byte range of a file carried into a destination buffer
// in chunks, several in flight on an IoBackend, each chunk landing in a pinned bounce buffer
// and copied on (to_device) while later chunks are still being read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "teraio/io/device_copy.hpp"
#include "teraio/io/io_backend.hpp"

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
  std::uint64_t chunk_bytes = 16ull << 20;
  unsigned chunks_in_flight = 4;
};

// Runs the read to the end; throws Error naming path, offset and size on the first failure,
// after every request still in flight has completed.
void run_chunked_read(const ChunkedRead& read);

}  // namespace teraio::safetensors::detail
