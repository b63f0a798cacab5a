// cuFile (GPUDirect Storage) loaded at run time: dlopen finds libcufile, the driver is opened
// once per process, and every status the library returns is decoded into its name and
// meaning, so that a machine without GDS says exactly why and the caller can fall back.
#include "teraio/io/cufile.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cufile_abi.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io {
namespace {

namespace abi = cufile_abi;

struct KnownError {
  int code;
  const char* name;
  const char* meaning;
};

// CUfileOpError as documented in NVIDIA's cuFile API reference (5021 and 5032 are unassigned).
constexpr std::array kKnownErrors{
    KnownError{0, "CU_FILE_SUCCESS", "success"},
    KnownError{5001, "CU_FILE_DRIVER_NOT_INITIALIZED", "the nvidia-fs driver is not loaded"},
    KnownError{5002, "CU_FILE_DRIVER_INVALID_PROPS", "invalid driver property"},
    KnownError{5003, "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "driver property out of range"},
    KnownError{5004, "CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs driver version mismatch"},
    KnownError{5005, "CU_FILE_DRIVER_VERSION_READ_ERROR", "cannot read the nvidia-fs driver version"},
    KnownError{5006, "CU_FILE_DRIVER_CLOSING", "driver shutdown in progress"},
    KnownError{5007, "CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage is not supported on this platform"},
    KnownError{5008, "CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage is not supported on this file"},
    KnownError{5009, "CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage is not supported on this GPU"},
    KnownError{5010, "CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs driver ioctl error"},
    KnownError{5011, "CU_FILE_CUDA_DRIVER_ERROR", "CUDA driver API error"},
    KnownError{5012, "CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer"},
    KnownError{5013, "CU_FILE_CUDA_MEMORY_TYPE_INVALID", "invalid memory type for the pointer"},
    KnownError{5014, "CU_FILE_CUDA_POINTER_RANGE_ERROR", "pointer range exceeds the allocation"},
    KnownError{5015, "CU_FILE_CUDA_CONTEXT_MISMATCH", "CUDA context mismatch"},
    KnownError{5016, "CU_FILE_INVALID_MAPPING_SIZE", "access beyond the maximum pinned size"},
    KnownError{5017, "CU_FILE_INVALID_MAPPING_RANGE", "access beyond the mapped size"},
    KnownError{5018, "CU_FILE_INVALID_FILE_TYPE", "unsupported file type"},
    KnownError{5019, "CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags"},
    KnownError{5020, "CU_FILE_DIO_NOT_SET", "file is not opened with O_DIRECT"},
    KnownError{5022, "CU_FILE_INVALID_VALUE", "invalid argument"},
    KnownError{5023, "CU_FILE_MEMORY_ALREADY_REGISTERED", "device memory is already registered"},
    KnownError{5024, "CU_FILE_MEMORY_NOT_REGISTERED", "device memory is not registered"},
    KnownError{5025, "CU_FILE_PERMISSION_DENIED", "permission denied by the driver or the file"},
    KnownError{5026, "CU_FILE_DRIVER_ALREADY_OPEN", "driver is already open"},
    KnownError{5027, "CU_FILE_HANDLE_NOT_REGISTERED",
               "file handle is not registered: no GPUDirect Storage path to this file"},
    KnownError{5028, "CU_FILE_HANDLE_ALREADY_REGISTERED", "file handle is already registered"},
    KnownError{5029, "CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"},
    KnownError{5030, "CU_FILE_INTERNAL_ERROR", "internal cuFile error"},
    KnownError{5031, "CU_FILE_GETNEWFD_FAILED", "cannot obtain a new file descriptor"},
    KnownError{5033, "CU_FILE_NVFS_SETUP_ERROR", "nvidia-fs driver initialization error"},
    KnownError{5034, "CU_FILE_IO_DISABLED", "GPUDirect Storage is disabled by configuration for this file"},
    KnownError{5035, "CU_FILE_BATCH_SUBMIT_FAILED", "batch submission failed"},
    KnownError{5036, "CU_FILE_GPU_MEMORY_PINNING_FAILED", "cannot pin GPU memory"},
    KnownError{5037, "CU_FILE_BATCH_FULL", "batch queue is full"},
    KnownError{5038, "CU_FILE_ASYNC_NOT_SUPPORTED", "asynchronous (stream) I/O is not supported"},
    KnownError{5039, "CU_FILE_IO_MAX_ERROR", "error code out of range"},
};

std::string describe(const abi::Error& e) {
  std::string text = describe_cufile_error(e.err);
  if (e.err == abi::kCudaDriverError) text += cat(" (CUresult ", e.cu_err, ")");
  return text;
}

// The resolved library. Never dlclose'd: cuFile registers its own exit handlers, and
// unloading it before they run would leave them pointing at unmapped code.
struct Library {
  std::string path;
  abi::DriverOpenFn driver_open = nullptr;
  abi::DriverCloseFn driver_close = nullptr;
  abi::DriverGetPropertiesFn driver_get_properties = nullptr;
  abi::HandleRegisterFn handle_register = nullptr;
  abi::HandleDeregisterFn handle_deregister = nullptr;
  abi::BufRegisterFn buf_register = nullptr;
  abi::BufDeregisterFn buf_deregister = nullptr;
  abi::ReadFn read = nullptr;
  abi::WriteFn write = nullptr;
  abi::GetVersionFn get_version = nullptr;  // absent before cuFile 1.8: optional
};

Library& library() {
  static Library lib;
  return lib;
}

template <typename Fn>
bool resolve(void* handle, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  return fn != nullptr;
}

// Where libcufile may be: an explicit TERAIO_CUFILE_LIBRARY, the dynamic linker's own search,
// then the directory of the libcudart this process loaded and the usual toolkit locations,
// because /usr/local/cuda/lib64 is often not in the linker's cache.
std::vector<std::string> library_candidates() {
  std::vector<std::string> names;
  if (const char* explicit_path = std::getenv("TERAIO_CUFILE_LIBRARY"); explicit_path != nullptr) {
    names.emplace_back(explicit_path);
  }
  names.emplace_back("libcufile.so.0");
  names.emplace_back("libcufile.so");
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (name.find("libcudart.so") != std::string::npos && name.find('/') != std::string::npos) {
          static_cast<std::vector<std::string>*>(out)->push_back(name.substr(0, name.rfind('/')));
        }
        return 0;
      },
      &dirs);
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr) dirs.push_back(cat(home, "/lib64"));
  dirs.emplace_back("/usr/local/cuda/lib64");
  dirs.emplace_back("/usr/local/cuda/targets/x86_64-linux/lib");
  for (const auto& dir : dirs) {
    names.push_back(cat(dir, "/libcufile.so.0"));
    names.push_back(cat(dir, "/libcufile.so"));
  }
  return names;
}

