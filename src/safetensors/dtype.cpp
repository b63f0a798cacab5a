#include "teraio/safetensors/dtype.hpp"

#include <array>
#include <limits>

namespace teraio::safetensors {
namespace {

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  std::uint32_t bits;
};

constexpr std::array<DtypeEntry, 22> kDtypes{{
    {Dtype::kBool, "BOOL", 8},
    {Dtype::kF4, "F4", 4},
    {Dtype::kF6E2M3, "F6_E2M3", 6},
    {Dtype::kF6E3M2, "F6_E3M2", 6},
    {Dtype::kU8, "U8", 8},
    {Dtype::kI8, "I8", 8},
    {Dtype::kF8E5M2, "F8_E5M2", 8},
    {Dtype::kF8E4M3, "F8_E4M3", 8},
    {Dtype::kF8E8M0, "F8_E8M0", 8},
    {Dtype::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {Dtype::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {Dtype::kI16, "I16", 16},
    {Dtype::kU16, "U16", 16},
    {Dtype::kF16, "F16", 16},
    {Dtype::kBF16, "BF16", 16},
    {Dtype::kI32, "I32", 32},
    {Dtype::kU32, "U32", 32},
    {Dtype::kF32, "F32", 32},
    {Dtype::kC64, "C64", 64},
    {Dtype::kF64, "F64", 64},
    {Dtype::kI64, "I64", 64},
    {Dtype::kU64, "U64", 64},
}};

const DtypeEntry& entry(Dtype dtype) {
  return kDtypes[static_cast<std::size_t>(dtype)];
}

}  // namespace

std::string_view dtype_name(Dtype dtype) {
  return entry(dtype).name;
}

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

std::uint32_t dtype_bits(Dtype dtype) {
  return entry(dtype).bits;
}

std::uint32_t element_size(Dtype dtype) {
  const std::uint32_t bits = dtype_bits(dtype);
  return bits % 8 == 0 ? bits / 8 : 0;
}

std::optional<std::uint64_t> tensor_bytes(Dtype dtype, std::span<const std::int64_t> shape) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t numel = 1;
  for (const std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    const auto d = static_cast<std::uint64_t>(dim);
    if (d != 0 && numel > kMax / d) return std::nullopt;
    numel *= d;
  }
  const std::uint64_t bits = dtype_bits(dtype);
  if (numel > kMax / bits) return std::nullopt;
  const std::uint64_t total_bits = numel * bits;
  if (total_bits % 8 != 0) return std::nullopt;
  return total_bits / 8;
}

}  // namespace teraio::safetensors
