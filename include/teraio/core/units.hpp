// core/units: byte sizes, bandwidths and durations as users write them ("24GiB", "1.5GB/s",
// "12ms") and as TeraIO prints them. Parsing is strict: a malformed size is an Error, never 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace teraio {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;
inline constexpr std::uint64_t kTiB = 1024 * kGiB;
// Alignment of O_DIRECT transfers and of every extent TeraIO allocates on a tier.
inline constexpr std::uint64_t kPageSize = 4096;

constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr std::uint64_t align_down(std::uint64_t value, std::uint64_t alignment) {
  return value / alignment * alignment;
}
constexpr bool is_aligned(std::uint64_t value, std::uint64_t alignment) {
  return value % alignment == 0;
}

// "4096", "4k", "4KiB", "1.5GiB", "2GB" (decimal), "0". Binary units for K/M/G/T and KiB..;
// decimal for KB/MB/GB/TB. Throws Error{kInvalidArgument} naming the text on bad input.
std::uint64_t parse_bytes(std::string_view text);
// Bytes per second from "55GB/s", "1.4 GB/s", "800MiB/s" or a plain number.
double parse_bandwidth(std::string_view text);
// Seconds from "12ms", "3.5us", "2s", "100ns" or a plain number of seconds.
double parse_duration(std::string_view text);

// "24.0 GiB", "512 B": binary units, one decimal.
std::string format_bytes(std::uint64_t bytes);
// "1.87 GB/s": decimal units, as disk and PCIe bandwidths are usually quoted.
std::string format_bandwidth(double bytes_per_second);
// "412 us", "3.20 ms", "1.250 s".
std::string format_duration(double seconds);

}  // namespace teraio
