#include "iobench_probe.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <thread>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/cufile.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/io_backend.hpp"

namespace teraio::cli {
namespace {

// A scratch file removed when the probe ends, whatever happens.
class ScratchFile {
 public:
  ScratchFile(const std::string& dir, int flags) : path_(cat(dir, "/.teraio-probe-", getpid())) {
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | flags, 0600);
    err_ = fd_ < 0 ? errno : 0;
  }
  ~ScratchFile() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  int fd() const { return fd_; }
  int err() const { return err_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int err_ = 0;
};

struct AlignedPage {
  AlignedPage() : data(static_cast<char*>(std::aligned_alloc(kPageSize, kPageSize))) {
    std::memset(data, 0x5a, kPageSize);
  }
  ~AlignedPage() { std::free(data); }
  AlignedPage(const AlignedPage&) = delete;
  AlignedPage& operator=(const AlignedPage&) = delete;
  char* data;
};

std::string filesystem_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x2FC12FC1: return "zfs";
    default: return cat("fs magic 0x", std::hex, type);
  }
}

std::uint64_t mem_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * kKiB;
  }
  return 0;
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (const auto& dir : split(path, ':')) {
    if (!dir.empty() && access(cat(dir, "/", program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// One real 4 KiB write through io_uring: io_uring_queue_init can succeed where submissions
// are then refused (seccomp in containers, io_uring_disabled), so only a completed request counts.
std::string try_uring(const std::string& dir) {
  ScratchFile file(dir, 0);
  if (file.fd() < 0) return cat("cannot create a scratch file in ", dir, ": ", std::strerror(file.err()));
  try {
    auto backend = io::make_uring_backend(file.fd(), 4);
    AlignedPage page;
    auto result = std::make_shared<std::promise<std::int64_t>>();
    auto done = result->get_future();
    backend->submit({io::IoDirection::kWrite, page.data, kPageSize, 0, -1},
                    [result](std::int64_t r) { result->set_value(r); });
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return "a 4 KiB io_uring write did not complete within 10 s";
    }
    const std::int64_t r = done.get();
    if (r != static_cast<std::int64_t>(kPageSize)) return cat("a 4 KiB io_uring write returned ", r);
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

MachineProbe probe_machine(const std::string& uring_probe_dir) {
  MachineProbe m;
  m.cuda_compiled_in = io::cuda_compiled_in();
  const io::CudaInventory inventory = io::cuda_inventory();
  m.cuda_devices = inventory.devices;
  m.cuda_detail = inventory.detail;
  const io::CuFileStatus& cufile = io::CuFileDriver::instance().status();
  m.cufile_loaded = cufile.library_loaded;
  m.cufile_driver_open = cufile.driver_open;
  m.nvfs_present = cufile.nvfs_present;
  m.cufile_detail = cufile.detail;
  m.uring_compiled_in = io::uring_compiled_in();
  if (m.uring_compiled_in) {
    m.uring_detail = try_uring(uring_probe_dir);
    m.uring_works = m.uring_detail.empty();
    if (m.uring_works) m.uring_detail = "a 4 KiB write completed";
  } else {
    m.uring_detail = "not compiled in (liburing not found at configure time)";
  }
  m.page_size = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  m.cpus = std::thread::hardware_concurrency();
  m.mem_available = mem_available();
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    m.memlock_limit = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(lim.rlim_cur);
  }
  m.root = geteuid() == 0;
  utsname u{};
  if (uname(&u) == 0) m.kernel = cat(u.sysname, " ", u.release);
  m.fio_available = on_path("fio");
  return m;
}

PathProbe probe_path(const std::string& path, const MachineProbe& machine) {
  PathProbe p;
  p.path = path;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    p.problem = cat("does not exist: ", std::strerror(errno));
    return p;
  }
  if (!S_ISDIR(st.st_mode)) {
    p.problem = "not a directory";
    return p;
  }
  struct statfs fs {};
  if (statfs(path.c_str(), &fs) == 0) p.filesystem = filesystem_name(fs.f_type);
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0)
    p.free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  {
    ScratchFile plain(path, 0);
    if (plain.fd() < 0) {
      p.problem = cat("cannot create a file: ", std::strerror(plain.err()));
      return p;
    }
  }
  p.usable = true;
  ScratchFile direct(path, O_DIRECT);
  if (direct.fd() < 0) {
    p.direct_io_note = cat("O_DIRECT open refused: ", std::strerror(direct.err()));
  } else {
    AlignedPage page;
    if (pwrite(direct.fd(), page.data, kPageSize, 0) != static_cast<ssize_t>(kPageSize)) {
      p.direct_io_note = cat("O_DIRECT write failed: ", std::strerror(errno));
    } else if (pread(direct.fd(), page.data, kPageSize, 0) != static_cast<ssize_t>(kPageSize)) {
      p.direct_io_note = cat("O_DIRECT read failed: ", std::strerror(errno));
    } else {
      p.direct_io = true;
    }
  }
  const std::string mode = p.direct_io ? "O_DIRECT" : cat("buffered (", p.direct_io_note, ")");
  p.backend = machine.uring_works ? cat("io_uring, ", mode) : cat("posix threads, ", mode);

  if (!machine.cufile_driver_open) {
    p.cufile = cat("bounce path (cuFile unusable: ", machine.cufile_detail, ")");
  } else if (direct.fd() < 0) {
    p.cufile = "bounce path (no O_DIRECT file for cuFile)";
  } else {
    try {
      io::CuFileHandle handle(direct.fd(), direct.path());
      p.cufile = machine.nvfs_present ? "true GDS (cuFileHandleRegister succeeded, nvidia-fs present)"
                                      : "bounce path (registration succeeded but nvidia-fs is absent: cuFile "
                                        "would only run its compatibility mode)";
    } catch (const Error& e) {
      p.cufile = cat("bounce path (", e.what(), ")");
    }
  }
  return p;
}

}  // namespace teraio::cli
