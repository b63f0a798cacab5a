// Reading and writing trace files: the form is detected from the first bytes on load and
// chosen from the extension on save.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::trace {
namespace {

class FileDescriptor {
 public:
  FileDescriptor(const std::string& path, int flags, mode_t mode = 0)
      : fd_(::open(path.c_str(), flags, mode)) {
    if (fd_ < 0) throw_errno(errno, "cannot open trace file ", path);
  }
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now so that a failing close (a delayed write error) is reported.
  void close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno(errno, "cannot close trace file ", path);
  }

 private:
  int fd_;
};

std::vector<std::byte> read_file(const std::string& path) {
  FileDescriptor fd(path, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "cannot stat trace file ", path);
  if (!S_ISREG(st.st_mode)) throw Error(ErrorKind::kInvalidArgument, cat(path, " is not a regular file"));
  std::vector<std::byte> data(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(errno, "cannot read trace file ", path, " at byte ", done);
    if (n == 0)
      throw Error(ErrorKind::kIo, cat("trace file ", path, " shrank while being read (at byte ", done, ")"));
    done += static_cast<std::size_t>(n);
  }
  return data;
}

void write_file(const std::string& path, std::span<const std::byte> data) {
  const std::string temporary = path + ".tmp";
  {
    FileDescriptor fd = [&] {
      try {
        return FileDescriptor(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      } catch (const Error& e) {
        // The user named `path`; the temporary beside it is an implementation detail.
        throw Error(e.kind(), cat("cannot create trace file ", path, " (", e.what(), ")"), e.sys_errno());
      }
    }();
    // From here the temporary file is ours: a failed write or close must not leave it behind.
    try {
      std::size_t done = 0;
      while (done < data.size()) {
        const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          const int err = errno;  // before cat() allocates
          throw_system_error(cat("cannot write trace file ", temporary, " at byte ", done), err);
        }
        done += static_cast<std::size_t>(n);
      }
      fd.close(temporary);
    } catch (const Error&) {
      ::unlink(temporary.c_str());
      throw;
    }
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    throw_system_error(cat("cannot rename ", temporary, " to ", path), err);
  }
}

bool starts_with(std::span<const std::byte> data, std::string_view prefix) {
  return data.size() >= prefix.size() && std::memcmp(data.data(), prefix.data(), prefix.size()) == 0;
}

}  // namespace

TraceFormat trace_format_for_path(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0 ? TraceFormat::kJson
                                                                            : TraceFormat::kBinary;
}

Trace load_trace(const std::string& path) {
  const std::vector<std::byte> data = read_file(path);
  try {
    if (starts_with(data, "TIOTRACE")) return parse_trace_binary(data);
    std::size_t first = 0;
    while (first < data.size() && std::isspace(static_cast<unsigned char>(data[first]))) ++first;
    if (first < data.size() && data[first] == std::byte{'{'})
      return parse_trace_json(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
    throw Error(ErrorKind::kFormat, "not a TeraIO trace: neither the TIOTRACE header nor a JSON object");
  } catch (const Error& e) {
    throw Error(e.kind(), cat(path, ": ", e.what()), e.sys_errno());
  }
}

void save_trace(const Trace& trace, const std::string& path, std::optional<TraceFormat> format) {
  if (format.value_or(trace_format_for_path(path)) == TraceFormat::kJson) {
    const std::string text = trace_to_json(trace);
    write_file(path, std::as_bytes(std::span(text)));
  } else {
    write_file(path, trace_to_binary(trace));
  }
}

}  // namespace teraio::trace
