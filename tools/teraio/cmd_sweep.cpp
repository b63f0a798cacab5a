#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>

#include "command.hpp"
#include "hardware_options.hpp"
#include "plot_script.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/sweep.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {
namespace {

int run_sweep(const std::vector<std::string>& args) {
  Options opts("sweep", "normalized performance against migration bandwidth (the paper's roofline study)");
  opts.add_positional("trace", "trace file (JSON or binary)");
  opts.add("bandwidth", "migration bandwidths in GB/s, comma-separated", "8,16,32,48,64");
  opts.add("budgets", "GPU memory budgets, comma-separated (e.g. 24GiB,16GiB); default --budget");
  opts.add("mode",
           "ssd: all migrations to the SSD tier over GDS at b each way, host tier off (the paper's "
           "setting); all: PCIe and SSD channels all at b",
           "ssd");
  opts.add("step", "use this step of a multi-step trace", "0");
  opts.add("steps", "simulated steps per point (the last is measured)", "2");
  opts.add("csv", "write the points as CSV to this file", "sweep.csv");
  opts.add("plot", "also write a PNG plot (via scripts/plot_sweep.py); empty to skip", "sweep.png");
  add_hardware_options(opts);
  add_operator_time_options(opts);
  if (!opts.parse(args)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  const trace::Trace t = load_step(opts);
  plan::SweepOptions so;
  so.base = hardware_from_options(opts, plan::Hardware{});
  so.mode = plan::parse_sweep_mode(opts.str("mode"));
  so.steps = static_cast<std::size_t>(std::max<std::int64_t>(1, opts.integer("steps")));
  for (const auto& b : opts.list("bandwidth")) {
    // A bare number is GB/s, as the help says; "800MiB/s" and the like are taken as written.
    const bool bare = !b.empty() && b.find_first_not_of("0123456789.eE+-") == std::string::npos;
    so.bandwidths.push_back(parse_bandwidth(bare ? b + "GB/s" : b));
    if (!(so.bandwidths.back() > 0))
      throw Error(ErrorKind::kInvalidArgument, cat("--bandwidth ", b, ": a bandwidth must be positive"));
  }
  if (so.bandwidths.empty()) throw Error(ErrorKind::kInvalidArgument, "--bandwidth lists no bandwidth");
  if (opts.has("budgets"))
    for (const auto& b : opts.list("budgets")) so.budgets.push_back(parse_bytes(b));
  if (so.budgets.empty() && so.base.gpu_budget == 0)
    throw Error(ErrorKind::kInvalidArgument, "sweep needs --budget or --budgets");
  // Opened before the sweep, which can take minutes, so that a bad path fails at once.
  const std::string csv_path = opts.str("csv");
  std::ofstream csv(csv_path);
  if (!csv) throw_errno(errno, "cannot create ", csv_path);
  const auto points = plan::sweep(t, so);
  std::printf("%-10s %-10s %-9s %-12s %-12s %-10s %-10s %s\n", "budget", "GB/s", "feasible", "step", "ideal",
              "normalized", "bound", "violations");
  for (const auto& p : points)
    std::printf("%-10s %-10.1f %-9s %-12s %-12s %-10.3f %-10.3f %zu\n", format_bytes(p.budget).c_str(),
                p.bandwidth / 1e9, p.feasible ? "yes" : "no", format_duration(p.step_time_s).c_str(),
                format_duration(p.ideal_step_time_s).c_str(), p.normalized, p.bound, p.violations);
  csv << plan::sweep_to_csv(points);
  csv.close();
  if (!csv) throw Error(ErrorKind::kIo, cat("cannot write ", csv_path));
  std::printf("CSV written to %s\n", csv_path.c_str());
  const std::string png = opts.str("plot");
  if (!png.empty()) {
    const std::string python = default_python();
    const int status = run_python_script(python, plot_script_path("plot_sweep.py"), {csv_path, "-o", png});
    if (status != 0)
      std::fprintf(stderr,
                   "teraio sweep: no plot: %s scripts/plot_sweep.py exited with status %d (the CSV is "
                   "complete)\n",
                   python.c_str(), status);
    else
      std::printf("plot written to %s\n", png.c_str());
  }
  return 0;
}

const CommandRegistration kRegistration{
    "sweep", "plan and simulate a trace over migration bandwidths (roofline)", run_sweep};

}  // namespace
}  // namespace teraio::cli
