// teraio._native safetensors half: headers, reads of a file's data region into a torch uint8
// tensor that the caller allocated (so torch owns the memory: its CUDA caching allocator on the
// GPU), and saves of torch tensors. Dtypes, views, sharding and torch.distributed live in
// python/teraio/safetensors.py; this file only moves bytes, with the GIL released.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef TERAIO_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "bindings.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/pinned_pool.hpp"
#include "teraio/safetensors/header.hpp"
#include "teraio/safetensors/loader.hpp"
#include "teraio/safetensors/writer.hpp"

namespace teraio::torch_binding {
namespace {

namespace st = teraio::safetensors;

// A parsed header and the file it came from: read once, then used to size the destination and
// to read from, so that both see the same layout.
struct FileHeader {
  std::string path;
  st::Header header;
};

// CUDA copiers, lent out one thread at a time (a copier's streams and events are not meant to
// be driven by two loads at once) and kept for later loads, so that shards can be read in
// parallel from several Python threads. Each keeps its pinned bounce buffers too: pinning costs
// about 0.5 ms per MiB, more than a warm load of the bytes it pins. They are deliberately never
// destroyed: their streams would otherwise be destroyed by static destructors after the CUDA
// runtime has unloaded at interpreter exit.
class CudaCopiers {
  struct Slot {
    std::unique_ptr<io::DeviceCopier> copier;
    std::unique_ptr<io::PinnedBufferPool> bounce_pool;  // pinned through copier; goes first
  };

 public:
  class Lease {
   public:
    Lease(CudaCopiers& owner, int device, Slot slot)
        : owner_(&owner), device_(device), slot_(std::move(slot)) {}
    ~Lease() {
      if (slot_.copier) owner_->give_back(device_, std::move(slot_));
    }
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    io::DeviceCopier& operator*() const { return *slot_.copier; }
    io::DeviceCopier* get() const { return slot_.copier.get(); }
    // The copier's bounce buffers, remade only when options need others.
    io::PinnedBufferPool* bounce_pool(const st::LoadOptions& options) {
      if (!slot_.bounce_pool || !st::bounce_pool_suits(*slot_.bounce_pool, options)) {
        slot_.bounce_pool.reset();
        slot_.bounce_pool = st::make_bounce_pool(*slot_.copier, options);
      }
      return slot_.bounce_pool.get();
    }

   private:
    CudaCopiers* owner_;
    int device_;
    Slot slot_;
  };

  static CudaCopiers& instance() {
    static CudaCopiers* copiers = new CudaCopiers;
    return *copiers;
  }
  // An idle copier of the device, or a new one when every one is lent out.
  Lease lend(int device) {
    {
      std::lock_guard lock(mutex_);
      auto& idle = idle_[device];
      if (!idle.empty()) {
        Slot slot = std::move(idle.back());
        idle.pop_back();
        return Lease(*this, device, std::move(slot));
      }
    }
    return Lease(*this, device, Slot{io::make_cuda_copier(device, io::CopyOrder::kIssue), nullptr});
  }

 private:
  void give_back(int device, Slot slot) {
    std::lock_guard lock(mutex_);
    idle_[device].push_back(std::move(slot));
  }