// Loads libcufile and resolves every symbol TeraIO calls; returns the reason on failure.
std::string load_library(Library& lib) {
  void* handle = nullptr;
  std::string tried;
  for (const std::string& name : library_candidates()) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    // Only the first failure is worth showing: the others are the same "not found".
    const char* why = dlerror();
    if (tried.empty()) tried = why != nullptr ? why : name;
  }
  if (handle == nullptr)
    return cat("libcufile not loadable (searched the linker path and the CUDA toolkit): ", tried);
  link_map* map = nullptr;
  lib.path = (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr) ? map->l_name : "libcufile";
  // cuFileDriverClose_v2 is the name cufile.h maps cuFileDriverClose to since CUDA 12.
  if (!resolve(handle, "cuFileDriverClose_v2", lib.driver_close))
    resolve(handle, "cuFileDriverClose", lib.driver_close);
  const bool all = resolve(handle, "cuFileDriverOpen", lib.driver_open) &&
                   resolve(handle, "cuFileDriverGetProperties", lib.driver_get_properties) &&
                   resolve(handle, "cuFileHandleRegister", lib.handle_register) &&
                   resolve(handle, "cuFileHandleDeregister", lib.handle_deregister) &&
                   resolve(handle, "cuFileBufRegister", lib.buf_register) &&
                   resolve(handle, "cuFileBufDeregister", lib.buf_deregister) &&
                   resolve(handle, "cuFileRead", lib.read) && resolve(handle, "cuFileWrite", lib.write) &&
                   lib.driver_close != nullptr;
  if (!all) {
    const char* why = dlerror();
    return cat(lib.path, " lacks a cuFile symbol TeraIO needs: ", why != nullptr ? why : "unknown");
  }
  resolve(handle, "cuFileGetVersion", lib.get_version);
  return {};
}

