// io/swap_file: the one file per SSD path that holds offloaded tensors. Created (or reused)
// and preallocated once to the configured capacity, then only read and written: TeraIO never
// creates a file per tensor and never deletes in a timed path (deleting big files stalls the
// disk for minutes on the GPU machines). Opened with O_DIRECT; a filesystem that refuses it
// (tmpfs) gets buffered I/O, said once in the log and in the report.
#pragma once

#include <cstdint>
#include <string>

namespace teraio::io {

class SwapFile {
 public:
  // open(2) as the swap file calls it; replaceable so that tests can play a filesystem that
  // refuses O_DIRECT (recent kernels accept it even on tmpfs).
  using OpenFunction = int (*)(const char* path, int flags, unsigned mode);

  // directory must exist and be writable; "{rank}" in it is replaced by rank. The file is
  // <directory>/teraio-rank<rank>.swap. Throws Error{kIo} for a missing or unwritable
  // directory, Error{kNoSpace} naming path and bytes when the filesystem cannot hold capacity,
  // Error{kInvalidArgument} when the file is already open as a swap file (flock held by this or
  // another process: one directory given twice, or two processes of one rank).
  SwapFile(const std::string& directory, int rank, std::uint64_t capacity, bool unlink_after_open,
           bool direct_io = true, OpenFunction open_function = nullptr);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::uint64_t capacity() const { return capacity_; }
  bool direct_io() const { return direct_io_; }
  // Why the file is not on O_DIRECT ("" when it is).
  const std::string& buffered_reason() const { return buffered_reason_; }

 private:
  std::string path_;
  std::uint64_t capacity_;
  int fd_ = -1;
  bool direct_io_ = false;
  std::string buffered_reason_;
};

// Replaces every "{rank}" in text by rank.
std::string substitute_rank(const std::string& text, int rank);

}  // namespace teraio::io
