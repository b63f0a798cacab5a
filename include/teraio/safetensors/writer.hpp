// safetensors/writer: saves tensors held in host or device memory as one safetensors file
// that the reference `safetensors` library loads. Device tensors travel through the
// DeviceCopier into pinned bounce buffers. The file appears atomically: it is written under a
// temporary name in the same directory and renamed once complete.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "teraio/io/device_copy.hpp"
#include "teraio/safetensors/dtype.hpp"

namespace teraio::safetensors {

// One tensor to save: contiguous, little-endian, C order, bytes = tensor_bytes(dtype, shape).
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  io::MemoryKind memory = io::MemoryKind::kHost;
  // Needed for device tensors: copies them to host memory.
  io::DeviceCopier* copier = nullptr;
};

struct SaveOptions {
  // fsync the file (and its directory, after the rename) before returning.
  bool sync = true;
  // Size of each pinned bounce buffer used for device tensors.
  std::uint64_t chunk_bytes = 16ull << 20;
};

// Writes the tensors as the reference writer lays them out: sorted by decreasing dtype
// alignment, then by name, so every tensor starts aligned to its element size; the header is
// padded with spaces to a multiple of 8 bytes. Throws Error{kInvalidArgument} for a bad tensor
// (duplicate or reserved name, negative dimension, null data) and Error{kIo} naming the path.
void save_file(const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata,
               const std::string& path, const SaveOptions& options = {});

}  // namespace teraio::safetensors
