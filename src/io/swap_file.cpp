#include "teraio/io/swap_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {

std::string substitute_rank(const std::string& text, int rank) {
  static constexpr std::string_view kToken = "{rank}";
  std::string out = text;
  for (std::size_t at = out.find(kToken); at != std::string::npos; at = out.find(kToken, at)) {
    const std::string value = std::to_string(rank);
    out.replace(at, kToken.size(), value);
    at += value.size();
  }
  return out;
}

namespace {

int system_open(const char* path, int flags, unsigned mode) {
  return ::open(path, flags, static_cast<mode_t>(mode));
}

int open_file(SwapFile::OpenFunction open_function, const std::string& path, int flags) {
  int fd;
  do {
    fd = open_function(path.c_str(), flags | O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// Checked before fallocate: on ext4 a failing fallocate can leave the disk filled with the
// blocks it managed to allocate.
void check_free_space(int fd, const std::string& path, std::uint64_t capacity) {
  struct stat st {};
  struct statvfs vfs {};
  if (fstat(fd, &st) != 0 || fstatvfs(fd, &vfs) != 0) return;
  const std::uint64_t allocated = static_cast<std::uint64_t>(st.st_blocks) * 512;
  const std::uint64_t available = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (capacity > allocated && capacity - allocated > available) {
    throw Error(
        ErrorKind::kNoSpace,
        cat("cannot preallocate ", capacity, " bytes (", format_bytes(capacity), ") for swap file ", path,
            ": only ", available, " bytes (", format_bytes(available), ") free on its filesystem"),
        ENOSPC);
  }
}

void preallocate(int fd, const std::string& path, std::uint64_t capacity) {
  int rc;
  do {
    rc = posix_fallocate(fd, 0, static_cast<off_t>(capacity));
  } while (rc == EINTR);
  if (rc == 0) return;
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    // posix_fallocate may be unsupported by the filesystem: size the file instead (sparse).
    log::warn("swap file ", path, ": fallocate unsupported (", std::strerror(rc), "); the file is sparse");
    if (ftruncate(fd, static_cast<off_t>(capacity)) == 0) return;
    rc = errno;
  }
  if (rc == ENOSPC || rc == EDQUOT) {
    throw Error(ErrorKind::kNoSpace,
                cat("cannot preallocate ", capacity, " bytes (", format_bytes(capacity), ") for swap file ",
                    path, ": ", std::strerror(rc)),
                rc);
  }
  throw_system_error(cat("preallocating ", capacity, " bytes for swap file ", path), rc);
}

// Two users of one swap file (the same directory given twice, or two processes of one rank)
// would place different tensors at the same offsets and silently overwrite each other. The
// lock belongs to this open file description, so it also catches a second open in-process.
void claim(int fd, const std::string& path) {
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return;
  const int err = errno;
  if (err == EWOULDBLOCK) {
    throw Error(
        ErrorKind::kInvalidArgument,
        cat("swap file ", path,
            " is already in use (an SSD tier path given twice, or another TeraIO process of the same rank)"),
        err);
  }
  // Some network filesystems have no flock: the file is used unguarded, as it would be anyway.
  log::warn("swap file ", path, ": cannot lock it (", std::strerror(err),
            "); not guarded against a second user");
}

}  // namespace

SwapFile::SwapFile(const std::string& directory, int rank, std::uint64_t capacity, bool unlink_after_open,
                   bool direct_io, OpenFunction open_function)
    : capacity_(align_up(capacity, kPageSize)) {
  if (open_function == nullptr) open_function = system_open;
  const std::string dir = substitute_rank(directory, rank);
  if (dir.empty()) throw Error(ErrorKind::kInvalidArgument, "empty SSD tier path");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw_errno(errno, "SSD tier path ", dir);
  if (!S_ISDIR(st.st_mode))
    throw Error(ErrorKind::kInvalidArgument, cat("SSD tier path ", dir, " is not a directory"));
  path_ = cat(dir, dir.back() == '/' ? "" : "/", "teraio-rank", rank, ".swap");

  if (!direct_io) {
    buffered_reason_ = "O_DIRECT disabled by configuration";
    fd_ = open_file(open_function, path_, 0);
  } else if ((fd_ = open_file(open_function, path_, O_DIRECT)) >= 0) {
    direct_io_ = true;
  } else if (errno == EINVAL) {
    buffered_reason_ = "filesystem refuses O_DIRECT (EINVAL)";
    fd_ = open_file(open_function, path_, 0);
  }
  if (fd_ < 0) throw_errno(errno, "cannot open swap file ", path_);
  if (!direct_io_) log::warn("swap file ", path_, ": ", buffered_reason_, "; using buffered I/O");
  try {
    claim(fd_, path_);
    check_free_space(fd_, path_, capacity_);
    preallocate(fd_, path_, capacity_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  // Unlinking right after open frees the space at exit without a delete in a timed path.
  if (unlink_after_open && ::unlink(path_.c_str()) != 0)
    log::warn("cannot unlink swap file ", path_, ": ", std::strerror(errno));
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace teraio::io
