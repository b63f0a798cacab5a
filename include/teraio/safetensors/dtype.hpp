// safetensors/dtype: the element types of the safetensors format, by the names the format
// uses ("F32", "BF16", "F8_E4M3", ...), with their sizes in bits. Sub-byte types (F4, F6_*)
// are stored packed, so a tensor's byte size is computed from bits and must come out whole.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace teraio::safetensors {

// Every dtype the reference implementation (huggingface/safetensors) defines.
enum class Dtype {
  kBool,
  kF4,
  kF6E2M3,
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

// The format's name of a dtype ("BF16").
std::string_view dtype_name(Dtype dtype);
// The dtype a format name denotes; nullopt for a name the format does not define.
std::optional<Dtype> parse_dtype(std::string_view name);
std::uint32_t dtype_bits(Dtype dtype);
// Bytes per element; 0 for the packed sub-byte types, whose elements share bytes.
std::uint32_t element_size(Dtype dtype);

// Bytes that numel(shape) elements of dtype take; nullopt when the product overflows 64 bits
// or the bits do not fill whole bytes (a packed tensor with an odd element count).
std::optional<std::uint64_t> tensor_bytes(Dtype dtype, std::span<const std::int64_t> shape);

}  // namespace teraio::safetensors
