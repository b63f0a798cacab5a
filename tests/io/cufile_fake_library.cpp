// A stand-in for libcufile, loaded by the cuFile shim's tests through TERAIO_CUFILE_LIBRARY:
// it speaks the C ABI declared in src/io/cufile_abi.hpp and misbehaves on request
// (TERAIO_FAKE_CUFILE=open_fails | already_open | register_fails | ok | nvfs | io_errors), so that decoding,
// short-transfer resumption and error paths run on machines without GPUDirect Storage.
// "Device memory" is host memory here. Files are 1 MiB of bytes (offset & 0xff).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../../src/io/cufile_abi.hpp"

namespace abi = teraio::io::cufile_abi;

namespace {

constexpr long long kFileSize = 1 << 20;
int handle_token = 0;

std::string mode() {
  const char* m = std::getenv("TERAIO_FAKE_CUFILE");
  return m != nullptr ? m : "ok";
}

}  // namespace

extern "C" {

abi::Error cuFileDriverOpen() {
  if (mode() == "already_open") return {5026, 0};
  return {mode() == "open_fails" ? 5001 : 0, 0};
}
abi::Error cuFileDriverClose_v2() {
  return {0, 0};
}
abi::Error cuFileDriverGetProperties(abi::DrvProps* props) {
  std::memset(props, 0, sizeof *props);
  if (mode() == "nvfs") {
    props->nvfs.major_version = 2;
    props->nvfs.minor_version = 17;
  }
  props->nvfs.max_direct_io_size = 16384;
  return {0, 0};
}
abi::Error cuFileHandleRegister(void** handle, abi::Descr* descr) {
  if (mode() == "register_fails") return {5027, 0};
  if (descr->type != abi::kHandleTypeOpaqueFd || descr->handle.fd < 0 || descr->fs_ops != nullptr)
    return {5022, 0};
  *handle = &handle_token;
  return {0, 0};
}
void cuFileHandleDeregister(void*) {}
abi::Error cuFileBufRegister(const void*, std::size_t, int) {
  return {0, 0};
}
abi::Error cuFileBufDeregister(const void*) {
  return {0, 0};
}
// Short on purpose: at most 1000 bytes per call, so that the shim has to resume.
ssize_t cuFileRead(void* handle, void* base, std::size_t size, off_t file_offset, off_t buf_offset) {
  if (handle != &handle_token) return -5027;
  if (mode() == "io_errors") return -5020;
  if (file_offset >= kFileSize) return 0;
  const long long n = std::min<long long>({static_cast<long long>(size), 1000LL, kFileSize - file_offset});
  auto* out = static_cast<unsigned char*>(base) + buf_offset;
  for (long long i = 0; i < n; ++i) out[i] = static_cast<unsigned char>((file_offset + i) & 0xff);
  return n;
}
ssize_t cuFileWrite(void* handle, const void* base, std::size_t size, off_t file_offset, off_t buf_offset) {
  if (handle != &handle_token) return -5027;
  if (mode() == "io_errors") {
    errno = EIO;
    return -1;
  }
  // Checks that a resumed write hands over the right bytes: the test writes (offset & 0xff).
  const auto* in = static_cast<const unsigned char*>(base) + buf_offset;
  const long long n = std::min<long long>(static_cast<long long>(size), 1500);
  for (long long i = 0; i < n; ++i) {
    if (in[i] != static_cast<unsigned char>((file_offset + i) & 0xff)) return -5014;
  }
  return n;
}

}  // extern "C"
