// Feeds arbitrary bytes to the safetensors header parser as a whole file. A teraio::Error
// (other than kInternal) is the expected answer to bad input; a crash, a sanitizer report or
// any other exception is a bug. An accepted header must also be self-consistent: tensors in
// offset order, covering the data region exactly, each as long as its shape and dtype say.
#include <cstddef>
#include <cstdint>
#include <span>

#include "teraio/core/error.hpp"
#include "teraio/safetensors/header.hpp"

namespace {

void check_accepted(const teraio::safetensors::Header& header, std::size_t file_size) {
  using namespace teraio::safetensors;
  TERAIO_ASSERT(header.data_offset == 8 + header.header_bytes);
  TERAIO_ASSERT(header.data_offset + header.data_bytes == file_size);
  std::uint64_t expected = 0;
  for (const TensorInfo& t : header.tensors) {
    TERAIO_ASSERT(t.begin == expected);
    TERAIO_ASSERT(tensor_bytes(t.dtype, t.shape) == t.end - t.begin);
    TERAIO_ASSERT(header.find(t.name) == &t);
    expected = t.end;
  }
  TERAIO_ASSERT(expected == header.data_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_accepted(teraio::safetensors::parse_header(bytes, "fuzz-input", size), size);
  } catch (const teraio::Error& e) {
    if (e.kind() == teraio::ErrorKind::kInternal) throw;
  }
  return 0;
}
