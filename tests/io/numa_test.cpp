#include "teraio/io/numa.hpp"

#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "teraio/core/units.hpp"
#include "teraio/io/host_tier.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {
namespace {

namespace fs = std::filesystem;

// A sysfs of our own: the node list and one PCI device's node.
class FakeSys {
 public:
  explicit FakeSys(const std::string& online, const std::string& device_node = "") {
    root_ = fs::temp_directory_path() / ("teraio-sys-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    fs::create_directories(root_ / "devices/system/node");
    std::ofstream(root_ / "devices/system/node/online") << online << "\n";
    if (!device_node.empty()) {
      fs::create_directories(root_ / "bus/pci/devices/0000:1b:00.0");
      std::ofstream(root_ / "bus/pci/devices/0000:1b:00.0/numa_node") << device_node << "\n";
    }
  }
  ~FakeSys() { fs::remove_all(root_); }
  const fs::path& path() const { return root_; }

 private:
  fs::path root_;
};

// An anonymous mapping that nothing has touched yet, as PinnedRegion makes.
class Mapping {
 public:
  explicit Mapping(std::size_t bytes) : bytes_(bytes) {
    data_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  ~Mapping() { munmap(data_, bytes_); }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;
};

TEST(Numa, OnlineNodesAreCountedFromTheirRanges) {
  EXPECT_EQ(online_numa_nodes(FakeSys("0").path()), 1);
  EXPECT_EQ(online_numa_nodes(FakeSys("0-1").path()), 2);
  EXPECT_EQ(online_numa_nodes(FakeSys("0-1,3,6-7").path()), 5);
  EXPECT_EQ(online_numa_nodes(fs::path("/nonexistent-sys")), 1);
}

TEST(Numa, APciDeviceNodeIsReadInAnyCaseAndMinusOneIsUnknown) {
  EXPECT_EQ(pci_device_numa_node("0000:1B:00.0", FakeSys("0-1", "1").path()), 1);
  EXPECT_EQ(pci_device_numa_node("0000:1b:00.0", FakeSys("0-1", "-1").path()), std::nullopt);
  EXPECT_EQ(pci_device_numa_node("0000:2c:00.0", FakeSys("0-1", "1").path()), std::nullopt);
}

TEST(Numa, OneNodeAsksForNothing) {
  Mapping m(16 * kPageSize);
  const NumaPlacement placement = place_near(m.data(), m.bytes(), 0, FakeSys("0").path());
  EXPECT_EQ(placement.preferred, std::nullopt);
  EXPECT_EQ(placement.why, "one node");
}

TEST(Numa, SeveralNodesWithoutTheDevicesNodeAreSaidSo) {
  Mapping m(16 * kPageSize);
  const NumaPlacement placement = place_near(m.data(), m.bytes(), std::nullopt, FakeSys("0-1").path());
  EXPECT_EQ(placement.preferred, std::nullopt);
  EXPECT_NE(placement.why.find("2 nodes, the device's unknown"), std::string::npos) << placement.why;
}

// The kernel's own mask of nodes, as mbind and get_mempolicy take it (nodes 0-1023).
using NodeMask = std::array<unsigned long, 16>;
constexpr std::size_t kLongBits = sizeof(unsigned long) * CHAR_BIT;
constexpr unsigned long kMaskNodes = 16 * kLongBits;

NodeMask mask_of(int node) {
  NodeMask mask{};
  mask[static_cast<std::size_t>(node) / kLongBits] = 1ul << (static_cast<std::size_t>(node) % kLongBits);
  return mask;
}

// The first node this process may take memory from (a container may leave node 0 out).
std::optional<int> first_allowed_node() {
  NodeMask allowed{};
  if (syscall(SYS_get_mempolicy, nullptr, allowed.data(), kMaskNodes + 1, nullptr, MPOL_F_MEMS_ALLOWED) != 0)
    return std::nullopt;
  for (unsigned long node = 0; node < kMaskNodes; ++node) {
    if (allowed[node / kLongBits] >> (node % kLongBits) & 1ul) return static_cast<int>(node);
  }
  return std::nullopt;
}

bool refused_by_the_sandbox(const std::string& why) {
  return why.find("Operation not permitted") != std::string::npos ||
         why.find("Function not implemented") != std::string::npos;
}

TEST(Numa, TheDevicesNodeIsPreferredAndThePagesLandThere) {
  const std::optional<int> node = first_allowed_node();
  ASSERT_TRUE(node) << "get_mempolicy(MPOL_F_MEMS_ALLOWED) failed: " << std::strerror(errno);
  // The fake sysfs says there are two nodes so that the device's is asked for.
  Mapping m(64 * kPageSize);
  const NumaPlacement placement = place_near(m.data(), m.bytes(), *node, FakeSys("0-1").path());
  if (!placement.preferred && refused_by_the_sandbox(placement.why)) GTEST_SKIP() << placement.why;
  ASSERT_EQ(placement.preferred, node) << placement.why;
  // The range's policy is exactly "prefer that node": not bound to it (a full node must not
  // fail the pinning), and not a neighbour (the mask's bit).
  int mode = -1;
  NodeMask mask{};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask.data(), kMaskNodes + 1, m.data(), MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_PREFERRED);
  EXPECT_EQ(mask, mask_of(*node));
  std::string refused;
  if (!sample_page_nodes(m.data(), m.bytes(), 64, &refused)) GTEST_SKIP() << refused;
  EXPECT_NE(placement.describe(m.data(), m.bytes()).find("64 not placed"), std::string::npos)
      << "nothing is touched yet: " << placement.describe(m.data(), m.bytes());
  std::memset(m.data(), 1, m.bytes());
  EXPECT_EQ(placement.describe(m.data(), m.bytes()),
            "NUMA node " + std::to_string(*node) +
                " preferred (the device's, of 2); 64 pages sampled: 64 on node " + std::to_string(*node));
}

TEST(Numa, AMemoryPolicyOfTheProcessIsLeftAlone) {
  // numactl --preferred=N, as it were: the thread's own policy outranks the device's node.
  const std::optional<int> node = first_allowed_node();
  ASSERT_TRUE(node);
  const NodeMask mask = mask_of(*node);
  if (syscall(SYS_set_mempolicy, MPOL_PREFERRED, mask.data(), kMaskNodes + 1) != 0)
    GTEST_SKIP() << "set_mempolicy: " << std::strerror(errno);
  Mapping m(16 * kPageSize);
  const NumaPlacement placement = place_near(m.data(), m.bytes(), *node, FakeSys("0-1").path());
  EXPECT_EQ(syscall(SYS_set_mempolicy, MPOL_DEFAULT, nullptr, 0), 0);
  EXPECT_EQ(placement.preferred, std::nullopt);
  EXPECT_EQ(placement.why, "2 nodes: left to the process's memory policy");
}

TEST(Numa, ANodeTheKernelDoesNotHaveIsRefusedAndReported) {
  Mapping m(16 * kPageSize);
  const NumaPlacement placement = place_near(m.data(), m.bytes(), 1000, FakeSys("0-1").path());
  EXPECT_EQ(placement.preferred, std::nullopt);
  EXPECT_NE(placement.why.find("node 1000 refused (mbind: "), std::string::npos) << placement.why;
  EXPECT_EQ(prefer_numa_node(m.data(), m.bytes(), -1), "node -1 out of range");
}

TEST(Numa, SampledPagesSpanTheWholeRange) {
  Mapping m(100 * kPageSize);
  static_cast<char*>(m.data())[99 * kPageSize] = 1;  // only the last page
  std::string refused;
  const std::optional<std::vector<int>> sampled = sample_page_nodes(m.data(), m.bytes(), 10, &refused);
  if (!sampled) GTEST_SKIP() << refused;
  const std::vector<int>& nodes = *sampled;
  ASSERT_EQ(nodes.size(), 10u);
  EXPECT_EQ(nodes.front(), -1);
  EXPECT_GE(nodes.back(), 0);
  EXPECT_EQ(sample_page_nodes(m.data(), kPageSize / 2, 4)->size(), 0u);
}

TEST(Numa, TheHostTierReportsWhereItsPagesAre) {
  auto copier = make_host_copier();
  HostTier tier(*copier, 8 * kPageSize, false);
  // This machine's own sysfs: one node on the CPU machines, and the host copier has no device.
  const std::string numa = tier.numa();
  EXPECT_EQ(numa.rfind("NUMA: ", 0), 0u) << numa;
  EXPECT_TRUE(numa.find("pages sampled") != std::string::npos ||
              numa.find("page nodes unknown") != std::string::npos)
      << numa;
  EXPECT_EQ(HostTier(*copier, 0, false).numa(), "");
}

}  // namespace
}  // namespace teraio::io
