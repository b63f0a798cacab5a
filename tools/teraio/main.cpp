#include <algorithm>
#include <cstdio>
#include <exception>

#include "command.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/log.hpp"

namespace teraio::cli {
namespace {

std::vector<Command>& registry() {
  static std::vector<Command> all;
  return all;
}

void print_usage() {
  std::printf("usage: teraio COMMAND [options]   (teraio COMMAND --help for its options)\n\ncommands:\n");
  std::vector<Command> sorted = registry();
  std::sort(sorted.begin(), sorted.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (const auto& c : sorted) std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
}

}  // namespace

const std::vector<Command>& commands() {
  return registry();
}

CommandRegistration::CommandRegistration(std::string name, std::string summary, CommandFn run) {
  registry().push_back({std::move(name), std::move(summary), std::move(run)});
}

}  // namespace teraio::cli

int main(int argc, char** argv) {
  using namespace teraio;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    cli::print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const auto& all = cli::commands();
  const auto it = std::find_if(all.begin(), all.end(), [&](const cli::Command& c) { return c.name == name; });
  if (it == all.end()) {
    std::fprintf(stderr, "teraio: unknown command '%s'\n\n", name.c_str());
    cli::print_usage();
    return 2;
  }
  try {
    return it->run(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const Error& e) {
    std::fprintf(stderr, "teraio %s: %s\n", name.c_str(), e.what());
    return e.kind() == ErrorKind::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "teraio %s: unexpected error: %s\n", name.c_str(), e.what());
    return 1;
  }
}
