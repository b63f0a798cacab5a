// Built when the CUDA toolkit is absent: the CUDA copier is reported as unavailable.
#include "teraio/core/error.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::io {

bool cuda_compiled_in() {
  return false;
}

CudaInventory cuda_inventory() {
  return {{}, "CUDA not compiled in"};
}

std::unique_ptr<DeviceCopier> make_cuda_copier(int, CopyOrder, std::size_t chunk_bytes) {
  checked_lane_chunk(chunk_bytes);  // a bad chunk is the caller's error in every build
  throw Error(ErrorKind::kUnsupported,
              "this TeraIO build has no CUDA support (configure with the CUDA toolkit present)");
}

}  // namespace teraio::io
