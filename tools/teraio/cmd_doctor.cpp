// `teraio doctor`: what this machine offers and which code paths would actually run (CUDA,
// cuFile / GPUDirect Storage, io_uring, O_DIRECT per storage path), never guessed.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "command.hpp"
#include "iobench_probe.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/device_copy.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::cli {
namespace {

const char* yes_no(bool b) {
  return b ? "yes" : "no";
}

void print_machine(const MachineProbe& m) {
  std::printf("machine\n");
  std::printf("  kernel            : %s\n", m.kernel.c_str());
  std::printf("  cpus              : %u\n", m.cpus);
  std::printf("  page size         : %llu\n", static_cast<unsigned long long>(m.page_size));
  std::printf("  memory available  : %s\n", format_bytes(m.mem_available).c_str());
  std::printf("  locked-memory cap : %s (RLIMIT_MEMLOCK; io_uring buffer registration counts against it)\n",
              m.memlock_limit.c_str());
  std::printf("  root              : %s (page-cache drops in iobench need root)\n", yes_no(m.root));
  std::printf("  fio               : %s\n",
              m.fio_available ? "installed" : "not installed (iobench uses dd)");
  std::printf("CUDA\n");
  std::printf("  compiled in       : %s\n", yes_no(m.cuda_compiled_in));
  std::printf("  runtime           : %s\n", m.cuda_detail.c_str());
  for (const auto& d : m.cuda_devices) std::printf("  device            : %s\n", d.c_str());
  std::printf("cuFile (GPUDirect Storage)\n");
  std::printf("  library loaded    : %s\n", yes_no(m.cufile_loaded));
  std::printf("  driver open       : %s\n", yes_no(m.cufile_driver_open));
  std::printf("  nvidia-fs present : %s\n", yes_no(m.nvfs_present));
  std::printf("  detail            : %s\n", m.cufile_detail.c_str());
  const bool gds = m.cufile_driver_open && m.nvfs_present;
  std::printf("  true GDS active   : %s\n",
              gds ? "yes, where a file registers (see paths below)"
                  : "no: device-memory transfers take the bounce path through pinned host memory");
  std::printf("io_uring\n");
  std::printf("  compiled in       : %s\n", yes_no(m.uring_compiled_in));
  std::printf("  works at run time : %s (%s)\n", yes_no(m.uring_works), m.uring_detail.c_str());
}

void print_path(const PathProbe& p) {
  std::printf("path %s\n", p.path.c_str());
  if (!p.usable) {
    std::printf("  NOT USABLE        : %s\n", p.problem.c_str());
    return;
  }
  std::printf("  filesystem        : %s\n", p.filesystem.c_str());
  std::printf("  free space        : %s\n", format_bytes(p.free_bytes).c_str());
  std::printf("  O_DIRECT          : %s\n", p.direct_io ? "yes" : cat("no: ", p.direct_io_note).c_str());
  std::printf("  host-memory I/O   : %s\n", p.backend.c_str());
  std::printf("  device-memory I/O : %s\n", p.cufile.c_str());
}

// What the storage engine itself picks for each path: a tier store on a 1 MiB swap file of a
// name no job uses, unlinked as soon as it is open (so nothing is left and no big file is touched).
void print_engine_choice(const std::vector<std::string>& paths, bool have_cuda_device) {
  std::printf("storage engine (TierStore report, 1 MiB probe swap files)\n");
  try {
    auto copier = have_cuda_device ? io::make_cuda_copier(0) : io::make_host_copier();
    io::EngineConfig config;
    config.ssd_paths = paths;
    config.ssd_capacity_per_path = kMiB;
    config.chunk_bytes = kMiB;
    config.bounce_pool_bytes = kMiB;
    config.transfer_threads = 1;
    config.unlink_swap_files = true;
    config.rank = 1'000'000 + static_cast<int>(getpid());
    io::TierStore store(*copier, config);
    const io::TierStoreReport report = store.report();
    std::printf("  copier            : %s\n", report.copier.c_str());
    for (const auto& p : report.paths) {
      std::printf("  %s\n", p.path.c_str());
      std::printf("    backend         : %s%s, %s\n", p.backend.c_str(),
                  p.buffers_registered ? " (registered buffers)" : "",
                  p.direct_io ? "O_DIRECT" : cat("buffered: ", p.buffered_reason).c_str());
      std::printf("    cuFile          : %s (%s)\n", p.cufile_active ? "active" : "not active",
                  p.cufile_detail.c_str());
    }
  } catch (const std::exception& e) {
    std::printf("  cannot open a tier store on these paths: %s\n", e.what());
  }
}

int run_doctor(const std::vector<std::string>& args) {
  Options options("doctor", "print what this machine offers and which I/O paths TeraIO would use");
  options.add("paths", "comma-separated storage directories to probe (default: the temp directory)", "");
  if (!options.parse(args)) {
    std::printf("%s", options.help().c_str());
    return 0;
  }
  std::vector<std::string> paths = options.list("paths");
  if (paths.empty()) paths.push_back(std::filesystem::temp_directory_path().string());
  const MachineProbe machine = probe_machine(paths.front());
  print_machine(machine);
  bool all_usable = true;
  for (const auto& path : paths) {
    const PathProbe p = probe_path(path, machine);
    print_path(p);
    all_usable = all_usable && p.usable;
  }
  if (all_usable) print_engine_choice(paths, !machine.cuda_devices.empty());
  return all_usable ? 0 : 1;
}

const CommandRegistration kRegistration{
    "doctor", "show what this machine offers and which I/O paths would run", run_doctor};

}  // namespace
}  // namespace teraio::cli
