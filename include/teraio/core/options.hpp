// core/options: command-line options of the `teraio` subcommands ("--key value",
// "--key=value", "--flag", positional arguments). Every option a command reads is declared
// with a help line, so unknown options and missing values are clear errors, and `--help`
// is generated.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace teraio {

class Options {
 public:
  // `command` and `summary` head the generated help text.
  Options(std::string command, std::string summary);

  // Declarations, in the order they appear in --help.
  void add(const std::string& name, const std::string& help, std::optional<std::string> default_value = {});
  void add_flag(const std::string& name, const std::string& help);
  void add_positional(const std::string& name, const std::string& help, bool required = true);

  // Parses argv (without the program and command names). Returns false when --help was
  // asked for (help() then holds the text to print). Throws Error{kInvalidArgument}.
  bool parse(const std::vector<std::string>& args);
  std::string help() const;

  bool has(const std::string& name) const;
  bool flag(const std::string& name) const;
  std::string str(const std::string& name) const;
  std::int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  std::uint64_t bytes(const std::string& name) const;
  double bandwidth(const std::string& name) const;
  double duration(const std::string& name) const;
  // Comma-separated list ("8,16,32"); empty when the value is empty.
  std::vector<std::string> list(const std::string& name) const;
  std::optional<std::string> positional(const std::string& name) const;
  // Positional arguments beyond the declared ones (for commands taking many paths).
  const std::vector<std::string>& rest() const { return rest_; }

 private:
  struct Declared {
    std::string help;
    std::optional<std::string> default_value;
    bool is_flag = false;
  };
  struct Positional {
    std::string name;
    std::string help;
    bool required;
  };
  const Declared& declared(const std::string& name) const;

  std::string command_;
  std::string summary_;
  std::vector<std::string> order_;
  std::map<std::string, Declared> declared_;
  std::vector<Positional> positional_decls_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> positional_values_;
  std::vector<std::string> rest_;
};

}  // namespace teraio
