// Shared helpers of the safetensors tests: a temporary directory and byte patterns.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace teraio::safetensors::testing {

// A fresh directory under the build tree's disk (/var/tmp is not tmpfs, so O_DIRECT works).
class TempDir {
 public:
  TempDir() {
    std::string pattern = "/var/tmp/teraio-st-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Bytes that differ at every offset and between seeds, so a misplaced chunk is caught.
inline std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> out(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = static_cast<std::byte>((x >> 16) ^ (i >> 12));
  }
  return out;
}

inline std::string fixture(const std::string& name) {
  return std::string(TERAIO_ST_FIXTURES) + "/" + name;
}

}  // namespace teraio::safetensors::testing
