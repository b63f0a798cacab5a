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

struct CuFileStatus {
  bool library_loaded = false;  // libcufile.so found and all symbols resolved
  bool driver_open = false;     // cuFileDriverOpen succeeded
  bool nvfs_present = false;    // the nvidia-fs kernel driver is loaded (true GDS possible)
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

}  // namespace teraio::io
