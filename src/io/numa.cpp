#include "teraio/io/numa.hpp"

#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::io {

namespace {
// Nodes 0-1023: more than any machine TeraIO runs on has.
constexpr std::size_t kMaskLongs = 16;
constexpr std::size_t kMaskBits = kMaskLongs * sizeof(unsigned long) * CHAR_BIT;

std::optional<std::string> read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}
}  // namespace

std::optional<int> pci_device_numa_node(const std::string& bus_id, const std::filesystem::path& sys) {
  std::string id = bus_id;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto line = read_line(sys / "bus" / "pci" / "devices" / id / "numa_node");
  if (!line) return std::nullopt;
  try {
    const int node = std::stoi(*line);
    return node >= 0 ? std::optional<int>(node) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int online_numa_nodes(const std::filesystem::path& sys) {
  const auto line = read_line(sys / "devices" / "system" / "node" / "online");
  if (!line || line->empty()) return 1;
  int count = 0;
  std::stringstream ranges(*line);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    const auto dash = range.find('-');
    try {
      count += dash == std::string::npos
                   ? 1
                   : std::stoi(range.substr(dash + 1)) - std::stoi(range.substr(0, dash)) + 1;
    } catch (const std::exception&) {
      return 1;
    }
  }
  return std::max(count, 1);
}

std::string prefer_numa_node(void* addr, std::size_t bytes, int node) {
  if (node < 0 || static_cast<std::size_t>(node) >= kMaskBits) return cat("node ", node, " out of range");
  std::array<unsigned long, kMaskLongs> mask{};
  const std::size_t bits = sizeof(unsigned long) * CHAR_BIT;
  mask[static_cast<std::size_t>(node) / bits] = 1ul << (static_cast<std::size_t>(node) % bits);
  // maxnode counts one more than the mask's bits: the kernel reads maxnode - 1 of them.
  if (syscall(SYS_mbind, addr, bytes, MPOL_PREFERRED, mask.data(), kMaskBits + 1, 0) != 0) {
    return cat("mbind: ", std::strerror(errno));
  }
  return {};
}

std::optional<std::vector<int>> sample_page_nodes(const void* addr, std::size_t bytes, std::size_t samples,
                                                  std::string* why) {
  const std::size_t pages = bytes / kPageSize;
  samples = std::min(samples, pages);
  std::vector<void*> where(samples);
  for (std::size_t i = 0; i < samples; ++i) {
    const std::size_t page = samples == 1 ? 0 : i * (pages - 1) / (samples - 1);
    where[i] = const_cast<std::byte*>(static_cast<const std::byte*>(addr) + page * kPageSize);
  }
  std::vector<int> nodes(samples, -1);
  if (samples > 0 && syscall(SYS_move_pages, 0, samples, where.data(), nullptr, nodes.data(), 0) != 0) {
    if (why != nullptr) *why = cat("move_pages: ", std::strerror(errno));
    return std::nullopt;
  }
  // A page not faulted in reports -ENOENT, one that cannot be queried another -errno.
  for (int& node : nodes) node = std::max(node, -1);
  return nodes;
}

bool process_sets_memory_policy() {
  int mode = MPOL_DEFAULT;
  return syscall(SYS_get_mempolicy, &mode, nullptr, 0, nullptr, 0) == 0 && mode != MPOL_DEFAULT;
}

std::string NumaPlacement::describe(const void* addr, std::size_t bytes) const {
  std::string text = preferred ? cat("NUMA node ", *preferred, " preferred (", why, ")") : cat("NUMA: ", why);
  std::string refused;
  const std::optional<std::vector<int>> sampled = sample_page_nodes(addr, bytes, 64, &refused);
  if (!sampled) return cat(text, "; page nodes unknown (", refused, ")");
  const std::vector<int>& nodes = *sampled;
  if (nodes.empty()) return text;
  std::map<int, std::size_t> count;
  for (const int node : nodes) ++count[node];
  std::string spread;
  for (const auto& [node, n] : count) {
    spread += cat(spread.empty() ? "" : ", ", n, node < 0 ? " not placed" : cat(" on node ", node));
  }
  return cat(text, "; ", nodes.size(), " pages sampled: ", spread);
}

NumaPlacement place_near(void* addr, std::size_t bytes, std::optional<int> device_node,
                         const std::filesystem::path& sys) {
  const int nodes = online_numa_nodes(sys);
  if (nodes <= 1) return {std::nullopt, "one node"};
  if (!device_node) return {std::nullopt, cat(nodes, " nodes, the device's unknown: left to first touch")};
  // A policy the user chose (numactl) outranks ours: a range's own policy would override it.
  if (process_sets_memory_policy())
    return {std::nullopt, cat(nodes, " nodes: left to the process's memory policy")};
  if (const std::string refused = prefer_numa_node(addr, bytes, *device_node); !refused.empty()) {
    return {std::nullopt, cat(nodes, " nodes; the device's node ", *device_node, " refused (", refused,
                              "): left to first touch")};
  }
  return {*device_node, cat("the device's, of ", nodes)};
}

}  // namespace teraio::io
