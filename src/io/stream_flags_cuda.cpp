#include "stream_flags_cuda.hpp"

#include <numeric>

#include "cuda_support.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io::cuda_detail {
namespace {

// The stream memory operations' signatures have not changed since CUDA 12.0 (the _v2 calls).
constexpr unsigned int kDriverAbi = 12000;
constexpr const char* kNeededBy = "the deadline-device-waits-in copy order";

void checked(CUresult rc, const char* call) {
  if (rc != CUDA_SUCCESS)
    throw Error(ErrorKind::kCuda, cat(call, " failed: CUresult ", static_cast<int>(rc)));
}

}  // namespace

StreamFlags::StreamFlags(int device)
    : device_(device),
      wait_value_(
          driver_entry_point<decltype(&cuStreamWaitValue32)>("cuStreamWaitValue32", kDriverAbi, kNeededBy)),
      write_value_(
          driver_entry_point<decltype(&cuStreamWriteValue32)>("cuStreamWriteValue32", kDriverAbi, kNeededBy)),
      last_(kCount, 0),
      free_(kCount) {
  check(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
  void* words = nullptr;
  check(cudaMalloc(&words, kCount * sizeof(std::uint32_t)), "cudaMalloc(stream flags)");
  words_ = reinterpret_cast<CUdeviceptr>(words);
  try {
    // Zero before any stream may wait or write there: the lanes' and PyTorch's streams do not
    // wait for the default stream's memset.
    check(cudaMemsetAsync(words, 0, kCount * sizeof(std::uint32_t), nullptr),
          "cudaMemsetAsync(stream flags)");
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize(stream flags zeroed)");
    probe();
  } catch (...) {
    cudaFree(words);  // the destructor does not run for a constructor that throws
    throw;
  }
  std::iota(free_.begin(), free_.end(), std::uint32_t{0});
}

void StreamFlags::probe() const {
  // A driver may have the calls and the device not the operations: said here, as the copier is
  // made, rather than at the first wait inside a training step. Flag 0 holds 0 until its first
  // setting writes 1, so a wait for 0 passes.
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags(stream flags probe)");
  const Flag zero{0, 0};
  try {
    try {
      wait(stream, zero);
    } catch (const Error& e) {
      throw Error(ErrorKind::kUnsupported, cat("this device cannot wait on a stream flag (", e.what(),
                                               "), which the deadline-device-waits-in copy order needs"));
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(stream flags probe)");
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  warn_if_failed(cudaStreamDestroy(stream), "cudaStreamDestroy(stream flags probe)");
}

StreamFlags::~StreamFlags() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  warn_if_failed(cudaFree(reinterpret_cast<void*>(words_)), "cudaFree(stream flags)");
}

std::optional<StreamFlags::Flag> StreamFlags::take() {
  if (free_.empty()) return std::nullopt;
  const std::uint32_t index = free_.front();
  free_.pop_front();
  // The wait's "greater or equal" is cyclic ((int32_t)(word - value) >= 0): a value that wraps
  // past 2^32 still compares right.
  return Flag{index, ++last_[index]};
}

void StreamFlags::give_back(const Flag& flag) {
  free_.push_back(flag.index);
}

void StreamFlags::wait(cudaStream_t stream, const Flag& flag) const {
  checked(
      wait_value_(reinterpret_cast<CUstream>(stream), address(flag), flag.value, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue32");
}

void StreamFlags::set(cudaStream_t stream, const Flag& flag) const {
  checked(write_value_(reinterpret_cast<CUstream>(stream), address(flag), flag.value,
                       CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32");
}

}  // namespace teraio::io::cuda_detail
