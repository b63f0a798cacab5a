// Shared helpers of the safetensors tests: a temporary directory and byte patterns.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"

namespace teraio::safetensors::testing {

// Under /var/tmp: never tmpfs, so the O_DIRECT paths of the loader are exercised.
class TempDir : public teraio::testing::TempDir {
 public:
  TempDir() : teraio::testing::TempDir("/var/tmp") {}
};
using teraio::testing::pattern;

inline std::string fixture(const std::string& name) {
  return std::string(TERAIO_ST_FIXTURES) + "/" + name;
}

}  // namespace teraio::safetensors::testing