  std::mutex mutex_;
  std::map<int, std::vector<Slot>> idle_;
};

void check_device(const at::Tensor& tensor, const std::string& what) {
  if (tensor.is_cuda()) {
#ifndef TERAIO_TORCH_CUDA
    throw Error(ErrorKind::kUnsupported,
                cat(what, " is a CUDA tensor, but teraio._native was built without CUDA"));
#endif
  } else if (!tensor.device().is_cpu()) {
    throw Error(ErrorKind::kInvalidArgument,
                cat(what, " is on ", tensor.device().str(), "; only CPU and CUDA tensors are supported"));
  }
}

py::dict stats_dict(const st::LoadStats& stats) {
  py::dict d;
  d["mode"] = stats.mode;
  d["backend"] = stats.backend;
  d["reason"] = stats.reason;
  d["bytes"] = stats.bytes;
  d["seconds"] = stats.seconds;
  return d;
}

py::dict read_range(const FileHeader& file, std::uint64_t begin, std::uint64_t end,
                    const at::Tensor& destination, const std::string& io_mode,
                    std::optional<std::uint64_t> chunk_bytes, std::optional<unsigned> chunks_in_flight,
                    std::optional<unsigned> threads) {
  const std::string what = cat(file.path, ": destination of [", begin, ", ", end, ")");
  check_device(destination, what);
  if (destination.scalar_type() != at::kByte || !destination.is_contiguous() || destination.dim() != 1 ||
      end < begin || static_cast<std::uint64_t>(destination.numel()) != end - begin) {
    throw Error(ErrorKind::kInvalidArgument,
                cat(what, " must be a contiguous 1-d uint8 tensor of ", end - begin, " elements"));
  }
  st::LoadOptions options;
  options.io_mode = st::parse_io_mode(io_mode);
  if (chunk_bytes) options.chunk_bytes = *chunk_bytes;
  if (chunks_in_flight) options.chunks_in_flight = *chunks_in_flight;
  if (threads) options.threads = *threads;
  auto* data = static_cast<std::byte*>(destination.data_ptr());
  st::LoadStats stats;
  {
    py::gil_scoped_release no_gil;
    if (destination.is_cuda()) {
#ifdef TERAIO_TORCH_CUDA
      const c10::cuda::CUDAGuard guard(destination.device());
      // The destination came from the caching allocator, which may hand out a block that kernels
      // queued on the current stream still read; cuFile and the copier's own streams are not
      // ordered after them, so they start once that work has finished.
      c10::cuda::getCurrentCUDAStream(destination.device().index()).synchronize();
      CudaCopiers::Lease copier = CudaCopiers::instance().lend(destination.device().index());
      options.destination = io::MemoryKind::kDevice;
      options.bounce_pool = copier.bounce_pool(options);
      stats = st::load_range(file.path, file.header, begin, end, data, *copier, options);
#endif
    } else {
      const std::unique_ptr<io::DeviceCopier> copier = io::make_host_copier();
      options.destination = io::MemoryKind::kHost;
      stats = st::load_range(file.path, file.header, begin, end, data, *copier, options);
    }
  }
  return stats_dict(stats);
}

// entries: (name, safetensors dtype name, contiguous tensor). The Python side maps torch dtypes
// to the format's names; here the element size is checked against it once more.
void save_file(const std::vector<std::tuple<std::string, std::string, at::Tensor>>& entries,
               const std::map<std::string, std::string>& metadata, const std::string& path, bool sync) {
  std::vector<st::TensorView> views;
  views.reserve(entries.size());
  std::map<int, CudaCopiers::Lease> copiers;  // one per CUDA device holding tensors
  for (const auto& [name, dtype_name, tensor] : entries) {
    const std::string what = cat(path, ": tensor \"", name, "\"");
    check_device(tensor, what);
    const auto dtype = st::parse_dtype(dtype_name);
    if (!dtype) throw Error(ErrorKind::kInvalidArgument, cat(what, ": unknown dtype ", dtype_name));
    if (!tensor.is_contiguous() ||
        st::element_size(*dtype) != static_cast<std::uint32_t>(tensor.element_size())) {
      throw Error(ErrorKind::kInvalidArgument,
                  cat(what, " must be contiguous with elements of ", st::element_size(*dtype), " bytes (",
                      dtype_name, "), not ", tensor.element_size()));
    }
    st::TensorView view;
    view.name = name;
    view.dtype = *dtype;
    view.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    view.data = tensor.data_ptr();
    if (tensor.is_cuda()) {
      view.memory = io::MemoryKind::kDevice;
      const int device = tensor.device().index();
      if (!copiers.contains(device)) copiers.emplace(device, CudaCopiers::instance().lend(device));
      view.copier = copiers.at(device).get();
    }
    views.push_back(std::move(view));
  }
  st::SaveOptions options;
  options.sync = sync;
  py::gil_scoped_release no_gil;
#ifdef TERAIO_TORCH_CUDA
  // The copies out start after the kernels already queued on torch's current streams, which
  // may still be producing the tensors (or their contiguous copies).
  for (const auto& [device, copier] : copiers)
    (*copier).wait_for_stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(),
                              io::CopyDirection::kToHost);
#endif
  st::save_file(views, metadata, path, options);
}

py::dict index_dict(const st::CheckpointIndex& index) {
  py::dict d;
  d["path"] = index.path;
  d["directory"] = index.directory;
  d["metadata"] = index.metadata;
  d["weight_map"] = index.weight_map;
  d["shards"] = index.shards;
  return d;
}

}  // namespace

void bind_safetensors(py::module_& m) {
  py::class_<FileHeader>(m, "SafetensorsHeader",
                         "A validated safetensors header and the file it was read from.")
      .def_readonly("path", &FileHeader::path)
      .def_property_readonly("data_offset", [](const FileHeader& f) { return f.header.data_offset; })
      .def_property_readonly("data_bytes", [](const FileHeader& f) { return f.header.data_bytes; })
      .def_property_readonly("metadata", [](const FileHeader& f) { return f.header.metadata; })
      .def_property_readonly(
          "tensors",
          [](const FileHeader& f) {
            py::list tensors;
            for (const st::TensorInfo& t : f.header.tensors) {
              tensors.append(
                  py::make_tuple(t.name, std::string(st::dtype_name(t.dtype)), t.shape, t.begin, t.end));
            }
            return tensors;
          },
          "(name, dtype, shape, begin, end) in file order; offsets within the data region.");

  m.def(
      "st_read_header",
      [](const std::string& path) {
        py::gil_scoped_release no_gil;
        return FileHeader{path, st::read_header(path)};
      },
      py::arg("path"), "Reads and validates the header of a safetensors file.");
  m.def("st_read_range", &read_range, py::arg("header"), py::arg("begin"), py::arg("end"),
        py::arg("destination"), py::arg("io_mode") = "auto", py::arg("chunk_bytes") = py::none(),
        py::arg("chunks_in_flight") = py::none(), py::arg("threads") = py::none(),
        "Reads bytes [begin, end) of the data region into a 1-d uint8 CPU or CUDA tensor; returns the load "
        "statistics once every byte has arrived (host-synchronised).");
  m.def("st_save_file", &save_file, py::arg("entries"), py::arg("metadata"), py::arg("path"),
        py::arg("sync") = true,
        "Writes (name, dtype name, contiguous tensor) entries as a safetensors file.");
  m.def(
      "st_resolve_checkpoint",
      [](const std::string& path) { return index_dict(st::resolve_checkpoint(path)); }, py::arg("path"),
      "The index of a checkpoint: an index file, a directory, or one .safetensors file.");
}

}  // namespace teraio::torch_binding
