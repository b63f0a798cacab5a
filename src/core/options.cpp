#include "teraio/core/options.hpp"

#include <charconv>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio {

Options::Options(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void Options::add(const std::string& name, const std::string& help,
                  std::optional<std::string> default_value) {
  order_.push_back(name);
  declared_[name] = Declared{help, std::move(default_value), false};
}

void Options::add_flag(const std::string& name, const std::string& help) {
  order_.push_back(name);
  declared_[name] = Declared{help, std::nullopt, true};
}

void Options::add_positional(const std::string& name, const std::string& help, bool required) {
  positional_decls_.push_back({name, help, required});
}

const Options::Declared& Options::declared(const std::string& name) const {
  const auto it = declared_.find(name);
  if (it == declared_.end()) throw_internal(cat("option --", name, " read but never declared"));
  return it->second;
}

bool Options::parse(const std::vector<std::string>& args) {
  std::size_t next_positional = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") return false;
    if (arg.starts_with("--") && arg.size() > 2) {
      std::string name = arg.substr(2);
      std::optional<std::string> value;
      if (const auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
      }
      const auto it = declared_.find(name);
      if (it == declared_.end())
        throw Error(ErrorKind::kInvalidArgument, cat(command_, ": unknown option --", name, " (see --help)"));
      if (it->second.is_flag) {
        if (value) throw Error(ErrorKind::kInvalidArgument, cat(command_, ": --", name, " takes no value"));
        values_[name] = "1";
        continue;
      }
      if (!value) {
        if (i + 1 >= args.size())
          throw Error(ErrorKind::kInvalidArgument, cat(command_, ": --", name, " needs a value"));
        value = args[++i];
      }
      values_[name] = *value;
      continue;
    }
    if (next_positional < positional_decls_.size())
      positional_values_[positional_decls_[next_positional++].name] = arg;
    else
      rest_.push_back(arg);
  }
  for (std::size_t i = next_positional; i < positional_decls_.size(); ++i)
    if (positional_decls_[i].required)
      throw Error(ErrorKind::kInvalidArgument,
                  cat(command_, ": missing argument ", positional_decls_[i].name, " (see --help)"));
  return true;
}

std::string Options::help() const {
  std::string text = cat("usage: teraio ", command_, " [options]");
  for (const auto& p : positional_decls_) text += p.required ? cat(" ", p.name) : cat(" [", p.name, "]");
  text += cat("\n\n", summary_, "\n");
  if (!positional_decls_.empty()) {
    text += "\narguments:\n";
    for (const auto& p : positional_decls_) text += cat("  ", p.name, "\n      ", p.help, "\n");
  }
  if (!order_.empty()) {
    text += "\noptions:\n";
    for (const auto& name : order_) {
      const Declared& d = declared_.at(name);
      text += cat("  --", name, d.is_flag ? "" : " VALUE", "\n      ", d.help);
      if (d.default_value)
        text += cat(" (default: ", d.default_value->empty() ? "none" : *d.default_value, ")");
      text += "\n";
    }
  }
  return text;
}

bool Options::has(const std::string& name) const {
  return values_.contains(name) || declared(name).default_value.has_value();
}

bool Options::flag(const std::string& name) const {
  declared(name);
  return values_.contains(name);
}

std::string Options::str(const std::string& name) const {
  if (const auto it = values_.find(name); it != values_.end()) return it->second;
  const Declared& d = declared(name);
  if (!d.default_value) throw Error(ErrorKind::kInvalidArgument, cat(command_, ": --", name, " is required"));
  return *d.default_value;
}

std::int64_t Options::integer(const std::string& name) const {
  const std::string text = str(name);
  std::int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw Error(ErrorKind::kInvalidArgument,
                cat(command_, ": --", name, " expects an integer, got '", text, "'"));
  return value;
}

double Options::number(const std::string& name) const {
  const std::string text = str(name);
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw Error(ErrorKind::kInvalidArgument,
                cat(command_, ": --", name, " expects a number, got '", text, "'"));
  return value;
}

std::uint64_t Options::bytes(const std::string& name) const {
  return parse_bytes(str(name));
}
double Options::bandwidth(const std::string& name) const {
  return parse_bandwidth(str(name));
}
double Options::duration(const std::string& name) const {
  return parse_duration(str(name));
}

std::vector<std::string> Options::list(const std::string& name) const {
  const std::string text = str(name);
  if (trim(text).empty()) return {};
  std::vector<std::string> items;
  for (const auto& item : split(text, ',')) items.emplace_back(trim(item));
  return items;
}

std::optional<std::string> Options::positional(const std::string& name) const {
  if (const auto it = positional_values_.find(name); it != positional_values_.end()) return it->second;
  return std::nullopt;
}

}  // namespace teraio