bool nvidia_fs_module_loaded() {
  struct stat st {};
  return stat("/sys/module/nvidia_fs", &st) == 0;
}

const Library& usable_library(const std::string& what) {
  const CuFileDriver& driver = CuFileDriver::instance();
  if (!driver.usable())
    throw Error(ErrorKind::kCuFile, cat(what, ": cuFile unavailable: ", driver.status().detail));
  return library();
}

}  // namespace

std::string describe_cufile_error(int code) {
  for (const KnownError& k : kKnownErrors) {
    if (k.code == code) return cat(code, " ", k.name, " (", k.meaning, ")");
  }
  return cat(code, " (unknown cuFile error code)");
}

std::string describe_cufile_io_result(long long ret, int err_no) {
  if (ret >= 0) return cat(ret, " bytes");
  if (ret == -1) return cat("errno ", err_no, " (", std::strerror(err_no), ")");
  if (ret < -1'000'000) return cat(ret, " (unexpected cuFile return value)");
  return describe_cufile_error(static_cast<int>(-ret));
}

CuFileDriver& CuFileDriver::instance() {
  static CuFileDriver driver;
  return driver;
}

CuFileDriver::CuFileDriver() {
  Library& lib = library();
  if (std::string why = load_library(lib); !why.empty()) {
    status_.detail = why;
    log::debug("cuFile: ", why);
    return;
  }
  status_.library_loaded = true;
  status_.library_path = lib.path;
  std::string version = "version unknown";
  if (int v = 0; lib.get_version != nullptr && lib.get_version(&v).err == abi::kSuccess) {
    version = cat("version ", v / 1000, ".", v % 1000 / 10);
  }
  // Another component of the process (PyTorch's GDS support, say) may have opened the driver
  // first: it is then open all the same, and closing it stays that component's business.
  if (const abi::Error e = lib.driver_open(); e.err == abi::kDriverAlreadyOpen) {
    owns_driver_ = false;
  } else if (e.err != abi::kSuccess) {
    status_.detail = cat(lib.path, " (", version, ") loaded; cuFileDriverOpen failed: ", describe(e));
    return;
  } else {
    owns_driver_ = true;
  }
  status_.driver_open = true;
  abi::DrvPropsBuffer props{};
  if (const abi::Error e = lib.driver_get_properties(&props.props); e.err != abi::kSuccess) {
    status_.detail =
        cat(lib.path, " (", version, "): driver open; cuFileDriverGetProperties failed: ", describe(e),
            "; treating nvidia-fs as absent");
    return;
  }
  const abi::NvfsProps& nvfs = props.props.nvfs;
  // The driver reports nvfs version 0.0 when the nvidia-fs kernel module is absent: cuFile
  // then only offers its compatibility mode, which is a bounce through host memory anyway.
  status_.nvfs_present = nvfs.major_version != 0 || nvfs.minor_version != 0;
  status_.detail = cat(lib.path, " (", version, "): driver open; nvidia-fs version ", nvfs.major_version, ".",
                       nvfs.minor_version, status_.nvfs_present ? " (present)" : " (absent: no true GDS)",
                       "; kernel module nvidia_fs ", nvidia_fs_module_loaded() ? "loaded" : "not loaded",
                       "; NVMe support flag ", (nvfs.dstatusflags >> abi::kNvmeSupported) & 1U,
                       "; max direct I/O ", nvfs.max_direct_io_size, " KiB");
}

