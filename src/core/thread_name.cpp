#include "teraio/core/thread_name.hpp"

#include <pthread.h>

#include <string>

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

}  // namespace teraio
