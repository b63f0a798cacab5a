#include "teraio/core/error.hpp"

#include <gtest/gtest.h>

#include "teraio/core/log.hpp"

namespace teraio {
namespace {

TEST(Error, SystemErrorsCarryErrnoAndKind) {
  try {
    throw_system_error("pwrite /mnt/x offset 4096 size 8192", ENOSPC);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNoSpace);
    EXPECT_EQ(e.sys_errno(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("/mnt/x offset 4096"), std::string::npos);
  }
  try {
    throw_system_error("pread", EIO);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
}

TEST(Error, AssertNamesTheLocation) {
  try {
    TERAIO_ASSERT(1 + 1 == 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("error_test.cpp"), std::string::npos);
  }
}

TEST(Log, RoutesThroughTheSinkAndFiltersByLevel) {
  std::vector<std::string> seen;
  log::set_sink([&](log::Level, std::string_view m) { seen.emplace_back(m); });
  const log::Level saved = log::level();
  log::set_level(log::Level::kWarn);
  log::warn("disk ", 3, " slow");
  log::debug("hidden");
  log::set_level(saved);
  log::set_sink({});
  EXPECT_EQ(seen, (std::vector<std::string>{"disk 3 slow"}));
  EXPECT_EQ(log::parse_level("DEBUG"), log::Level::kDebug);
  EXPECT_THROW(log::parse_level("loud"), Error);
}

}  // namespace
}  // namespace teraio
