// teraio._native core: one Python exception type for every teraio::Error, byte sizes, and
// the facts of this build (what was compiled in is reported, never guessed).
#include <memory>
#include <string>

#include <torch/version.h>

#include "bindings.hpp"
#include "paged_allocator.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/paged_recording.hpp"

namespace teraio::torch_binding {

void bind_core(py::module_& m) {
  // teraio.Error subclasses RuntimeError; .kind says which teraio::ErrorKind it was, so that
  // callers can tell a full tier from an I/O error without parsing the message.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // The message may quote bytes of a hostile file that are not UTF-8.
      const std::string_view what = e.what();
      py::object message = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()), "replace"));
      py::object instance = py::reinterpret_borrow<py::object>(error.ptr())(message);
      instance.attr("kind") = std::string(to_string(e.kind()));
      PyErr_SetObject(error.ptr(), instance.ptr());
    }
  });

  m.def(
      "parse_bytes",
      [](const py::object& value) -> std::uint64_t {
        if (py::isinstance<py::bool_>(value))
          throw Error(ErrorKind::kInvalidArgument, "a size cannot be a bool");
        if (py::isinstance<py::int_>(value)) {
          const auto n = value.cast<long long>();
          if (n < 0) throw Error(ErrorKind::kInvalidArgument, cat("a size cannot be negative: ", n));
          return static_cast<std::uint64_t>(n);
        }
        if (py::isinstance<py::str>(value)) return parse_bytes(value.cast<std::string>());
        throw Error(ErrorKind::kInvalidArgument, cat("a size is an int or a string like \"24GiB\", not ",
                                                     std::string(py::str(value.get_type()))));
      },
      py::arg("value"), "Bytes from an int or a string such as \"24GiB\", \"512 MB\".");
  m.def(
      "parse_bandwidth", [](const std::string& text) { return parse_bandwidth(text); }, py::arg("text"),
      "Bytes per second from a string such as \"94GB/s\", \"800MiB/s\" or a plain number.");
  m.def(
      "parse_duration", [](const std::string& text) { return parse_duration(text); }, py::arg("text"),
      "Seconds from a string such as \"200us\", \"12ms\", \"2s\" or a plain number of seconds.");
  m.def("format_bytes", &format_bytes, py::arg("bytes"));
  m.def("format_bandwidth", &format_bandwidth, py::arg("bytes_per_second"));

  // Strong references to a tensor's storage, for the tests of the invariant that TeraIO holds
  // none: PyTorch decides some things by that count (in-place gradient accumulation).
  m.def(
      "_storage_references", [](const at::Tensor& tensor) { return tensor.storage().use_count(); },
      py::arg("tensor"));
  // Whether a storage owns its memory, or points at memory TeraIO holds for a transfer through
  // a non-owning alias (no deleter): once transfers settle every storage owns its memory again,
  // which record_stream, for one, relies on.
  m.def(
      "_storage_owns_memory",
      [](const at::Tensor& tensor) { return tensor.storage().data_ptr().get_deleter() != nullptr; },
      py::arg("tensor"));

  m.def("use_paged_allocator", &install_paged_allocator, py::arg("device"), py::arg("page_bytes") = 0,
        "Installs TeraIO's paged device memory as PyTorch's CUDA allocator (before any CUDA work).");
  m.def("paged_allocator_stats", []() -> py::object {
    const std::optional<io::PagedMemoryStats> stats = paged_allocator_stats();
    if (!stats) return py::none();
    py::dict out;
    out["page_bytes"] = stats->page_bytes;
    out["cap_bytes"] = stats->cap_bytes;
    out["in_use_bytes"] = stats->in_use_bytes;
    out["peak_in_use_bytes"] = stats->peak_in_use_bytes;
    out["held_bytes"] = stats->held_bytes;
    out["peak_held_bytes"] = stats->peak_held_bytes;
    out["allocations"] = stats->allocations;
    out["small_allocations"] = stats->small_allocations;
    out["reused"] = stats->reused;
    out["split_blocks"] = stats->split_blocks;
    out["joined_blocks"] = stats->joined_blocks;
    out["grown_blocks"] = stats->grown_blocks;
    out["recorded_uses"] = stats->recorded_uses;
    out["mapped_blocks"] = stats->mapped_blocks;
    out["taken_blocks"] = stats->taken_blocks;
    out["pages_mapped"] = stats->pages_mapped;
    out["pages_unmapped"] = stats->pages_unmapped;
    out["device_waits"] = stats->device_waits;
    out["map_s"] = stats->map_s;
    out["access_s"] = stats->access_s;
    out["unmap_s"] = stats->unmap_s;
    out["slow_maps"] = stats->slow_maps;
    out["slow_map_s"] = stats->slow_map_s;
    out["slow_unmaps"] = stats->slow_unmaps;
    out["slow_unmap_s"] = stats->slow_unmap_s;
    out["copy_holds"] = stats->copy_holds;
    out["copy_holds_not_quiet"] = stats->copy_holds_not_quiet;
    out["copy_hold_s"] = stats->copy_hold_s;
    out["out_of_memory"] = stats->out_of_memory;
    out["emptied"] = stats->emptied;
    return out;
  });

  m.def(
      "paged_start_recording", [] { installed_paged_memory().start_recording(); },
      "Keeps the paged allocator's requests from now on (io/paged_recording).");
  m.def(
      "paged_mark_step", [] { installed_paged_memory().mark_step(); },
      "Ends a step in the recording under way.");
  m.def(
      "paged_save_recording",
      [](const std::string& path) -> py::object {
        std::unique_ptr<io::PagedRecording> recording = installed_paged_memory().take_recording();
        if (!recording) return py::none();
        recording->write(path);
        return py::int_(recording->requests().size());
      },
      py::arg("path"),
      "Ends the recording under way and writes it to `path`; its number of requests, or None without one.");

  py::dict build;
  build["torch"] = TORCH_VERSION;
#ifdef TERAIO_TORCH_CUDA
  build["torch_cuda"] = true;
#else
  build["torch_cuda"] = false;
#endif
  build["cuda_copier"] = io::cuda_compiled_in();
#ifdef TERAIO_HAVE_URING
  build["io_uring"] = true;
#else
  build["io_uring"] = false;
#endif
  m.attr("build") = build;
}

}  // namespace teraio::torch_binding
