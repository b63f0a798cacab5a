// io/numa: where the pinned host tier lives on a machine with several NUMA nodes. A copy
// between the GPU and pages on the other socket crosses the inter-socket link as well as PCIe,
// and pages pinned from a background thread land wherever that thread ran (first touch), so
// one run's link can be slower than the next's. The host tier prefers the GPU's node and reports
// where a sample of its pages actually are.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace teraio::io {

// The NUMA node of a PCI device ("0000:1b:00.0", any case) from sysfs; nullopt where the
// kernel does not know it (-1) or the device is not listed.
std::optional<int> pci_device_numa_node(const std::string& bus_id, const std::filesystem::path& sys = "/sys");

// How many NUMA nodes are online ("0-1,3" counts 3); 1 where sysfs does not say.
int online_numa_nodes(const std::filesystem::path& sys = "/sys");

// Asks the kernel to take the pages of [addr, addr + bytes) from `node` when they are first
// touched (mbind, MPOL_PREFERRED: other nodes when that one is full). Returns the errno text on
// failure (containers may refuse mbind without CAP_SYS_NICE), empty on success.
std::string prefer_numa_node(void* addr, std::size_t bytes, int node);

// The nodes of `samples` pages spread evenly over [addr, addr + bytes), moving none
// (move_pages without targets); -1 for a page not faulted in. nullopt where the kernel refuses
// the query (containers may, without CAP_SYS_NICE), with its errno text in *why.
std::optional<std::vector<int>> sample_page_nodes(const void* addr, std::size_t bytes, std::size_t samples,
                                                  std::string* why = nullptr);

// Whether the calling thread runs under a memory policy of its own (numactl --membind,
// --interleave, ...): the host tier then leaves its pages to it.
bool process_sets_memory_policy();

// What a pinned region's placement was and where its pages are: one line for the report.
struct NumaPlacement {
  std::optional<int> preferred;  // the node asked for; nullopt: none asked
  std::string why;               // why that node, or why none
  std::string describe(const void* addr, std::size_t bytes) const;
};

// The placement for pinned memory that a device at `device_node` copies to and from: prefer its
// node where the machine has more than one.
NumaPlacement place_near(void* addr, std::size_t bytes, std::optional<int> device_node,
                         const std::filesystem::path& sys = "/sys");

}  // namespace teraio::io
