// `teraio paged-replay FILE`: the requests a paged allocator recorded on the GPU
// (train_llm.py --paged-record, io/paged_recording) served again here by the same allocator on a
// driver that only counts (io/paged_replay), step by step: how many pages it maps, blocks it
// reuses, grows and takes apart, beside what the allocator counted in the same step. With
// `--page` or `--cap` other than the recording's, what another page size or cap would have done
// with the same requests; `--lag` holds freed blocks back from other streams as a device behind
// the host does; `--range-lengths` sets how long a new block's address range is.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/paged_recording.hpp"
#include "teraio/io/paged_replay.hpp"

namespace teraio::cli {
namespace {

using Count = unsigned long long;

nlohmann::ordered_json step_json(const io::PagedReplayStep& step, std::uint64_t page) {
  const io::PagedMemoryStats& c = step.counts;
  nlohmann::ordered_json out = {{"allocations", c.allocations},
                                {"small_allocations", c.small_allocations},
                                {"reused", c.reused},
                                {"split_blocks", c.split_blocks},
                                {"joined_blocks", c.joined_blocks},
                                {"grown_blocks", c.grown_blocks},
                                {"mapped_blocks", c.mapped_blocks},
                                {"taken_blocks", c.taken_blocks},
                                {"pages_mapped", c.pages_mapped},
                                {"pages_unmapped", c.pages_unmapped},
                                {"bytes_mapped", c.pages_mapped * page},
                                {"device_waits", c.device_waits},
                                {"held_bytes_at_end", c.held_bytes},
                                {"peak_held_bytes_so_far", c.peak_held_bytes},
                                {"refused", step.refused},
                                {"recorded", nullptr}};
  if (const auto& r = step.recorded)
    out["recorded"] = {{"pages_mapped", r->pages_mapped}, {"reused", r->reused},
                       {"grown_blocks", r->grown_blocks}, {"mapped_blocks", r->mapped_blocks},
                       {"taken_blocks", r->taken_blocks}, {"device_waits", r->device_waits}};
  return out;
}

void print_table(const io::PagedRecording& recording, const std::vector<io::PagedReplayStep>& steps,
                 const io::PagedReplayOptions& ran) {
  std::printf("%zu requests, %zu steps; pages of %s, cap %s, lag %llu requests, ranges %llu blocks long\n\n",
              recording.requests().size(), steps.size(), format_bytes(ran.page_bytes).c_str(),
              format_bytes(ran.cap_bytes).c_str(), static_cast<Count>(ran.lag),
              static_cast<Count>(ran.range_lengths));
  const std::uint64_t page = ran.page_bytes;
  std::printf("%4s %11s %9s %7s %7s %6s %6s %6s %8s %11s %6s %7s\n", "step", "allocations", "reused", "split",
              "joined", "grown", "mapped", "taken", "pages", "bytes", "waits", "refused");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const io::PagedMemoryStats& c = steps[i].counts;
    std::printf("%4zu %11llu %9llu %7llu %7llu %6llu %6llu %6llu %8llu %11s %6llu %7llu\n", i + 1,
                static_cast<Count>(c.allocations), static_cast<Count>(c.reused),
                static_cast<Count>(c.split_blocks), static_cast<Count>(c.joined_blocks),
                static_cast<Count>(c.grown_blocks), static_cast<Count>(c.mapped_blocks),
                static_cast<Count>(c.taken_blocks), static_cast<Count>(c.pages_mapped),
                format_bytes(c.pages_mapped * page).c_str(), static_cast<Count>(c.device_waits),
                static_cast<Count>(steps[i].refused));
    if (const auto& r = steps[i].recorded)
      std::printf("%4s %11s %9llu %7s %7s %6llu %6llu %6llu %8llu %11s %6llu\n", "rec", "",
                  static_cast<Count>(r->reused), "", "", static_cast<Count>(r->grown_blocks),
                  static_cast<Count>(r->mapped_blocks), static_cast<Count>(r->taken_blocks),
                  static_cast<Count>(r->pages_mapped),
                  format_bytes(r->pages_mapped * recording.page_bytes()).c_str(),
                  static_cast<Count>(r->device_waits));
  }
  std::printf(
      "\n(grown: freed blocks grown in place; mapped: blocks mapped at a new address; taken: freed blocks "
      "whose "
      "pages another block took; pages: mapped in the step; rec: what the allocator counted in the same step "
      "on "
      "the GPU, at the recording's page and cap. Step 1 warms the replay's own cache.)\n");
}

int run_paged_replay(const std::vector<std::string>& args) {
  Options opts("paged-replay",
               "serve a paged allocator's recorded requests again on a counting driver, step by step");
  opts.add_positional("FILE",
                      "requests recorded by train_llm.py --paged-record (teraio.paged.start_recording)");
  opts.add("page", "page size to replay with (default: the recording's)", "0");
  opts.add("cap", "the most bytes of pages held (default: the recording's cap)", "0");
  opts.add("lag", "requests after its free before a block counts as done on its streams", "0");
  opts.add("range-lengths",
           "a new block's address range, in its own lengths, 1 to 1024 (default: the allocator's, 8)", "0");
  opts.add_flag("json", "print JSON instead of a table");
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const std::int64_t lag = opts.integer("lag");
  if (lag < 0)
    throw Error(ErrorKind::kInvalidArgument, cat("--lag is a count of requests, 0 or more; got ", lag));
  io::PagedReplayOptions replay_options;
  replay_options.page_bytes = opts.bytes("page");
  replay_options.cap_bytes = opts.bytes("cap");
  replay_options.lag = static_cast<std::uint64_t>(lag);
  const std::int64_t range_lengths = opts.integer("range-lengths");
  if (range_lengths < 0)
    throw Error(ErrorKind::kInvalidArgument,
                cat("--range-lengths is a count of a block's lengths, 1 or more (0: the default); got ",
                    range_lengths));
  replay_options.range_lengths = static_cast<std::uint64_t>(range_lengths);
  const io::PagedRecording recording = io::PagedRecording::read(*opts.positional("FILE"));
  const std::vector<io::PagedReplayStep> steps = io::replay(recording, replay_options);
  const io::PagedReplayOptions ran = io::resolved(replay_options, recording);
  const std::uint64_t page = ran.page_bytes;
  const std::uint64_t cap = ran.cap_bytes;
  if (!opts.flag("json")) {
    print_table(recording, steps, ran);
    return 0;
  }
  nlohmann::ordered_json out = {{"requests", recording.requests().size()},
                                {"page_bytes", page},
                                {"cap_bytes", cap},
                                {"lag", replay_options.lag},
                                {"range_lengths", ran.range_lengths},
                                {"steps", nlohmann::ordered_json::array()}};
  for (const io::PagedReplayStep& step : steps) out["steps"].push_back(step_json(step, page));
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

const CommandRegistration kRegistration{
    "paged-replay", "replay a paged allocator's recorded requests and count its mappings", run_paged_replay};

}  // namespace
}  // namespace teraio::cli
