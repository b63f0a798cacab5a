#include "checksum.hpp"

#include <xxhash.h>

#include "teraio/core/error.hpp"

namespace teraio::io {

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::update(const void* data, std::size_t n) {
  if (n > 0) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

std::uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace teraio::io
