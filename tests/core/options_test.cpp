#include "teraio/core/options.hpp"

#include <gtest/gtest.h>

#include "teraio/core/error.hpp"

namespace teraio {
namespace {

Options make() {
  Options o("iobench", "measures things");
  o.add("volume", "bytes to move", "1GiB");
  o.add("paths", "comma-separated paths", "");
  o.add("threads", "worker threads", "4");
  o.add_flag("verbose", "say more");
  o.add_positional("TRACE", "trace file");
  return o;
}

TEST(Options, ParsesValuesFlagsAndPositionals) {
  Options o = make();
  ASSERT_TRUE(
      o.parse({"t.json", "--volume=2GiB", "--threads", "8", "--verbose", "--paths", "a, b", "extra"}));
  EXPECT_EQ(o.bytes("volume"), 2 * (1ull << 30));
  EXPECT_EQ(o.integer("threads"), 8);
  EXPECT_TRUE(o.flag("verbose"));
  EXPECT_EQ(o.list("paths"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.positional("TRACE"), "t.json");
  EXPECT_EQ(o.rest(), (std::vector<std::string>{"extra"}));
}

TEST(Options, UsesDefaults) {
  Options o = make();
  ASSERT_TRUE(o.parse({"t.json"}));
  EXPECT_EQ(o.bytes("volume"), 1ull << 30);
  EXPECT_FALSE(o.flag("verbose"));
  EXPECT_TRUE(o.list("paths").empty());
}

TEST(Options, RejectsUnknownMissingAndMalformed) {
  EXPECT_THROW(make().parse({"t.json", "--nope", "1"}), Error);
  EXPECT_THROW(make().parse({"t.json", "--threads"}), Error);
  EXPECT_THROW(make().parse({}), Error);  // TRACE is required
  Options o = make();
  ASSERT_TRUE(o.parse({"t.json", "--threads", "eight"}));
  EXPECT_THROW(o.integer("threads"), Error);
}

TEST(Options, HelpListsEverything) {
  Options o = make();
  EXPECT_FALSE(o.parse({"--help"}));
  const std::string help = o.help();
  for (const char* word : {"--volume", "--threads", "--verbose", "TRACE", "default: 1GiB"})
    EXPECT_NE(help.find(word), std::string::npos) << word;
}

}  // namespace
}  // namespace teraio
