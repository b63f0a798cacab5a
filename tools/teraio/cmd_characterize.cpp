// `teraio characterize TRACE --out DIR`: the paper's trace study as CSV files, plotted by
// scripts/plot_characterize.py when Python with matplotlib is there.
#include <cstdio>
#include <filesystem>

#include "command.hpp"
#include "plot_script.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/trace/characterize.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {
namespace {

int run_characterize(const std::vector<std::string>& args) {
  Options opts(
      "characterize",
      "memory demand vs active bytes, tensor size mix and inactive-period CDFs of a trace (CSV + PNG)");
  opts.add_positional("TRACE", "trace file (.json or binary)");
  opts.add("out", "directory for the CSV and PNG files", "characterize");
  opts.add("step", "characterize only this step of a multi-step trace (default: the whole trace)");
  opts.add("idle-threshold", "idle time that counts as a long inactive period", "10ms");
  opts.add_flag("no-plots", "write the CSV files only");
  opts.add("python", "Python interpreter with matplotlib", default_python());
  opts.add("plot-script", "plotting script", plot_script_path("plot_characterize.py"));
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const std::string path = *opts.positional("TRACE");
  trace::Trace t = trace::load_trace(path);
  if (opts.has("step")) {
    const std::int64_t step = opts.integer("step");
    if (step < 0) throw Error(ErrorKind::kInvalidArgument, "--step must not be negative");
    t = trace::extract_step(t, static_cast<std::size_t>(step));
  }
  const double threshold = opts.duration("idle-threshold");
  const trace::Characterization c = trace::characterize(t, threshold);
  const std::string dir = opts.str("out");
  trace::write_characterization(c, dir);

  const trace::CharacterizationSummary& s = c.summary;
  std::printf("%s: %zu operators, %zu tensors, %zu uses, step time %s\n", path.c_str(), s.ops, s.tensors,
              s.uses, format_duration(s.step_time_s).c_str());
  std::printf("  peak memory demand        %s\n", format_bytes(s.peak_demand_bytes).c_str());
  std::printf("  active share per operator mean %.2f%%, max %.2f%%\n", 100 * s.mean_active_share,
              100 * s.max_active_share);
  std::printf(
      "  idle longer than %s      %.1f%% of tensors (%.1f%% of bytes), %.1f%% of %zu inactive periods\n",
      format_duration(threshold).c_str(), 100 * s.share_tensors_idle_over_threshold,
      100 * s.share_bytes_idle_over_threshold, 100 * s.share_periods_over_threshold, s.inactive_periods);
  if (s.releases_recorded) {
    std::printf(
        "  held past last use       p90 %s, p99 %s, max %s at operator %zu (step-local tensors freed later "
        "than used: what a plan counting them free at their last use runs over)\n",
        format_bytes(s.held_past_use_p90_bytes).c_str(), format_bytes(s.held_past_use_p99_bytes).c_str(),
        format_bytes(s.held_past_use_max_bytes).c_str(), s.held_past_use_max_op);
  } else {
    std::printf("  held past last use       not recorded (profile with Session(record_releases=True))\n");
  }
  const auto& buckets = trace::size_buckets();
  std::printf("  tensor sizes             ");
  for (std::size_t b = 0; b < buckets.size(); ++b)
    std::printf(" %s: %zu", buckets[b].label.c_str(), c.sizes[b].tensors);
  std::printf("\n  CSV written to %s (memory.csv, sizes.csv, inactive_cdf.csv, summary.csv, summary.json)\n",
              dir.c_str());
  std::fflush(stdout);

  if (opts.flag("no-plots")) return 0;
  const std::string python = opts.str("python");
  const std::string script = opts.str("plot-script");
  if (!std::filesystem::exists(script)) {
    std::fprintf(stderr,
                 "teraio characterize: no plots: the plotting script %s is missing (CSV files are written)\n",
                 script.c_str());
    return 0;
  }
  const int status = run_python_script(python, script, {dir});
  if (status == 0) {
    std::printf("  plots written to %s (memory.png, sizes.png, inactive_cdf.png)\n", dir.c_str());
  } else if (status == 127) {
    std::fprintf(
        stderr,
        "teraio characterize: no plots: cannot run %s (CSV files are written; --python picks another)\n",
        python.c_str());
  } else if (status == 3) {
    std::fprintf(stderr,
                 "teraio characterize: no plots: %s has no matplotlib (CSV files are written; --python picks "
                 "another interpreter)\n",
                 python.c_str());
  } else {
    std::fprintf(stderr,
                 "teraio characterize: the plotting script failed with status %d (CSV files are written)\n",
                 status);
    return 1;
  }
  return 0;
}

const CommandRegistration kRegistration{
    "characterize", "study a trace: memory vs active bytes, sizes, idle times", run_characterize};

}  // namespace
}  // namespace teraio::cli
