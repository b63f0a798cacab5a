#include "teraio/safetensors/dtype.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace teraio::safetensors {
namespace {

TEST(Dtype, NamesRoundTripAndSizesMatchTheFormat) {
  for (int i = 0; i <= static_cast<int>(Dtype::kU64); ++i) {
    const auto dtype = static_cast<Dtype>(i);
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype) << dtype_name(dtype);
  }
  EXPECT_EQ(element_size(Dtype::kBF16), 2u);
  EXPECT_EQ(element_size(Dtype::kF8E4M3), 1u);
  EXPECT_EQ(element_size(Dtype::kC64), 8u);
  EXPECT_EQ(element_size(Dtype::kF4), 0u);
  EXPECT_EQ(dtype_bits(Dtype::kF6E2M3), 6u);
  EXPECT_FALSE(parse_dtype("f32"));
  EXPECT_FALSE(parse_dtype(""));
}

TEST(Dtype, TensorBytesChecksOverflowAndWholeBytes) {
  const std::vector<std::int64_t> scalar;
  EXPECT_EQ(tensor_bytes(Dtype::kF64, scalar), 8u);
  EXPECT_EQ(tensor_bytes(Dtype::kF32, std::vector<std::int64_t>{3, 0, 5}), 0u);
  EXPECT_EQ(tensor_bytes(Dtype::kF4, std::vector<std::int64_t>{4}), 2u);
  EXPECT_FALSE(tensor_bytes(Dtype::kF4, std::vector<std::int64_t>{3}));
  EXPECT_EQ(tensor_bytes(Dtype::kF6E3M2, std::vector<std::int64_t>{4}), 3u);
  EXPECT_FALSE(tensor_bytes(Dtype::kU8, std::vector<std::int64_t>{-1}));
  const std::int64_t big = std::int64_t{1} << 62;
  EXPECT_FALSE(tensor_bytes(Dtype::kU8, std::vector<std::int64_t>{big, big}));
  EXPECT_FALSE(tensor_bytes(Dtype::kF64, std::vector<std::int64_t>{big}));
  // Counted in bits, as the reference does: 2^58 bytes is the largest power of two that fits.
  EXPECT_EQ(tensor_bytes(Dtype::kU8, std::vector<std::int64_t>{big >> 4}),
            static_cast<std::uint64_t>(big >> 4));
  EXPECT_FALSE(tensor_bytes(Dtype::kU8, std::vector<std::int64_t>{big}));
}

}  // namespace
}  // namespace teraio::safetensors
