// The writer. Tensors are laid out as the reference writer does (decreasing alignment, then
// name) so that files saved here and there look alike and every tensor is aligned to its
// element size within the data region.
#include "teraio/safetensors/writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/safetensors/header.hpp"

namespace teraio::safetensors {
namespace {

// An open output file under a temporary name: removed unless committed.
class TempFile {
 public:
  explicit TempFile(std::string final_path)
      : final_path_(std::move(final_path)), temp_path_(cat(final_path_, ".tmp.", ::getpid())) {
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno(errno, "cannot create ", temp_path_);
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t put = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(offset_ + done));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0)
        throw_errno(errno, "cannot write ", n - done, " bytes at offset ", offset_ + done, " of ",
                    temp_path_);
      if (put == 0)
        throw Error(ErrorKind::kIo, cat("write of ", n - done, " bytes at offset ", offset_ + done, " of ",
                                        temp_path_, " made no progress"));
      done += static_cast<std::size_t>(put);
    }
    offset_ += n;
  }

  void commit(bool sync) {
    if (sync && ::fsync(fd_) != 0) throw_errno(errno, "cannot fsync ", temp_path_);
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw_errno(errno, "cannot close ", temp_path_);
    }
    fd_ = -1;
    if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
      throw_errno(errno, "cannot rename ", temp_path_, " to ", final_path_);
    }
    committed_ = true;
    if (sync) sync_directory();
  }

 private:
  // The rename is durable only once the directory entry is.
  void sync_directory() const {
    std::string dir = std::filesystem::path(final_path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw_errno(errno, "cannot open directory ", dir);
    const int rc = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    if (rc != 0) throw_system_error(cat("cannot fsync directory ", dir), err);
  }

  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  std::uint64_t offset_ = 0;
  bool committed_ = false;
};

struct Planned {
  const TensorView* view;
  std::uint64_t bytes;
};

std::vector<Planned> plan_layout(const std::vector<TensorView>& tensors, const std::string& path) {
  std::vector<Planned> planned;
  std::set<std::string_view> names;
  for (const TensorView& t : tensors) {
    const std::string where = cat("saving ", path, ", tensor \"", t.name, "\": ");
    if (t.name == kMetadataKey)
      throw Error(ErrorKind::kInvalidArgument, where + "the name is reserved for metadata");
    if (!names.insert(t.name).second)
      throw Error(ErrorKind::kInvalidArgument, where + "the name appears twice");
    const auto bytes = tensor_bytes(t.dtype, t.shape);
    if (!bytes)
      throw Error(ErrorKind::kInvalidArgument,
                  where + "shape has a negative dimension, overflows or is not whole bytes");
    if (*bytes > 0 && t.data == nullptr) throw Error(ErrorKind::kInvalidArgument, where + "data is null");
    if (*bytes > 0 && t.memory == io::MemoryKind::kDevice && t.copier == nullptr) {
      throw Error(ErrorKind::kInvalidArgument, where + "a device tensor needs a DeviceCopier");
    }
    planned.push_back({&t, *bytes});
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    const auto ba = dtype_bits(a.view->dtype);
    const auto bb = dtype_bits(b.view->dtype);
    return ba != bb ? ba > bb : a.view->name < b.view->name;
  });
  return planned;
}

std::string header_json(const std::vector<Planned>& planned,
                        const std::map<std::string, std::string>& metadata, const std::string& path) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json[std::string(kMetadataKey)] = metadata;
  std::uint64_t offset = 0;
  for (const Planned& p : planned) {
    nlohmann::ordered_json entry;
    entry["dtype"] = dtype_name(p.view->dtype);
    entry["shape"] = p.view->shape;
    entry["data_offsets"] = {offset, offset + p.bytes};
    json[p.view->name] = std::move(entry);
    offset += p.bytes;
  }
  std::string text;
  try {
    text = json.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    // JSON text must be UTF-8: a tensor name or metadata string that is not cannot be saved.
    throw Error(ErrorKind::kInvalidArgument, cat("saving ", path, ": cannot write the header: ", e.what()));
  }
  // The reference writer pads with spaces so that the data region starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_device_tensor(TempFile& file, const TensorView& t, std::uint64_t bytes,
                         const SaveOptions& options) {
  const std::uint64_t chunk = std::max<std::uint64_t>(4096, std::min(options.chunk_bytes, bytes));
  io::PinnedBufferPool pool(*t.copier, chunk, 2 * chunk);
  const auto* src = static_cast<const std::byte*>(t.data);
  // Two buffers: the copy of chunk i+1 runs while chunk i is written.
  struct Pending {
    io::PinnedBuffer buffer;
    std::unique_ptr<io::CopyEvent> event;
    std::size_t n;
  };
  std::vector<Pending> pending;
  std::uint64_t done = 0;
  auto flush_oldest = [&] {
    pending.front().event->wait();
    file.write(pending.front().buffer.data(), pending.front().n);
    pending.erase(pending.begin());
  };
  try {
    while (done < bytes) {
      if (pending.size() == pool.buffer_count()) flush_oldest();
      io::PinnedBuffer buffer = pool.acquire();
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), bytes - done));
      auto event = t.copier->to_host(buffer.data(), src + done, n);
      pending.push_back({std::move(buffer), std::move(event), n});
      done += n;
    }
    while (!pending.empty()) flush_oldest();
  } catch (...) {
    // Copies still running write into the pool's buffers: let them land before it is unmapped.
    for (Pending& p : pending) {
      try {
        p.event->wait();
      } catch (const Error&) {
        // The first failure is the one reported.
      }
    }
    throw;
  }
}

}  // namespace

void save_file(const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata,
               const std::string& path, const SaveOptions& options) {
  const std::vector<Planned> planned = plan_layout(tensors, path);
  const std::string header = header_json(planned, metadata, path);
  if (header.size() > kMaxHeaderBytes) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("saving ", path, ": header of ", header.size(), " bytes exceeds the format's limit"));
  }
  std::byte length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<std::byte>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xff);
  TempFile file(path);
  file.write(length, sizeof(length));
  file.write(header.data(), header.size());
  for (const Planned& p : planned) {
    if (p.bytes == 0) continue;
    if (p.view->memory == io::MemoryKind::kDevice) {
      write_device_tensor(file, *p.view, p.bytes, options);
    } else {
      file.write(p.view->data, static_cast<std::size_t>(p.bytes));
    }
  }
  file.commit(options.sync);
}

}  // namespace teraio::safetensors
