// The part of cuFile's C ABI that TeraIO calls, declared here from NVIDIA's public cuFile API
// reference so that the build needs neither cufile.h nor libcufile: the library is opened
// with dlopen at run time and these types must match its layout on Linux x86-64.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace teraio::io::cufile_abi {

// CUfileOpError: 0 or 5000 + n. Only the values TeraIO branches on are named here; the full
// table with names and messages lives in cufile.cpp (describe_cufile_error).
inline constexpr int kSuccess = 0;
inline constexpr int kCudaDriverError = 5011;
inline constexpr int kDriverAlreadyOpen = 5026;

// CUfileFileHandleType.
inline constexpr int kHandleTypeOpaqueFd = 1;

struct Error {  // CUfileError_t
  int err;      // CUfileOpError
  int cu_err;   // CUresult, meaningful when err == kCudaDriverError
};

struct Descr {  // CUfileDescr_t
  int type;     // CUfileFileHandleType
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // const CUfileFSOps_t*; null for kernel file systems
};

struct NvfsProps {  // the `nvfs` member of CUfileDrvProps_t
  unsigned int major_version;
  unsigned int minor_version;
  std::size_t poll_thresh_size;
  std::size_t max_direct_io_size;
  unsigned int dstatusflags;
  unsigned int dcontrolflags;
};

struct DrvProps {  // CUfileDrvProps_t
  NvfsProps nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};

// Room the library may write into: later cuFile releases may append members to
// CUfileDrvProps_t, and a larger buffer costs nothing.
union DrvPropsBuffer {
  DrvProps props;
  unsigned char room[1024];
};

// CUfileDriverStatusFlags bit numbers in nvfs.dstatusflags.
inline constexpr unsigned kNvmeSupported = 4;
inline constexpr unsigned kNvmeP2pSupported = 11;

using DriverOpenFn = Error (*)();
using DriverCloseFn = Error (*)();
using DriverGetPropertiesFn = Error (*)(DrvProps*);
using HandleRegisterFn = Error (*)(void** handle, Descr* descr);
using HandleDeregisterFn = void (*)(void* handle);
using BufRegisterFn = Error (*)(const void* base, std::size_t size, int flags);
using BufDeregisterFn = Error (*)(const void* base);
using ReadFn = ssize_t (*)(void* handle, void* base, std::size_t size, off_t file_offset, off_t buf_offset);
using WriteFn = ssize_t (*)(void* handle, const void* base, std::size_t size, off_t file_offset,
                            off_t buf_offset);
using GetVersionFn = Error (*)(int* version);

}  // namespace teraio::io::cufile_abi
