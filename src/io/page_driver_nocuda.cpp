// A build without CUDA has no device pages to map.
#include "teraio/core/error.hpp"
#include "teraio/io/paged_device_memory.hpp"

namespace teraio::io {

std::unique_ptr<PageDriver> make_cuda_page_driver(int /*device*/, std::uint64_t /*page_bytes*/) {
  throw Error(ErrorKind::kUnsupported, "the paged allocator needs CUDA, and this build of TeraIO has none");
}

}  // namespace teraio::io
