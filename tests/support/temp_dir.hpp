// Helpers shared by the test suites: a self-removing temporary directory and byte patterns
// that catch misplaced or missing chunks.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace teraio::testing {

// A fresh directory under base, removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp") {
    std::string pattern = base + "/teraio-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed under " + base);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

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

}  // namespace teraio::testing
