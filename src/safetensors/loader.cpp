// load_file: picks the read path (cuFile, O_DIRECT with bounce buffers, buffered), reports
// which ran and why, and moves the data region into one destination buffer.
#include "teraio/safetensors/loader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "chunked_read.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/cufile.hpp"
#include "teraio/io/io_backend.hpp"
#include "teraio/io/pinned_pool.hpp"

namespace teraio::safetensors {
namespace {

class FileDescriptor {
 public:
  FileDescriptor(const std::string& path, int flags)
      : fd_(::open(path.c_str(), flags | O_RDONLY | O_CLOEXEC)) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Share of [offset, offset + length) held in the page cache, from mincore() on a mapping.
// nullopt when the kernel will not tell (then auto reads directly).
std::optional<double> cached_share(int fd, std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return 1.0;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t map_begin = align_down(offset, page);
  const std::uint64_t map_length = offset + length - map_begin;
  void* map = ::mmap(nullptr, map_length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(map_begin));
  if (map == MAP_FAILED) return std::nullopt;
  std::vector<unsigned char> resident((map_length + page - 1) / page);
  const int rc = ::mincore(map, map_length, resident.data());
  ::munmap(map, map_length);
  if (rc != 0) return std::nullopt;
  std::uint64_t cached = 0;
  for (const unsigned char r : resident) cached += r & 1u;
  return static_cast<double>(cached) / static_cast<double>(resident.size());
}

std::unique_ptr<io::IoBackend> make_backend(int fd, const LoadOptions& options, std::string& name) {
  if (options.use_uring && io::uring_compiled_in()) {
    try {
      auto backend = io::make_uring_backend(fd, std::max(2u, options.chunks_in_flight * 2));
      name = backend->name();
      return backend;
    } catch (const Error& e) {
      log::debug("safetensors: io_uring unavailable, using POSIX threads: ", e.what());
    }
  }
  auto backend = io::make_posix_backend(fd, std::max(1u, options.threads));
  name = backend->name();
  return backend;
}

// Why cuFile cannot serve this load, or empty when it can.
std::string cufile_refusal(const io::DeviceCopier& copier, const LoadOptions& options) {
  if (options.destination != io::MemoryKind::kDevice || !copier.is_cuda())
    return "the destination is not CUDA memory";
  const io::CuFileDriver& driver = io::CuFileDriver::instance();
  if (!driver.usable()) return cat("cuFile is not usable: ", driver.status().detail);
  if (!driver.status().nvfs_present)
    return "the nvidia-fs driver is not loaded (cuFile would only emulate GDS)";
  return {};
}

// cuFile straight into device memory; false (with the reason) when the file cannot be registered.
bool read_with_cufile(const std::string& path, std::uint64_t file_offset, std::uint64_t length,
                      std::byte* destination, std::string& reason) {
  FileDescriptor fd(path, O_DIRECT);
  if (!fd) {
    reason = cat("cannot open with O_DIRECT for cuFile: ", std::strerror(errno));
    return false;
  }
  std::optional<io::CuFileHandle> handle;
  try {
    handle.emplace(fd.get(), path);
  } catch (const Error& e) {
    reason = cat("cuFile registration failed: ", e.what());
    return false;
  }
  handle->read(destination, length, file_offset);
  return true;
}

void read_buffered(const std::string& path, std::uint64_t file_offset, std::uint64_t length,
                   io::DeviceCopier& copier, const LoadOptions& options, std::byte* destination,
                   LoadStats& stats) {
  FileDescriptor fd(path, 0);
  if (!fd) throw_errno(errno, "cannot open ", path);
  detail::ParallelRead read;
  read.fd = fd.get();
  read.copier = &copier;
  read.path = path;
  read.file_offset = file_offset;
  read.length = length;
  read.destination = destination;
  read.destination_is_device = options.destination == io::MemoryKind::kDevice;
  read.chunk_bytes = options.chunk_bytes;
  read.threads = options.threads;
  read.bounce_pool = options.bounce_pool;
  stats.backend = "posix";
  detail::run_parallel_read(read);
}

void read_direct(const std::string& path, std::uint64_t file_offset, std::uint64_t length,
                 io::DeviceCopier& copier, const LoadOptions& options, std::byte* destination,
                 LoadStats& stats) {
  FileDescriptor fd(path, O_DIRECT);
  if (!fd) throw_errno(errno, "cannot open ", path, " with O_DIRECT");
  const std::unique_ptr<io::IoBackend> backend = make_backend(fd.get(), options, stats.backend);
  detail::ChunkedRead read;
  read.backend = backend.get();
  read.copier = &copier;
  read.path = path;
  read.file_offset = file_offset;
  read.length = length;
  read.destination = destination;
  read.destination_is_device = options.destination == io::MemoryKind::kDevice;
  read.direct = true;
  read.chunk_bytes = options.chunk_bytes;
  read.chunks_in_flight = options.chunks_in_flight;
  read.bounce_pool = options.bounce_pool;
  detail::run_chunked_read(read);
}

bool direct_io_possible(const std::string& path) {
  return static_cast<bool>(FileDescriptor(path, O_DIRECT));
}

// A buffer holds two pieces of a buffered read, and a whole O_DIRECT chunk.
std::uint64_t bounce_buffer_bytes(const LoadOptions& options) {
  return align_up(std::max<std::uint64_t>(options.chunk_bytes, 2 * kPageSize), 2 * kPageSize);
}

std::size_t bounce_buffer_count(const LoadOptions& options) {
  return std::max({1u, options.chunks_in_flight, options.threads});
}

}  // namespace

unsigned default_read_threads() {
  return std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
}

std::unique_ptr<io::PinnedBufferPool> make_bounce_pool(io::DeviceCopier& copier, const LoadOptions& options) {
  const std::uint64_t buffer = bounce_buffer_bytes(options);
  return std::make_unique<io::PinnedBufferPool>(
      copier, static_cast<std::size_t>(buffer),
      static_cast<std::size_t>(buffer * bounce_buffer_count(options)));
}

bool bounce_pool_suits(const io::PinnedBufferPool& pool, const LoadOptions& options) {
  return pool.buffer_bytes() == bounce_buffer_bytes(options) &&
         pool.buffer_count() >= bounce_buffer_count(options);
}

std::string_view to_string(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto: return "auto";
    case IoMode::kCuFile: return "cufile";
    case IoMode::kDirect: return "direct";
    case IoMode::kBuffered: return "buffered";
  }
  return "?";
}

IoMode parse_io_mode(std::string_view text) {
  for (const IoMode mode : {IoMode::kAuto, IoMode::kCuFile, IoMode::kDirect, IoMode::kBuffered}) {
    if (to_string(mode) == text) return mode;
  }
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown io mode \"", text, "\" (auto, cufile, direct or buffered)"));
}

