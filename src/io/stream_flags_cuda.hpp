// io/stream_flags_cuda: words in device memory that a stream can wait on before the work that
// sets them is queued (CUDA's stream memory operations, cuStreamWaitValue32 and
// cuStreamWriteValue32). An event cannot serve there: a stream waits for an event's latest
// record, so the record must be queued first. The lane to the device in
// CopyOrder::kDeadlineDeviceWaitsIn lets the compute stream wait so for a copy whose compute
// marker the GPU has not passed, which its dispatcher queues once it has, and the host goes on.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace teraio::io::cuda_detail {

class StreamFlags {
 public:
  static constexpr std::size_t kCount = 4096;  // flags in use at once: copies awaited, not yet done

  // Throws Error{kUnsupported} where the driver or the device lacks the stream memory operations.
  explicit StreamFlags(int device);
  ~StreamFlags();
  StreamFlags(const StreamFlags&) = delete;
  StreamFlags& operator=(const StreamFlags&) = delete;

  struct Flag {
    std::uint32_t index = 0;
    std::uint32_t value = 0;  // what setting it writes: above any value written there before
  };
  // A flag not in use; none when all kCount are.
  std::optional<Flag> take();
  // Once its setting has run on the device (the flag's words only grow, so that a stream still
  // to reach a wait for an older value passes it).
  void give_back(const Flag& flag);
  // The work queued on `stream` after this call waits until the flag holds its value or more.
  void wait(cudaStream_t stream, const Flag& flag) const;
  // Writes the flag's value behind the work queued so far on `stream` (with a memory fence:
  // the bytes copied before it are visible to whatever the wait lets run).
  void set(cudaStream_t stream, const Flag& flag) const;

 private:
  // One wait on a new stream, drained: throws Error{kUnsupported} where the device cannot.
  void probe() const;
  CUdeviceptr address(const Flag& flag) const {
    return words_ + CUdeviceptr{flag.index} * sizeof(std::uint32_t);
  }

  int device_;
  decltype(&cuStreamWaitValue32) wait_value_;
  decltype(&cuStreamWriteValue32) write_value_;
  CUdeviceptr words_ = 0;
  std::vector<std::uint32_t> last_;  // the last value handed out for each flag
  std::deque<std::uint32_t> free_;   // oldest given back first: the flags take turns
};

}  // namespace teraio::io::cuda_detail
