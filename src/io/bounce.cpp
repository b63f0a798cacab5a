#include "bounce.hpp"

#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "checksum.hpp"
#include "io_operation.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {
namespace {

struct Chunk {
  SsdPath* path = nullptr;
  std::uint64_t file_offset = 0;
  std::uint64_t logical = 0;
  std::uint64_t length = 0;
};

struct InFlight {
  Chunk chunk;
  std::shared_ptr<IoOperation> op;
  std::optional<PinnedBuffer> buffer;
};

std::vector<Chunk> chunks_of(const SsdPipeline& pipe, const std::vector<StripePiece>& pieces) {
  std::vector<Chunk> chunks;
  for (const StripePiece& piece : pieces) {
    for (std::uint64_t at = 0; at < piece.length; at += pipe.chunk_bytes) {
      chunks.push_back({pipe.paths[piece.path], piece.file_offset + at, piece.logical_offset + at,
                        std::min(pipe.chunk_bytes, piece.length - at)});
    }
  }
  return chunks;
}

// O_DIRECT can use caller memory only when address and length are page-aligned.
bool caller_memory_usable(const Chunk& chunk, const std::byte* memory) {
  return !chunk.path->file->direct_io() || (is_aligned(reinterpret_cast<std::uintptr_t>(memory), kPageSize) &&
                                            is_aligned(chunk.length, kPageSize));
}

std::size_t padded_length(const Chunk& chunk) {
  return chunk.path->file->direct_io() ? align_up(chunk.length, kPageSize) : chunk.length;
}

std::shared_ptr<IoOperation> start_io(const Chunk& chunk, IoDirection direction, void* memory,
                                      std::size_t length, bool bounce) {
  IoRequest request;
  request.direction = direction;
  request.buffer = memory;
  request.length = length;
  request.offset = chunk.file_offset;
  request.registered_buffer = bounce && chunk.path->buffers_registered ? 0 : -1;
  return IoOperation::start(*chunk.path->backend, request, chunk.path->file->path(),
                            chunk.path->file->direct_io());
}

// After a failure every request still in flight must end before its memory may be reused.
void drain(std::deque<InFlight>& in_flight) {
  for (auto& item : in_flight) {
    try {
      item.op->wait();
    } catch (...) {
      // The first failure is the one reported.
    }
  }
  in_flight.clear();
}

std::optional<PinnedBuffer> take_buffer(PinnedBufferPool& pool, bool holding_any) {
  auto buffer = pool.try_acquire();
  // Block only while holding no buffer: waiting while holding some could deadlock transfers.
  if (!buffer && !holding_any) buffer = pool.acquire();
  return buffer;
}

}  // namespace

std::uint64_t ssd_write(const SsdPipeline& pipe, const std::vector<StripePiece>& pieces, const std::byte* src,
                        MemoryKind kind) {
  const std::vector<Chunk> chunks = chunks_of(pipe, pieces);
  std::optional<Xxh3Stream> hash;
  if (pipe.checksum) hash.emplace();
  std::deque<InFlight> in_flight;
  const auto complete_front = [&] {
    InFlight& front = in_flight.front();
    front.op->wait();
    front.chunk.path->bytes_written += front.chunk.length;
    in_flight.pop_front();
  };
  try {
    for (const Chunk& chunk : chunks) {
      const std::byte* from = src + chunk.logical;
      if (kind == MemoryKind::kDevice && pipe.allow_cufile && chunk.path->cufile) {
        chunk.path->cufile->write(from, chunk.length, chunk.file_offset);
        chunk.path->bytes_written += chunk.length;
        continue;
      }
      while (in_flight.size() >= pipe.depth) complete_front();
      InFlight item{chunk, nullptr, std::nullopt};
      if (kind == MemoryKind::kHost && caller_memory_usable(chunk, from)) {
        if (hash) hash->update(from, chunk.length);
        item.op = start_io(chunk, IoDirection::kWrite, const_cast<std::byte*>(from), chunk.length, false);
      } else {
        while (!(item.buffer = take_buffer(pipe.pool, !in_flight.empty()))) complete_front();
        std::byte* bounce = item.buffer->data();
        if (kind == MemoryKind::kDevice) {
          pipe.copier.to_host(bounce, from, chunk.length)->wait();
        } else {
          std::memcpy(bounce, from, chunk.length);
        }
        if (hash) hash->update(bounce, chunk.length);
        const std::size_t length = padded_length(chunk);
        std::memset(bounce + chunk.length, 0, length - chunk.length);
        item.op = start_io(chunk, IoDirection::kWrite, bounce, length, true);
      }
      in_flight.push_back(std::move(item));
    }
    while (!in_flight.empty()) complete_front();
  } catch (...) {
    drain(in_flight);
    throw;
  }
  return hash ? hash->digest() : 0;
}

std::uint64_t ssd_read(const SsdPipeline& pipe, const std::vector<StripePiece>& pieces, std::byte* dst,
                       MemoryKind kind) {
  const std::vector<Chunk> chunks = chunks_of(pipe, pieces);
  std::optional<Xxh3Stream> hash;
  if (pipe.checksum) hash.emplace();
  std::deque<InFlight> in_flight;
  const auto complete_front = [&] {
    InFlight& front = in_flight.front();
    front.op->wait();
    std::byte* to = dst + front.chunk.logical;
    if (front.buffer) {
      if (kind == MemoryKind::kDevice) {
        pipe.copier.to_device(to, front.buffer->data(), front.chunk.length)->wait();
      } else {
        std::memcpy(to, front.buffer->data(), front.chunk.length);
      }
      if (hash) hash->update(front.buffer->data(), front.chunk.length);
    } else if (hash) {
      hash->update(to, front.chunk.length);
    }
    front.chunk.path->bytes_read += front.chunk.length;
    in_flight.pop_front();
  };
  try {
    std::size_t next = 0;
    while (next < chunks.size() || !in_flight.empty()) {
      while (next < chunks.size() && in_flight.size() < pipe.depth) {
        const Chunk& chunk = chunks[next];
        std::byte* to = dst + chunk.logical;
        if (kind == MemoryKind::kDevice && pipe.allow_cufile && chunk.path->cufile) {
          chunk.path->cufile->read(to, chunk.length, chunk.file_offset);
          chunk.path->bytes_read += chunk.length;
          ++next;
          continue;
        }
        InFlight item{chunk, nullptr, std::nullopt};
        if (kind == MemoryKind::kHost && caller_memory_usable(chunk, to)) {
          item.op = start_io(chunk, IoDirection::kRead, to, chunk.length, false);
        } else {
          item.buffer = take_buffer(pipe.pool, !in_flight.empty());
          if (!item.buffer) break;  // finish the oldest chunk first, then retry
          item.op = start_io(chunk, IoDirection::kRead, item.buffer->data(), padded_length(chunk), true);
        }
        in_flight.push_back(std::move(item));
        ++next;
      }
      if (!in_flight.empty()) complete_front();
    }
  } catch (...) {
    drain(in_flight);
    throw;
  }
  return hash ? hash->digest() : 0;
}

}  // namespace teraio::io
