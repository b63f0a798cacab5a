// Streaming XXH3-64 over the bytes of an extent, fed chunk by chunk in logical order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace teraio::io {

class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t*, kept out of the header so xxhash.h stays private
};

}  // namespace teraio::io
