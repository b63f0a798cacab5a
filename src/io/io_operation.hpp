// One byte range carried through an IoBackend to the end: every completion is checked, errors
// become teraio::Error naming path, offset and size, and short transfers are resumed (from the
// last 512-byte boundary reached when the file is opened with O_DIRECT, which needs alignment).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "teraio/io/io_backend.hpp"

namespace teraio::io {

class IoOperation : public std::enable_shared_from_this<IoOperation> {
 public:
  // Submits the request; the returned operation completes when all bytes moved or one failed.
  static std::shared_ptr<IoOperation> start(IoBackend& backend, const IoRequest& request, std::string path,
                                            bool direct_io);
  // Blocks until done; throws the failure (Error{kIo}, {kNoSpace}, ...).
  void wait();
  bool ready();

  IoOperation(IoBackend& backend, const IoRequest& request, std::string path, bool direct_io)
      : backend_(backend), request_(request), path_(std::move(path)), direct_io_(direct_io) {}

 private:
  void submit_from(std::uint64_t done);
  void on_complete(std::uint64_t started_at, std::int64_t result);
  void finish(std::exception_ptr error);
  std::string describe() const;

  IoBackend& backend_;
  IoRequest request_;
  std::string path_;
  bool direct_io_;
  std::uint64_t stalls_ = 0;
  std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace teraio::io
