// A thread TeraIO names reads back under that name, cut to the kernel's 15 bytes.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>

#include "teraio/core/thread_name.hpp"

namespace teraio {
namespace {

std::string named_in_a_thread(const std::string& name) {
  std::string seen;
  std::thread([&] {
    name_this_thread(name);
    std::getline(std::ifstream("/proc/thread-self/comm"), seen);  // as a profiler reads it
  }).join();
  return seen;
}

TEST(ThreadName, ReadsBackAndIsCutToFifteenBytes) {
#if defined(__linux__)
  EXPECT_EQ(named_in_a_thread("teraio-io"), "teraio-io");
  EXPECT_EQ(named_in_a_thread("teraio-watch-to-device"), "teraio-watch-to");
#else
  GTEST_SKIP() << "thread names are read from /proc";
#endif
}

}  // namespace
}  // namespace teraio
