#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "st_test_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/safetensors/loader.hpp"
#include "teraio/safetensors/writer.hpp"

namespace teraio::safetensors {
namespace {

using testing::pattern;
using testing::TempDir;

class Checkpoint : public ::testing::Test {
 protected:
  // Two shards of two tensors each and the index mapping them.
  void SetUp() override {
    a_ = pattern(1000, 1);
    b_ = pattern(4 * 300, 2);
    c_ = pattern(77, 3);
    d_ = pattern(2 * 64, 4);
    save_file({{"layer.0.a", Dtype::kU8, {1000}, a_.data()}, {"layer.0.b", Dtype::kF32, {300}, b_.data()}},
              {}, dir_.file("model-00001-of-00002.safetensors"), {});
    save_file({{"layer.1.c", Dtype::kI8, {7, 11}, c_.data()}, {"layer.1.d", Dtype::kBF16, {64}, d_.data()}},
              {}, dir_.file("model-00002-of-00002.safetensors"), {});
  }
  void write_index(const std::string& extra_entry = "") {
    std::ofstream out(dir_.file("model.safetensors.index.json"));
    out << R"({"metadata": {"total_size": 2405}, "weight_map": {)"
        << R"("layer.0.a": "model-00001-of-00002.safetensors", "layer.0.b": "model-00001-of-00002.safetensors",)"
        << R"("layer.1.c": "model-00002-of-00002.safetensors", "layer.1.d": "model-00002-of-00002.safetensors")"
        << extra_entry << "}}";
  }

  TempDir dir_;
  std::vector<std::byte> a_, b_, c_, d_;
  std::unique_ptr<io::DeviceCopier> copier_ = io::make_host_copier();
};

TEST_F(Checkpoint, LoadsEveryShardFromIndexOrDirectory) {
  write_index();
  for (const std::string& path : {dir_.file("model.safetensors.index.json"), dir_.path()}) {
    const LoadedCheckpoint ckpt = load_index(path, *copier_);
    EXPECT_EQ(ckpt.shards.size(), 2u);
    EXPECT_EQ(ckpt.index.metadata.at("total_size"), "2405");
    EXPECT_EQ(ckpt.stats.bytes, 1000u + 1200u + 77u + 128u);
    const auto [file, info] = ckpt.find("layer.1.c");
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(std::memcmp(file->tensor_data("layer.1.c"), c_.data(), c_.size()), 0);
    EXPECT_EQ(ckpt.find("nope").second, nullptr);
  }
}

TEST_F(Checkpoint, SingleFileCheckpoint) {
  const LoadedCheckpoint ckpt = load_index(dir_.file("model-00001-of-00002.safetensors"), *copier_);
  EXPECT_EQ(ckpt.index.weight_map.size(), 2u);
  const auto [file, info] = ckpt.find("layer.0.a");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(std::memcmp(file->tensor_data("layer.0.a"), a_.data(), a_.size()), 0);
}

TEST_F(Checkpoint, MissingShardAndMissingTensorAreErrors) {
  write_index(R"(, "layer.2.e": "model-00003-of-00002.safetensors")");
  try {
    (void)load_index(dir_.path(), *copier_);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00003-of-00002.safetensors does not exist"),
              std::string::npos)
        << e.what();
  }
  write_index(R"(, "layer.2.e": "model-00002-of-00002.safetensors")");
  try {
    (void)load_index(dir_.path(), *copier_);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("\"layer.2.e\" is mapped to model-00002"), std::string::npos)
        << e.what();
  }
  write_index(R"(, "layer.2.e": "../elsewhere.safetensors")");
  EXPECT_THROW((void)load_index(dir_.path(), *copier_), Error);
}

}  // namespace
}  // namespace teraio::safetensors
