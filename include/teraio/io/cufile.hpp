// io/cufile: GPUDirect Storage through NVIDIA's cuFile library, loaded at run time with
// dlopen so that neither the build nor a machine without GDS needs cufile.h or libcufile.
// The driver is opened once per process. Registering a file can fail where the nvidia-fs
// driver is absent (cuFile error 5027 on the GPU machines here): callers then fall back to
// the bounce path for that file and say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace teraio::io {

// Decodes a cuFile status code (CUfileOpError: 0 or 5000 + n) as "5027 CU_FILE_HANDLE_NOT_REGISTERED
// (file handle is not registered)"; unknown codes are named as such, never dropped.
std::string describe_cufile_error(int code);
// Decodes a negative return of cuFileRead/cuFileWrite: -1 means errno (passed in), any other
// negative value is a negated CUfileOpError.
std::string describe_cufile_io_result(long long ret, int err_no);

struct CuFileStatus {
  bool library_loaded = false;  // libcufile.so found and all symbols resolved
  bool driver_open = false;     // cuFileDriverOpen succeeded
  bool nvfs_present = false;    // the nvidia-fs kernel driver is loaded (true GDS possible)
  std::string library_path;     // the library dlopen found, empty when none
  std::string detail;           // human-readable: library path, versions, or why not
};

// Process-wide cuFile driver: loaded and opened on first use, closed at process exit.
class CuFileDriver {
 public:
  static CuFileDriver& instance();
  const CuFileStatus& status() const { return status_; }
  bool usable() const { return status_.library_loaded && status_.driver_open; }

  CuFileDriver(const CuFileDriver&) = delete;
  CuFileDriver& operator=(const CuFileDriver&) = delete;
  ~CuFileDriver();

 private:
  CuFileDriver();
  CuFileStatus status_;
  bool owns_driver_ = false;  // this process's cuFileDriverOpen succeeded: close at exit
};

// One file registered with cuFile (fd opened with O_DIRECT). The constructor throws
// Error{kCuFile} with the decoded cuFile error (e.g. 5027) when registration fails.
class CuFileHandle {
 public:
  CuFileHandle(int fd, std::string path);
  ~CuFileHandle();
  CuFileHandle(const CuFileHandle&) = delete;
  CuFileHandle& operator=(const CuFileHandle&) = delete;

  // Synchronous transfers between device memory and the file; short transfers are resumed;
  // failures throw Error naming path, offset, size and the decoded cause.
  void read(void* device_dst, std::size_t n, std::uint64_t file_offset);
  void write(const void* device_src, std::size_t n, std::uint64_t file_offset);
  const std::string& path() const { return path_; }

 private:
  void* handle_ = nullptr;  // CUfileHandle_t
  std::string path_;
};

// Device memory registered with cuFile for the lifetime of this object (cuFileBufRegister),
// which lets true GDS skip its internal bounce buffers. Throws Error{kCuFile} when it fails.
class CuFileBufferRegistration {
 public:
  CuFileBufferRegistration(void* device, std::size_t n);
  ~CuFileBufferRegistration();
  CuFileBufferRegistration(const CuFileBufferRegistration&) = delete;
  CuFileBufferRegistration& operator=(const CuFileBufferRegistration&) = delete;

 private:
  void* device_;
};

}  // namespace teraio::io
