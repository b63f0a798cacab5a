// core/error: the one exception type of TeraIO. Every failure the library reports is a
// teraio::Error carrying a kind (for callers that branch on it), the system errno where one
// exists, and a message that names the context (path, offset, size, tensor, operator).
// The library never calls exit() or abort(), and never prints to stdout.
#pragma once

#include <cerrno>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

#include "teraio/core/strings.hpp"

namespace teraio {

enum class ErrorKind {
  kInvalidArgument,  // bad input from the caller (sizes, options, paths)
  kFormat,           // a malformed or inconsistent file (trace, plan, safetensors)
  kIo,               // a failed or short system I/O call
  kNoSpace,          // a preallocation or write that found no room (ENOSPC)
  kTierFull,         // a tier has no room left under its configured capacity
  kChecksum,         // data read back does not match the checksum written with it
  kCuda,             // a CUDA runtime call failed
  kCuFile,           // a cuFile call failed (decoded)
  kOutOfMemory,      // the device allocator had no block of the size asked for
  kInfeasible,       // no plan meets the budget
  kShutdown,         // work submitted to, or cancelled by, an engine that is closing
  kUnsupported,      // a feature this build or machine does not have
  kInternal,         // a broken invariant inside TeraIO: a bug
};

std::string_view to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, int sys_errno = 0);

  ErrorKind kind() const noexcept { return kind_; }
  // errno of the failed system call, 0 when the error did not come from one.
  int sys_errno() const noexcept { return errno_; }

 private:
  ErrorKind kind_;
  int errno_;
};

// Throws Error{kind} with "what: strerror(err)" as message; kNoSpace for ENOSPC/EDQUOT.
[[noreturn]] void throw_system_error(const std::string& what, int err);

// throw_errno(errno, "cannot open ", path): the message is built only after errno has been
// copied into `err`, so formatting (which may allocate and touch errno) cannot change the
// reported cause — unlike throw_system_error(cat(...), errno), whose argument order is unspecified.
template <typename... Parts>
[[noreturn]] void throw_errno(int err, const Parts&... parts) {
  throw_system_error(cat(parts...), err);
}

// std::source_location needs a compiler builtin that clang 14 (the fuzzer build) lacks; the
// stand-in records the same file and line through builtins both compilers have.
#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          unsigned line = __builtin_LINE()) {
    return SourceLocation(file, line);
  }
  constexpr const char* file_name() const { return file_; }
  constexpr unsigned line() const { return line_; }

 private:
  constexpr SourceLocation(const char* file, unsigned line) : file_(file), line_(line) {}
  const char* file_;
  unsigned line_;
};
#endif

// Throws kInternal naming the source location: for invariants that only a bug can break.
[[noreturn]] void throw_internal(std::string_view what, SourceLocation where = SourceLocation::current());

}  // namespace teraio

// Checks an invariant that only a TeraIO bug can break; stays on in release builds.
#define TERAIO_ASSERT(cond)                                            \
  do {                                                                 \
    if (!(cond)) ::teraio::throw_internal("assertion failed: " #cond); \
  } while (false)
