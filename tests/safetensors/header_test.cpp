#include "teraio/safetensors/header.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "st_test_support.hpp"
#include "teraio/core/error.hpp"

namespace teraio::safetensors {
namespace {

using testing::fixture;

TEST(Header, ReadsTheBasicFixture) {
  const Header h = read_header(fixture("valid_basic.safetensors"));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "weight");
  EXPECT_EQ(h.tensors[0].dtype, Dtype::kF32);
  EXPECT_EQ(h.tensors[0].shape, std::vector<std::int64_t>{2});
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 8u);
  EXPECT_EQ(h.tensors[1].name, "bias");
  EXPECT_EQ(h.tensors[1].bytes(), 3u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.header_bytes % 8, 0u);
  EXPECT_EQ(h.data_offset, 8 + h.header_bytes);
  EXPECT_EQ(h.data_bytes, 11u);
  EXPECT_NE(h.find("bias"), nullptr);
  EXPECT_EQ(h.find("nope"), nullptr);
}

TEST(Header, AcceptsEveryDtypeAndOddLayouts) {
  EXPECT_EQ(read_header(fixture("valid_all_dtypes.safetensors")).tensors.size(), 22u);
  EXPECT_TRUE(read_header(fixture("valid_empty.safetensors")).tensors.empty());
  const Header zero = read_header(fixture("valid_zero_sized.safetensors"));
  ASSERT_EQ(zero.tensors.size(), 3u);
  EXPECT_EQ(zero.tensors[0].name, "empty");  // [0, 0) sorts before [0, 2)
  EXPECT_EQ(zero.tensors[1].numel(), 1u);
  const Header unaligned = read_header(fixture("valid_unaligned.safetensors"));
  EXPECT_NE(unaligned.data_offset % 8, 0u);
  EXPECT_TRUE(read_header(fixture("valid_null_metadata.safetensors")).metadata.empty());
}

struct Malformed {
  const char* file;
  const char* message;  // a part of the error message
};

class MalformedHeader : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedHeader, IsRejectedNamingFileAndCause) {
  const std::string path = fixture(GetParam().file);
  try {
    (void)read_header(path);
    FAIL() << "accepted " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, MalformedHeader,
    ::testing::Values(Malformed{"bad_too_small.safetensors", "too small"},
                      Malformed{"bad_length_past_end.safetensors", "exceeds the 8 bytes after"},
                      Malformed{"bad_length_limit.safetensors", "exceeds the limit"},
                      Malformed{"bad_json.safetensors", "not valid JSON"},
                      Malformed{"bad_not_object.safetensors", "does not start with '{'"},
                      Malformed{"bad_duplicate.safetensors", "key \"x\" more than once"},
                      Malformed{"bad_duplicate_field.safetensors", "key \"dtype\" more than once"},
                      Malformed{"bad_dtype.safetensors", "tensor \"x\": unknown dtype \"F12\""},
                      Malformed{"bad_missing_dtype.safetensors", "tensor \"x\": \"dtype\" is missing"},
                      Malformed{"bad_shape_negative.safetensors", "tensor \"x\": shape entry -2"},
                      Malformed{"bad_shape_float.safetensors", "tensor \"x\": shape entry 2.0"},
                      Malformed{"bad_size_mismatch.safetensors", "is 8 bytes but data_offsets [0, 6] hold 6"},
                      Malformed{"bad_overlap.safetensors", "tensor \"y\": data_offsets [1, 3] overlap"},
                      Malformed{"bad_hole.safetensors", "tensor \"y\": data_offsets [3, 5] leave a hole"},
                      Malformed{"bad_reversed.safetensors", "end before they begin"},
                      Malformed{"bad_truncated.safetensors", "cover 8 bytes but the data region holds 4"},
                      Malformed{"bad_trailing.safetensors", "cover 2 bytes but the data region holds 4"},
                      Malformed{"bad_metadata_value.safetensors", "value of \"n\" is not a string"},
                      Malformed{"bad_overflow.safetensors", "overflows"},
                      Malformed{"bad_packed_odd.safetensors", "not a whole number of bytes"},
                      Malformed{"bad_utf8.safetensors", "not valid JSON"},
                      Malformed{"bad_offsets_type.safetensors", "\"data_offsets\" is missing"}));

TEST(Header, ParseRefusesAHeaderLongerThanTheBytesGiven) {
  std::vector<std::byte> bytes(8);
  bytes[0] = std::byte{40};
  try {
    (void)parse_header(bytes, "mem", 100);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 0 of the 40 header bytes"), std::string::npos) << e.what();
  }
}

TEST(Header, MissingFileIsAnIoError) {
  try {
    (void)read_header("/nonexistent/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace teraio::safetensors
