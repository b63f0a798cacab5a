#include "teraio/core/error.hpp"

#include <cstring>

#include "teraio/core/strings.hpp"

namespace teraio {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kFormat: return "format error";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kNoSpace: return "no space";
    case ErrorKind::kTierFull: return "tier full";
    case ErrorKind::kChecksum: return "checksum mismatch";
    case ErrorKind::kCuda: return "CUDA error";
    case ErrorKind::kCuFile: return "cuFile error";
    case ErrorKind::kOutOfMemory: return "out of device memory";
    case ErrorKind::kInfeasible: return "infeasible";
    case ErrorKind::kShutdown: return "shut down";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kInternal: return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorKind kind, const std::string& message, int sys_errno)
    : std::runtime_error(message), kind_(kind), errno_(sys_errno) {}

void throw_system_error(const std::string& what, int err) {
  const ErrorKind kind = (err == ENOSPC || err == EDQUOT) ? ErrorKind::kNoSpace : ErrorKind::kIo;
  throw Error(kind, cat(what, ": ", std::strerror(err), " (errno ", err, ")"), err);
}

void throw_internal(std::string_view what, SourceLocation where) {
  throw Error(ErrorKind::kInternal,
              cat("TeraIO internal error at ", where.file_name(), ":", where.line(), ": ", what));
}

}  // namespace teraio
