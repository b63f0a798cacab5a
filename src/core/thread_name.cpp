#include "teraio/core/thread_name.hpp"

#include <pthread.h>

#include <array>

namespace teraio {

namespace {
constexpr std::size_t kLimit = 15;  // Linux: 16 bytes with the terminating zero
}  // namespace

void name_this_thread(std::string_view name) {
#if defined(__linux__)
  const std::string cut(name.substr(0, kLimit));
  pthread_setname_np(pthread_self(), cut.c_str());
#else
  static_cast<void>(name);
#endif
}

std::string this_thread_name() {
#if defined(__linux__)
  std::array<char, kLimit + 1> buffer{};
  if (pthread_getname_np(pthread_self(), buffer.data(), buffer.size()) == 0) return buffer.data();
#endif
  return {};
}

}  // namespace teraio
