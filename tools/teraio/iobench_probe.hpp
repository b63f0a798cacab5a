// Facts about the machine and its storage paths that `teraio doctor` prints and
// `teraio iobench` records with its results: what is compiled in, what actually works at run
// time, and which I/O path each storage directory would get.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace teraio::cli {

struct PathProbe {
  std::string path;
  bool usable = false;     // exists, is a directory, a file can be created in it
  std::string problem;     // why not usable
  std::string filesystem;  // "ext4", "tmpfs", ... (from statfs)
  std::uint64_t free_bytes = 0;
  bool direct_io = false;      // O_DIRECT open + aligned write + read worked
  std::string direct_io_note;  // why O_DIRECT is not available
  std::string cufile;          // "true GDS", or why this file would take the bounce path
  std::string backend;         // what the SSD tier would use for this path
};

struct MachineProbe {
  bool cuda_compiled_in = false;
  std::vector<std::string> cuda_devices;
  std::string cuda_detail;
  bool cufile_loaded = false;
  bool cufile_driver_open = false;
  bool nvfs_present = false;
  std::string cufile_detail;
  bool uring_compiled_in = false;
  bool uring_works = false;
  std::string uring_detail;
  std::uint64_t page_size = 0;
  unsigned cpus = 0;
  std::uint64_t mem_available = 0;
  std::string memlock_limit;
  bool root = false;
  std::string kernel;
  bool fio_available = false;
};

// Probes the machine; uring_probe_dir is where a scratch file for the io_uring test goes.
MachineProbe probe_machine(const std::string& uring_probe_dir);
// Probes one storage directory with a small scratch file that is removed afterwards.
PathProbe probe_path(const std::string& path, const MachineProbe& machine);

}  // namespace teraio::cli
