// `teraio paged-replay FILE`: the requests a paged allocator recorded on the GPU
// (train_llm.py --paged-record, io/paged_recording) served again here by the same allocator on a
// driver that only counts, step by step: how many pages it maps, blocks it reuses, grows and
// takes apart. With `--page` or `--cap` other than the recording's, what another page size or
// cap would have done with the same requests; `--lag` holds freed blocks back from other
// streams as a device behind the host does.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/paged_recording.hpp"

namespace teraio::cli {
namespace {

nlohmann::ordered_json step_json(const io::PagedReplayStep& step, std::uint64_t page) {
  const io::PagedMemoryStats& c = step.counts;
  return {{"allocations", c.allocations},
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
          {"peak_held_bytes", c.peak_held_bytes},
          {"refused", step.refused}};
}

int run_paged_replay(const std::vector<std::string>& args) {
  Options opts("paged-replay",
               "serve a paged allocator's recorded requests again on a counting driver, step by step");
  opts.add_positional("FILE",
                      "requests recorded by train_llm.py --paged-record (teraio.paged.start_recording)");
  opts.add("page", "page size to replay with (default: the recording's)", "0");
  opts.add("cap", "the most bytes of pages held (default: the recording's cap)", "0");
  opts.add("lag", "requests after its free before a block counts as done on its streams", "0");
  opts.add_flag("json", "print JSON instead of a table");
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const io::PagedRecording recording = io::PagedRecording::read(*opts.positional("FILE"));
  io::PagedReplayOptions replay_options;
  replay_options.page_bytes = opts.bytes("page");
  replay_options.cap_bytes = opts.bytes("cap");
  replay_options.lag = static_cast<std::uint64_t>(opts.integer("lag"));
  const std::vector<io::PagedReplayStep> steps = io::replay(recording, replay_options);
  const std::uint64_t page =
      replay_options.page_bytes != 0 ? replay_options.page_bytes : recording.page_bytes();
  const std::uint64_t cap = replay_options.cap_bytes != 0 ? replay_options.cap_bytes : recording.cap_bytes();
  if (opts.flag("json")) {
    nlohmann::ordered_json out = {{"requests", recording.requests().size()},
                                  {"page_bytes", page},
                                  {"cap_bytes", cap},
                                  {"lag", replay_options.lag},
                                  {"steps", nlohmann::ordered_json::array()}};
    for (const io::PagedReplayStep& step : steps) out["steps"].push_back(step_json(step, page));
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  std::printf("%zu requests, %zu steps; pages of %s, cap %s, lag %llu requests\n\n",
              recording.requests().size(), steps.size(), format_bytes(page).c_str(),
              format_bytes(cap).c_str(), static_cast<unsigned long long>(replay_options.lag));
  std::printf("%4s %11s %9s %7s %7s %6s %6s %6s %8s %11s %6s %7s\n", "step", "allocations", "reused", "split",
              "joined", "grown", "mapped", "taken", "pages", "bytes", "waits", "refused");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const io::PagedMemoryStats& c = steps[i].counts;
    std::printf(
        "%4zu %11llu %9llu %7llu %7llu %6llu %6llu %6llu %8llu %11s %6llu %7llu\n", i + 1,
        static_cast<unsigned long long>(c.allocations), static_cast<unsigned long long>(c.reused),
        static_cast<unsigned long long>(c.split_blocks), static_cast<unsigned long long>(c.joined_blocks),
        static_cast<unsigned long long>(c.grown_blocks), static_cast<unsigned long long>(c.mapped_blocks),
        static_cast<unsigned long long>(c.taken_blocks), static_cast<unsigned long long>(c.pages_mapped),
        format_bytes(c.pages_mapped * page).c_str(), static_cast<unsigned long long>(c.device_waits),
        static_cast<unsigned long long>(steps[i].refused));
  }
  std::printf(
      "\n(grown: freed blocks grown in place; mapped: blocks mapped at a new address; taken: freed blocks"
      " whose pages another block took; pages: mapped in the step)\n");
  return 0;
}

const CommandRegistration kRegistration{
    "paged-replay", "replay a paged allocator's recorded requests and count its mappings", run_paged_replay};

}  // namespace
}  // namespace teraio::cli
