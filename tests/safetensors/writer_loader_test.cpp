#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "st_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/safetensors/header.hpp"
#include "teraio/safetensors/loader.hpp"
#include "teraio/safetensors/writer.hpp"

namespace teraio::safetensors {
namespace {

using testing::fixture;
using testing::pattern;
using testing::TempDir;

std::vector<std::byte> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The loaded buffer must equal the file's data region byte for byte.
void expect_exact(const LoadedFile& loaded) {
  const std::vector<std::byte> file = read_all(loaded.path);
  ASSERT_EQ(loaded.buffer.size(), file.size() - loaded.header.data_offset);
  if (loaded.buffer.size() == 0) return;
  EXPECT_EQ(std::memcmp(loaded.buffer.data(), file.data() + loaded.header.data_offset, loaded.buffer.size()),
            0)
      << loaded.path << " by " << loaded.stats.mode;
}

struct Case {
  IoMode mode;
  io::MemoryKind destination;
};

class LoadModes : public ::testing::TestWithParam<Case> {
 protected:
  LoadOptions options() const {
    LoadOptions o;
    o.io_mode = GetParam().mode;
    o.destination = GetParam().destination;
    o.chunk_bytes = 64 * 1024;  // many chunks even for small files
    o.chunks_in_flight = 3;
    return o;
  }
  std::unique_ptr<io::DeviceCopier> copier_ = io::make_host_copier();
};

TEST_P(LoadModes, FixturesLoadExactly) {
  for (const char* name :
       {"valid_basic.safetensors", "valid_all_dtypes.safetensors", "valid_empty.safetensors",
        "valid_zero_sized.safetensors", "valid_unaligned.safetensors"}) {
    const LoadedFile loaded = load_file(fixture(name), *copier_, options());
    expect_exact(loaded);
    EXPECT_FALSE(loaded.stats.reason.empty());
  }
  const LoadedFile basic = load_file(fixture("valid_basic.safetensors"), *copier_, options());
  float weight[2];
  std::memcpy(weight, basic.tensor_data("weight"), sizeof(weight));
  EXPECT_EQ(weight[0], 1.5f);
  EXPECT_EQ(weight[1], -2.0f);
  EXPECT_EQ(std::to_integer<int>(basic.tensor_data("bias")[2]), 9);
  EXPECT_THROW((void)basic.tensor_data("nope"), Error);
}

TEST_P(LoadModes, SavedOddSizesRoundTrip) {
  TempDir dir;
  // Sizes around chunk and page boundaries, an empty tensor and a 1-byte one.
  const std::vector<std::int64_t> sizes{0, 1, 4095, 4097, 65536, 65537, 200001};
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorView> views;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    data.push_back(pattern(static_cast<std::size_t>(sizes[i]), static_cast<std::uint32_t>(i)));
    views.push_back({"t" + std::to_string(i), Dtype::kU8, {sizes[i]}, data.back().data()});
  }
  std::vector<std::byte> halves = pattern(2 * 1001, 99);
  views.push_back({"bf16", Dtype::kBF16, {7, 11, 13}, halves.data()});
  // A "device" tensor (host copier: device memory is ordinary memory).
  std::vector<std::byte> dev = pattern(4 * 30000, 7);
  views.push_back({"dev", Dtype::kF32, {30000}, dev.data(), io::MemoryKind::kDevice, copier_.get()});
  const std::string path = dir.file("odd.safetensors");
  SaveOptions save;
  save.chunk_bytes = 8192;
  save_file(views, {{"format", "pt"}}, path, save);