DataBuffer::DataBuffer(io::DeviceCopier& copier, io::MemoryKind kind, std::size_t n)
    : copier_(&copier), kind_(kind) {
  if (n == 0) return;
  if (kind == io::MemoryKind::kDevice) {
    data_ = static_cast<std::byte*>(copier.allocate_device(n));
  } else {
    // Page-aligned so that O_DIRECT could read into it and copies run at full speed.
    data_ = static_cast<std::byte*>(std::aligned_alloc(kPageSize, align_up(n, kPageSize)));
    if (data_ == nullptr)
      throw Error(ErrorKind::kIo, cat("cannot allocate ", format_bytes(n), " of host memory"));
  }
  size_ = n;
}

DataBuffer::~DataBuffer() {
  release();
}

DataBuffer::DataBuffer(DataBuffer&& other) noexcept
    : copier_(other.copier_), kind_(other.kind_), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

DataBuffer& DataBuffer::operator=(DataBuffer&& other) noexcept {
  if (this != &other) {
    release();
    copier_ = other.copier_;
    kind_ = other.kind_;
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void DataBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (kind_ == io::MemoryKind::kDevice) {
    copier_->free_device(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
}

std::byte* LoadedFile::tensor_data(std::string_view name) const {
  const TensorInfo* info = header.find(name);
  if (info == nullptr) throw Error(ErrorKind::kInvalidArgument, cat(path, ": no tensor \"", name, "\""));
  return buffer.data() == nullptr ? nullptr : buffer.data() + info->begin;
}

LoadStats load_range(const std::string& path, const Header& header, std::uint64_t begin, std::uint64_t end,
                     std::byte* destination, io::DeviceCopier& copier, const LoadOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  if (begin > end || end > header.data_bytes) {
    throw Error(ErrorKind::kInvalidArgument,
                cat(path, ": range [", begin, ", ", end, ") is outside the data region of ",
                    header.data_bytes, " bytes"));
  }
  const std::uint64_t length = end - begin;
  if (length > 0 && destination == nullptr)
    throw Error(ErrorKind::kInvalidArgument, cat(path, ": null destination for ", length, " bytes"));
  const std::uint64_t file_offset = header.data_offset + begin;
  LoadStats stats;
  stats.bytes = length;

  IoMode mode = options.io_mode;
  if (mode == IoMode::kAuto || mode == IoMode::kCuFile) {
    const std::string refusal = cufile_refusal(copier, options);
    if (refusal.empty() && length > 0) {
      std::string reason;
      if (read_with_cufile(path, file_offset, length, destination, reason)) {
        stats.mode = stats.backend = "cufile";
        stats.reason = "GPUDirect Storage is usable";
        mode = IoMode::kCuFile;
      } else if (mode == IoMode::kCuFile) {
        throw Error(ErrorKind::kCuFile, cat(path, ": cuFile requested but ", reason));
      } else {
        stats.reason = reason + "; ";
        mode = IoMode::kAuto;
      }
    } else if (mode == IoMode::kCuFile) {
      throw Error(ErrorKind::kUnsupported,
                  cat(path, ": cuFile requested but ", refusal.empty() ? "the file is empty" : refusal));
    } else {
      stats.reason = cat("no cuFile: ", refusal.empty() ? "no data" : refusal, "; ");
    }
  }
  if (mode == IoMode::kAuto) {
    FileDescriptor fd(path, 0);
    const auto share = fd ? cached_share(fd.get(), file_offset, length) : std::nullopt;
    if (share && *share >= options.cached_threshold) {
      mode = IoMode::kBuffered;
      stats.reason += cat(static_cast<int>(*share * 100), "% of the data is in the page cache");
    } else if (!direct_io_possible(path)) {
      mode = IoMode::kBuffered;
      stats.reason += "the file system refuses O_DIRECT";
    } else {
      mode = IoMode::kDirect;
      stats.reason += share
                          ? cat("only ", static_cast<int>(*share * 100), "% of the data is in the page cache")
                          : std::string("page cache residency unknown");
    }
  } else if (mode != IoMode::kCuFile) {
    stats.reason = "requested";
  }
  if (mode == IoMode::kDirect || mode == IoMode::kBuffered) {
    stats.mode = std::string(to_string(mode));
    if (mode == IoMode::kDirect) {
      read_direct(path, file_offset, length, copier, options, destination, stats);
    } else {
      read_buffered(path, file_offset, length, copier, options, destination, stats);
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  log::debug("safetensors: read ", path, " [", begin, ", ", end, ") (", format_bytes(length), ") by ",
             stats.mode, "/", stats.backend, " at ",
             format_bandwidth(static_cast<double>(length) / std::max(stats.seconds, 1e-9)), ": ",
             stats.reason);
  return stats;
}

LoadedFile load_file(const std::string& path, io::DeviceCopier& copier, const LoadOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  LoadedFile loaded;
  loaded.path = path;
  loaded.header = read_header(path);
  const Header& header = loaded.header;
  loaded.buffer = DataBuffer(copier, options.destination, static_cast<std::size_t>(header.data_bytes));
  loaded.stats = load_range(path, header, 0, header.data_bytes, loaded.buffer.data(), copier, options);
  // The header read and the allocation are part of loading a file.
  loaded.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return loaded;
}

CheckpointIndex resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  const auto one_shard = [](const fs::path& file) {
    CheckpointIndex index;
    index.path = file.string();
    index.directory = file.parent_path().empty() ? std::string(".") : file.parent_path().string();
    index.shards = {file.filename().string()};
    return index;
  };
  if (fs::is_directory(path)) {
    const fs::path index_path = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (!fs::exists(index_path) && fs::exists(single)) return one_shard(single);
    return parse_index(index_path.string());
  }
  if (fs::path(path).extension() == ".safetensors") return one_shard(fs::path(path));
  return parse_index(path);
}

}  // namespace teraio::safetensors
