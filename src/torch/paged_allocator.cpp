#include "paged_allocator.hpp"

#include <atomic>
#include <memory>

#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"
#include "teraio/core/strings.hpp"

#ifdef TERAIO_TORCH_CUDA
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif

namespace teraio::torch_binding {
namespace {

struct PagedAllocator {
  int device = 0;
  std::unique_ptr<io::PageDriver> driver;
  std::unique_ptr<io::PagedDeviceMemory> memory;
};

// Never freed: PyTorch keeps calling its allocator until the process ends, after modules and
// statics are gone.
std::atomic<PagedAllocator*> installed{nullptr};

}  // namespace

bool paged_allocator_installed() {
  return installed.load() != nullptr;
}

io::PagedDeviceMemory& installed_paged_memory() {
  PagedAllocator* state = installed.load();
  if (state == nullptr)
    throw Error(ErrorKind::kInvalidArgument,
                "TeraIO's paged allocator is not installed (teraio.paged.install())");
  return *state->memory;
}

namespace {

io::PagedDeviceMemory& memory_to_hold_for() {
  if (!paged_allocator_installed())
    throw Error(ErrorKind::kInvalidArgument,
                "hold_copies_to_map holds copies for TeraIO's paged allocator, which is not installed "
                "(teraio.paged.install() before any CUDA work)");
  return installed_paged_memory();
}

}  // namespace

PagedCopyHolds::PagedCopyHolds(io::DeviceCopier& copier, io::HeldCopies held)
    : memory_(memory_to_hold_for()) {
  if (!copier.hold_copies(held))
    throw Error(ErrorKind::kInvalidArgument,
                cat("holding copies for the paged allocator's driver calls needs a CUDA copier in a deadline "
                    "order; this session's runs in ",
                    copier.order(), " on ", copier.name()));
  memory_.hold_copies_with(this, [&copier, held] { return copier.hold_copies(held); });
}

PagedCopyHolds::~PagedCopyHolds() {
  memory_.stop_holding_copies(this);
}

std::optional<io::PagedMemoryStats> paged_allocator_stats() {
  const PagedAllocator* state = installed.load();
  if (state == nullptr) return std::nullopt;
  return state->memory->stats();
}

#ifdef TERAIO_TORCH_CUDA
namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

void* allocate(PagedAllocator& state, std::size_t bytes, int device, cudaStream_t stream) {
  TORCH_CHECK(device == state.device, "TeraIO's paged allocator serves device ", state.device,
              " only; asked for device ", device);
  try {
    return state.memory->allocate(bytes, stream);
  } catch (const Error& e) {
    // PyTorch's own out-of-memory error, so that callers (TeraIO's executor among them) see
    // the same exception type as with the caching allocator.
    if (e.kind() == ErrorKind::kOutOfMemory)
      C10_THROW_ERROR(OutOfMemoryError, cat("CUDA out of memory (TeraIO paged allocator): ", e.what()));
    C10_THROW_ERROR(Error, cat("TeraIO paged allocator: ", e.what()));
  }
}

void give_back(PagedAllocator& state, void* address) noexcept {
  try {
    state.memory->free(address);
  } catch (const std::exception& e) {
    // A deleter cannot throw; a block lost here is a bug to report, not a reason to abort.
    log::error("TeraIO paged allocator: ", e.what());
  }
}

}  // namespace

void install_paged_allocator(int device, std::uint64_t page_bytes) {
  if (paged_allocator_installed())
    throw Error(ErrorKind::kInvalidArgument, "TeraIO's paged allocator is already installed");
  auto state = std::make_unique<PagedAllocator>();
  state->device = device;
  state->driver = io::make_cuda_page_driver(device, page_bytes);
  state->memory = std::make_unique<io::PagedDeviceMemory>(*state->driver);
  PagedAllocator* raw = state.get();
  auto allocator = pluggable::createCustomAllocator(
      [raw](std::size_t bytes, int on, cudaStream_t stream) { return allocate(*raw, bytes, on, stream); },
      [raw](void* address, std::size_t, int, cudaStream_t) { give_back(*raw, address); });
  auto* custom = dynamic_cast<pluggable::CUDAPluggableAllocator*>(allocator.get());
  if (custom == nullptr)
    throw Error(ErrorKind::kInternal, "createCustomAllocator gave no CUDAPluggableAllocator");
  custom->set_record_stream_fn(
      [raw](void* address, cudaStream_t stream) { raw->memory->record_use(address, stream); });
  // torch.cuda.set_per_process_memory_fraction caps the pages held, as it caps the caching allocator.
  custom->set_memory_fraction_fn([raw](double fraction, int) {
    raw->memory->set_cap(
        static_cast<std::uint64_t>(fraction * static_cast<double>(raw->driver->device_bytes())));
  });
  custom->set_reset_fn([raw] { raw->memory->empty_cache(); });
  try {
    pluggable::changeCurrentAllocator(allocator);
  } catch (const c10::Error& e) {
    throw Error(
        ErrorKind::kInvalidArgument,
        cat("TeraIO's paged allocator must be installed before PyTorch's CUDA allocator serves its first "
            "tensor (call teraio.use_paged_allocator() before any CUDA work): ",
            e.what_without_backtrace()));
  }
  installed.store(state.release());
}
#else
void install_paged_allocator(int /*device*/, std::uint64_t /*page_bytes*/) {
  throw Error(ErrorKind::kUnsupported,
              "the paged allocator needs a CUDA build of PyTorch and of TeraIO's binding");
}
#endif

}  // namespace teraio::torch_binding
