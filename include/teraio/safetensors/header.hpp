// safetensors: reading and writing checkpoints in the safetensors format straight to and
// from device memory, on the storage engine of teraio::io (the fastsafetensors method).
// This header: the file header, parsed and validated. A file is an 8-byte little-endian
// header length N, N bytes of UTF-8 JSON mapping tensor names to dtype, shape and data
// offsets (plus an optional "__metadata__" map of strings), then the data region, which the
// tensors must cover exactly, in offset order, without holes or overlaps. Every check of the
// reference implementation is made here, so hostile files are rejected with an Error{kFormat}
// naming the file and the tensor, never read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/safetensors/dtype.hpp"

namespace teraio::safetensors {

// The reference implementation refuses headers above 100 MB; so do we.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::string_view kMetadataKey = "__metadata__";

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::int64_t> shape;
  // Byte range within the data region (not the file).
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t bytes() const { return end - begin; }
  std::uint64_t numel() const;
};

struct Header {
  std::vector<TensorInfo> tensors;  // in file order (by offset)
  std::map<std::string, std::string> metadata;
  std::uint64_t header_bytes = 0;  // N: the JSON, with its padding
  std::uint64_t data_offset = 0;   // 8 + N: where the data region starts in the file
  std::uint64_t data_bytes = 0;    // size of the data region (the end of the last tensor)
  // Name -> position in tensors, filled by parse_header (find() scans when it is out of date).
  std::map<std::string, std::size_t, std::less<>> index;

  // The tensor of that name, or nullptr.
  const TensorInfo* find(std::string_view name) const;
};

// Parses and validates a header. bytes holds the start of the file: at least the 8-byte
// length and the N header bytes (more is ignored); file_size is the size of the whole file,
// against which the data region is checked. source_name (the path) heads every error message.
Header parse_header(std::span<const std::byte> bytes, std::string_view source_name, std::uint64_t file_size);
// Reads and validates the header of a file (two small reads, never the data).
Header read_header(const std::string& path);

}  // namespace teraio::safetensors
