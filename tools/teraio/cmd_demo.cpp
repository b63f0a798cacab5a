#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "command.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::cli {
namespace {

// The demo trains a PyTorch model, so it lives in the Python package; this command only
// runs it with the source tree's package first on the path, so that a build needs no install.
std::string python_interpreter() {
  if (const char* chosen = std::getenv("TERAIO_PYTHON"); chosen != nullptr && *chosen != '\0') return chosen;
  // Debian's interpreter is the one with the torch that the build found (scripts/test.sh).
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

int run_demo(const std::vector<std::string>& args) {
  const std::string python = python_interpreter();
  std::string path = TERAIO_PYTHON_SOURCE_DIR;
  if (const char* existing = std::getenv("PYTHONPATH"); existing != nullptr && *existing != '\0') {
    path = cat(path, ":", existing);
  }
  if (::setenv("PYTHONPATH", path.c_str(), 1) != 0) throw_errno(errno, "cannot set PYTHONPATH");

  std::vector<std::string> words{python, "-m", "teraio", "demo"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  throw_errno(errno, "cannot run ", python,
              " (the demo needs Python 3 with torch; choose the interpreter with TERAIO_PYTHON)");
}

const CommandRegistration kRegistration{
    "demo",
    "train a small GPT under a memory budget, exact against plain PyTorch (runs python -m teraio demo)",
    run_demo};

}  // namespace
}  // namespace teraio::cli