CuFileDriver::~CuFileDriver() {
  if (!owns_driver_) return;
  if (const abi::Error e = library().driver_close(); e.err != abi::kSuccess) {
    log::debug("cuFileDriverClose at exit: ", describe(e));
  }
}

CuFileHandle::CuFileHandle(int fd, std::string path) : path_(std::move(path)) {
  const Library& lib = usable_library(cat("cuFileHandleRegister(", path_, ")"));
  abi::Descr descr{};
  descr.type = abi::kHandleTypeOpaqueFd;
  descr.handle.fd = fd;
  descr.fs_ops = nullptr;
  void* handle = nullptr;
  if (const abi::Error e = lib.handle_register(&handle, &descr); e.err != abi::kSuccess) {
    throw Error(ErrorKind::kCuFile, cat("cuFileHandleRegister(", path_, "): ", describe(e)));
  }
  handle_ = handle;
}

CuFileHandle::~CuFileHandle() {
  if (handle_ != nullptr) library().handle_deregister(handle_);
}

void CuFileHandle::read(void* device_dst, std::size_t n, std::uint64_t file_offset) {
  const Library& lib = library();
  std::size_t done = 0;
  while (done < n) {
    errno = 0;
    const ssize_t got = lib.read(handle_, device_dst, n - done, static_cast<off_t>(file_offset + done),
                                 static_cast<off_t>(done));
    // Taken at once: building the message allocates, and may change errno before it is read.
    const int err = errno;
    if (got < 0) {
      throw Error(ErrorKind::kCuFile,
                  cat("cuFileRead(", path_, ", offset ", file_offset + done, ", ", n - done,
                      " bytes): ", describe_cufile_io_result(got, err)),
                  got == -1 ? err : 0);
    }
    if (got == 0) {
      throw Error(ErrorKind::kIo, cat("cuFileRead(", path_, ", offset ", file_offset + done, ", ", n - done,
                                      " bytes): unexpected end of file"));
    }
    done += static_cast<std::size_t>(got);
  }
}

void CuFileHandle::write(const void* device_src, std::size_t n, std::uint64_t file_offset) {
  const Library& lib = library();
  std::size_t done = 0;
  while (done < n) {
    errno = 0;
    const ssize_t put = lib.write(handle_, device_src, n - done, static_cast<off_t>(file_offset + done),
                                  static_cast<off_t>(done));
    if (put <= 0) {
      const int err = put == 0 ? EIO : errno;
      throw Error(ErrorKind::kCuFile,
                  cat("cuFileWrite(", path_, ", offset ", file_offset + done, ", ", n - done,
                      " bytes): ", put == 0 ? "wrote nothing" : describe_cufile_io_result(put, err)),
                  put == -1 ? err : 0);
    }
    done += static_cast<std::size_t>(put);
  }
}

CuFileBufferRegistration::CuFileBufferRegistration(void* device, std::size_t n) : device_(device) {
  const Library& lib = usable_library(cat("cuFileBufRegister(", device, ", ", n, " bytes)"));
  if (const abi::Error e = lib.buf_register(device, n, 0); e.err != abi::kSuccess) {
    throw Error(ErrorKind::kCuFile, cat("cuFileBufRegister(", device, ", ", n, " bytes): ", describe(e)));
  }
}

CuFileBufferRegistration::~CuFileBufferRegistration() {
  if (const abi::Error e = library().buf_deregister(device_); e.err != abi::kSuccess) {
    log::warn("cuFileBufDeregister(", device_, "): ", describe(e));
  }
}

}  // namespace teraio::io
