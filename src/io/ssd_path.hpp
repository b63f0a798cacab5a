// One SSD path of the tier store: its swap file, the backend serving it, and what is reported.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "teraio/io/cufile.hpp"
#include "teraio/io/io_backend.hpp"
#include "teraio/io/swap_file.hpp"

namespace teraio::io {

struct SsdPath {
  std::unique_ptr<SwapFile> file;
  std::unique_ptr<IoBackend> backend;
  bool buffers_registered = false;
  std::unique_ptr<CuFileHandle> cufile;  // set only when GPUDirect Storage registration worked
  std::string cufile_detail;             // why cuFile is not used, or what it is
  std::atomic<std::uint64_t> bytes_written{0};
  std::atomic<std::uint64_t> bytes_read{0};
};

}  // namespace teraio::io
