// The `teraio` command-line tool: each subcommand lives in its own cmd_<name>.cpp and
// registers itself with a static CommandRegistration, so adding a command touches no other file.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace teraio::cli {

// Runs a subcommand with its arguments (without program and command names); returns the
// process exit code. Errors are thrown as teraio::Error and reported by main.
using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
  std::string name;
  std::string summary;
  CommandFn run;
};

const std::vector<Command>& commands();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string summary, CommandFn run);
};

}  // namespace teraio::cli
