// The CUDA PageDriver: physical pages from cuMemCreate, address ranges from cuMemAddressReserve.
// The driver calls are looked up through the runtime (cudaGetDriverEntryPointByVersion), as the
// rest of TeraIO links only cudart; events come from the copier's pool.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/io/paged_device_memory.hpp"

namespace teraio::io {
namespace {

using namespace cuda_detail;

// The ABI version asked for: the virtual memory calls have not changed since CUDA 10.2.
constexpr unsigned int kDriverAbi = 12000;

template <typename Function>
Function driver_call(const char* name) {
  return driver_entry_point<Function>(name, kDriverAbi, "the paged allocator");
}

class CudaPageDriver final : public PageDriver {
 public:
  CudaPageDriver(int device, std::uint64_t page_bytes) : device_(device), events_(device) {
    check(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::size_t granularity = 0;
    checked(granularity_(&granularity, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity");
    // Larger pages cost the same per driver call (bench/vmm_costs.py: cuMemSetAccess about 36 µs
    // per mapping on the H100), at the price of rounding every block up to them. The default is
    // from W3 on the H100 (bench/RESULTS.md, sessions 25-26): with 2 MiB pages it mapped 195 593
    // pages a step and ran 19% behind the caching allocator; with 8 MiB (and growth in place) 27 040,
    // 8% ahead. 8 MiB pages add 0.25% to the bytes of W3's trace, 16 MiB 2.3%.
    page_ = page_bytes != 0                        ? page_bytes
            : kDefaultPageBytes % granularity == 0 ? kDefaultPageBytes
                                                   : granularity;
    if (page_ % granularity != 0)
      throw Error(ErrorKind::kInvalidArgument,
                  cat("a page of ", page_, " bytes is not a multiple of the device's ", granularity,
                      "-byte allocation granularity"));
    std::size_t free = 0;
    std::size_t total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    device_bytes_ = total;
  }

  std::uint64_t page_bytes() const override { return page_; }
  std::uint64_t device_bytes() const override { return device_bytes_; }

  std::optional<PageHandle> create_page() override {
    CUmemGenericAllocationHandle handle = 0;
    const CUresult rc = create_(&handle, page_, &prop_, 0);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
    checked(rc, "cuMemCreate");
    return handle;
  }
  void release_page(PageHandle page) override { checked(release_(page), "cuMemRelease"); }
  DeviceAddress reserve(std::uint64_t bytes) override {
    CUdeviceptr address = 0;
    checked(reserve_(&address, bytes, page_, 0, 0), cat("cuMemAddressReserve(", bytes, " bytes)"));
    return address;
  }
  void unreserve(DeviceAddress address, std::uint64_t bytes) override {
    checked(unreserve_(address, bytes), "cuMemAddressFree");
  }
  void map(DeviceAddress address, PageHandle page) override {
    checked(map_(address, page_, 0, page, 0), "cuMemMap");
  }
  void unmap(DeviceAddress address) override { checked(unmap_(address, page_), "cuMemUnmap"); }
  void allow_access(DeviceAddress address, std::uint64_t bytes) override {
    checked(set_access_(address, bytes, &access_, 1), "cuMemSetAccess");
  }
  StreamMark mark(StreamHandle stream) override {
    cudaEvent_t event = events_.take();
    check(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return event;
  }
  bool passed(StreamMark mark) override {
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(mark));
    if (rc == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(rc, "cudaEventQuery");
    return true;
  }
  void wait(StreamHandle stream, StreamMark mark) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(mark), 0),
          "cudaStreamWaitEvent");
  }
  void drop(StreamMark mark) noexcept override { events_.give_back(static_cast<cudaEvent_t>(mark)); }
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  void checked(CUresult rc, const std::string& call) const {
    if (rc == CUDA_SUCCESS) return;
    const char* name = "unknown";
    error_name_(rc, &name);
    throw Error(ErrorKind::kCuda, cat(call, " on device ", device_, ": ", name));
  }

  int device_;
  EventPool events_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::uint64_t page_ = 0;
  std::uint64_t device_bytes_ = 0;
  decltype(&cuGetErrorName) error_name_ = driver_call<decltype(&cuGetErrorName)>("cuGetErrorName");
  decltype(&cuMemGetAllocationGranularity) granularity_ =
      driver_call<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  decltype(&cuMemCreate) create_ = driver_call<decltype(&cuMemCreate)>("cuMemCreate");
  decltype(&cuMemRelease) release_ = driver_call<decltype(&cuMemRelease)>("cuMemRelease");
  decltype(&cuMemAddressReserve) reserve_ =
      driver_call<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  decltype(&cuMemAddressFree) unreserve_ = driver_call<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  decltype(&cuMemMap) map_ = driver_call<decltype(&cuMemMap)>("cuMemMap");
  decltype(&cuMemUnmap) unmap_ = driver_call<decltype(&cuMemUnmap)>("cuMemUnmap");
  decltype(&cuMemSetAccess) set_access_ = driver_call<decltype(&cuMemSetAccess)>("cuMemSetAccess");
};

}  // namespace

std::unique_ptr<PageDriver> make_cuda_page_driver(int device, std::uint64_t page_bytes) {
  return std::make_unique<CudaPageDriver>(device, page_bytes);
}

}  // namespace teraio::io
