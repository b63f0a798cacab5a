#include "iobench_config.hpp"

#include <algorithm>

#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::cli {
namespace {

unsigned positive(const Options& options, const std::string& name) {
  const std::int64_t value = options.integer(name);
  if (value < 1 || value > 4096) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("iobench: --", name, " must be between 1 and 4096, got ", value));
  }
  return static_cast<unsigned>(value);
}

std::uint64_t page_multiple(const Options& options, const std::string& name) {
  const std::uint64_t value = options.bytes(name);
  if (value == 0 || !is_aligned(value, kPageSize)) {
    throw Error(ErrorKind::kInvalidArgument,
                cat("iobench: --", name, " must be a positive multiple of 4 KiB, got ", options.str(name)));
  }
  return value;
}

}  // namespace

std::optional<IobenchConfig> parse_iobench_args(const std::vector<std::string>& args, std::string& help) {
  Options options(
      "iobench",
      "sequential write and read through each storage backend and the host tier, beside a raw "
      "O_DIRECT reference (dd, and fio when installed) measured in the same run on the same paths");
  options.add("paths", "comma-separated storage directories (default: a fresh temp directory, removed after)",
              "");
  options.add("volume", "bytes written and read per mode", "1GiB");
  options.add("threads", "POSIX backend threads per path", "4");
  options.add("queue-depth", "io_uring queue depth per path", "32");
  options.add("stripe-unit", "stripe unit across paths (multiple of 4 KiB)", "4MiB");
  options.add("chunk", "bytes per transfer submitted to the tier store (a tensor)", "64MiB");
  options.add("request-size", "bytes per disk request and bounce buffer (multiple of 4 KiB)", "4MiB");
  options.add("transfers", "transfers the tier store carries out at once", "4");
  options.add("device", "memory the data comes from: host, or cuda (GPU 0: bounce path and host tier)",
              "host");
  options.add("backends", "SSD backends to measure, comma-separated: io_uring, posix", "io_uring,posix");
  options.add("repeat", "timed passes per mode (the median is reported)", "1");
  options.add_flag("no-raw", "skip the raw dd/fio reference");
  options.add_flag("no-host-tier", "skip the host tier and the raw device copy");
  options.add_flag("no-warmup",
                   "skip the untimed first write that turns preallocated extents into written ones");
  options.add_flag("keep-files", "leave the data files in the temp directory (always left in --paths)");
  options.add("json", "also write the results as JSON to this file", "");
  if (!options.parse(args)) {
    help = options.help();
    return std::nullopt;
  }
  IobenchConfig c;
  c.paths = options.list("paths");
  c.volume = page_multiple(options, "volume");
  c.threads = positive(options, "threads");
  c.queue_depth = positive(options, "queue-depth");
  c.stripe_unit = page_multiple(options, "stripe-unit");
  c.chunk = page_multiple(options, "chunk");
  c.request_size = page_multiple(options, "request-size");
  c.transfers_in_flight = positive(options, "transfers");
  const std::string device = to_lower(options.str("device"));
  if (device != "host" && device != "cuda") {
    throw Error(ErrorKind::kInvalidArgument,
                cat("iobench: --device must be host or cuda, got '", device, "'"));
  }
  c.cuda = device == "cuda";
  c.backends = options.list("backends");
  for (auto& b : c.backends) {
    b = to_lower(b);
    if (b == "uring") b = "io_uring";
    if (b != "io_uring" && b != "posix") {
      throw Error(ErrorKind::kInvalidArgument, cat("iobench: unknown backend '", b, "' (io_uring, posix)"));
    }
  }
  c.repeat = positive(options, "repeat");
  c.raw_reference = !options.flag("no-raw");
  c.host_tier = !options.flag("no-host-tier");
  c.warmup = !options.flag("no-warmup");
  c.keep_files = options.flag("keep-files");
  c.json_path = options.str("json");
  if (c.chunk > c.volume) c.chunk = c.volume;
  if (c.request_size > c.chunk) {
    throw Error(ErrorKind::kInvalidArgument, cat("iobench: --request-size (", format_bytes(c.request_size),
                                                 ") exceeds --chunk (", format_bytes(c.chunk), ")"));
  }
  return c;
}

}  // namespace teraio::cli