  const LoadedFile loaded = load_file(path, *copier_, options());
  expect_exact(loaded);
  EXPECT_EQ(loaded.header.header_bytes % 8, 0u);
  EXPECT_EQ(loaded.header.metadata.at("format"), "pt");
  EXPECT_EQ(loaded.stats.bytes, loaded.header.data_bytes);
  for (const TensorView& v : views) {
    const TensorInfo* info = loaded.header.find(v.name);
    ASSERT_NE(info, nullptr) << v.name;
    EXPECT_EQ(info->shape, v.shape);
    EXPECT_EQ(info->dtype, v.dtype);
    if (info->bytes() > 0) {
      EXPECT_EQ(std::memcmp(loaded.tensor_data(v.name), v.data, info->bytes()), 0) << v.name;
    }
  }
  // Larger dtypes first, as the reference writer lays them out: every tensor aligned to its element.
  for (const TensorInfo& t : loaded.header.tensors) {
    if (element_size(t.dtype) > 0) {
      EXPECT_EQ(t.begin % element_size(t.dtype), 0u) << t.name;
    }
  }
}

TEST_P(LoadModes, TruncatedDataRegionIsRejected) {
  TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  std::vector<std::byte> data = pattern(100000, 3);
  save_file({{"x", Dtype::kU8, {100000}, data.data()}}, {}, path, {});
  ASSERT_EQ(::truncate(path.c_str(), 60000), 0);
  try {
    (void)load_file(path, *copier_, options());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(to_string(info.param.mode)) +
         (info.param.destination == io::MemoryKind::kDevice ? "_device" : "_host");
}

INSTANTIATE_TEST_SUITE_P(Modes, LoadModes,
                         ::testing::Values(Case{IoMode::kAuto, io::MemoryKind::kDevice},
                                           Case{IoMode::kDirect, io::MemoryKind::kDevice},
                                           Case{IoMode::kBuffered, io::MemoryKind::kDevice},
                                           Case{IoMode::kDirect, io::MemoryKind::kHost},
                                           Case{IoMode::kBuffered, io::MemoryKind::kHost}),
                         case_name);

TEST(Load, ReportsTheModeThatRan) {
  auto copier = io::make_host_copier();
  LoadOptions o;
  o.io_mode = IoMode::kDirect;
  const LoadedFile direct = load_file(fixture("valid_basic.safetensors"), *copier, o);
  EXPECT_EQ(direct.stats.mode, "direct");
  EXPECT_FALSE(direct.stats.backend.empty());
  o.io_mode = IoMode::kBuffered;
  EXPECT_EQ(load_file(fixture("valid_basic.safetensors"), *copier, o).stats.mode, "buffered");
  // A fixture just read is in the page cache: auto reads it buffered, and says why.
  o.io_mode = IoMode::kAuto;
  const LoadedFile automatic = load_file(fixture("valid_basic.safetensors"), *copier, o);
  EXPECT_EQ(automatic.stats.mode, "buffered");
  EXPECT_NE(automatic.stats.reason.find("page cache"), std::string::npos) << automatic.stats.reason;
  EXPECT_NE(automatic.stats.reason.find("no cuFile"), std::string::npos) << automatic.stats.reason;
  // cuFile cannot serve a host copier.
  o.io_mode = IoMode::kCuFile;
  EXPECT_THROW((void)load_file(fixture("valid_basic.safetensors"), *copier, o), Error);
  EXPECT_EQ(parse_io_mode("direct"), IoMode::kDirect);
  EXPECT_THROW((void)parse_io_mode("fast"), Error);
}

TEST(Save, RefusesBadTensorsAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  std::byte b[4]{};
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {4}, b}, {"x", Dtype::kU8, {4}, b}}, {}, path), Error);
  EXPECT_THROW(save_file({{"__metadata__", Dtype::kU8, {4}, b}}, {}, path), Error);
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {-4}, b}}, {}, path), Error);
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {4}, nullptr}}, {}, path), Error);
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {4}, b, io::MemoryKind::kDevice, nullptr}}, {}, path), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {4}, b}}, {}, "/nonexistent/dir/x.safetensors"), Error);
}

// JSON text is UTF-8: a name that is not must be refused as a teraio::Error (not a JSON
// library exception escaping the API), leaving no file behind.
TEST(Save, NameThatIsNotUtf8IsRefused) {
  TempDir dir;
  const std::string path = dir.file("bad_name.safetensors");
  std::byte b[4]{};
  try {
    save_file({{"bad\xff\xfename", Dtype::kU8, {4}, b}}, {}, path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(save_file({{"x", Dtype::kU8, {4}, b}}, {{"k", "\xc3"}}, path), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Save, EmptyFileIsValid) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  save_file({}, {}, path, {});
  const Header h = read_header(path);
  EXPECT_TRUE(h.tensors.empty());
  EXPECT_EQ(h.data_bytes, 0u);
}

// An independent reading of the format (tests/safetensors/reference_check.py, standard
// library only; it also asks the reference `safetensors` package where one is installed).
TEST(Save, IndependentPythonReaderAcceptsTheFile) {
  if (!std::filesystem::exists(TERAIO_ST_PYTHON)) GTEST_SKIP() << "no Python at " << TERAIO_ST_PYTHON;
  TempDir dir;
  const std::string path = dir.file("py.safetensors");
  std::vector<std::byte> a = pattern(3 * 5 * 2, 1);
  std::vector<std::byte> b = pattern(17, 2);
  std::vector<std::byte> c = pattern(8 * 3, 3);
  save_file({{"a.weight", Dtype::kBF16, {3, 5}, a.data()},
             {"b \"odd\" name", Dtype::kBool, {17}, b.data()},
             {"c", Dtype::kI64, {3}, c.data()},
             {"empty", Dtype::kF16, {0}, nullptr}},
            {{"format", "pt"}}, path);
  const std::string command =
      std::string(TERAIO_ST_PYTHON) + " " + TERAIO_ST_SOURCE + "/reference_check.py " + path;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace teraio::safetensors
