// The SSD transfer pipeline. A range is cut into chunks (at most chunk_bytes, never across a
// stripe piece); up to `depth` chunks are in flight at once over all paths. Device memory
// (and host memory that O_DIRECT cannot use as is) goes through pinned bounce buffers: the
// device copy of one chunk overlaps the disk transfer of the others. The final partial page
// is padded with zeros on write and read whole into a bounce buffer, of which only the
// requested bytes are copied out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ssd_path.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/io/stripe_set.hpp"

namespace teraio::io {

struct SsdPipeline {
  DeviceCopier& copier;
  PinnedBufferPool& pool;
  std::vector<SsdPath*> paths;
  unsigned depth = 8;
  std::uint64_t chunk_bytes = 0;
  bool checksum = false;
  // Device transfers on paths with a cuFile handle go straight to the file (no checksum then).
  bool allow_cufile = true;
};

// Writes bytes of src to the pieces; returns the XXH3 of the bytes (0 when !checksum).
std::uint64_t ssd_write(const SsdPipeline& pipe, const std::vector<StripePiece>& pieces, const std::byte* src,
                        MemoryKind kind);
// Reads the pieces into dst; returns the XXH3 of the bytes read (0 when !checksum).
std::uint64_t ssd_read(const SsdPipeline& pipe, const std::vector<StripePiece>& pieces, std::byte* dst,
                       MemoryKind kind);

}  // namespace teraio::io
