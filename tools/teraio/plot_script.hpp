// Running the matplotlib scripts of scripts/ from the commands that plot (characterize,
// sweep): plotting is Python's job, and a missing interpreter or matplotlib must only cost
// the plots, never the numbers already written.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

extern char** environ;

namespace teraio::cli {

// The script ships in the source tree; this file sits in tools/teraio/ of it.
inline std::string plot_script_path(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "scripts" / name)
      .string();
}

inline std::string default_python() {
  // Debian's interpreter carries matplotlib; a virtual environment's python3 on PATH may not.
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

// Runs `python script args...` without a shell (paths are passed as they are, quotes and
// all) and returns its exit status: 127 when it could not start, 128 + signal when killed.
inline int run_python_script(const std::string& python, const std::string& script,
                             const std::vector<std::string>& script_args) {
  std::vector<std::string> args = {python, script};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return 127;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw_errno(errno, "waiting for ", python);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace teraio::cli
