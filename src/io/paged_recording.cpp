#include "teraio/io/paged_recording.hpp"

#include <charconv>
#include <fstream>
#include <limits>
#include <string_view>
#include <type_traits>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::io {
namespace {

constexpr std::string_view kHeader = "# teraio paged requests v1 ";

// The words of a line, split at single spaces.
std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  while (!line.empty()) {
    const std::size_t space = line.find(' ');
    out.push_back(line.substr(0, space));
    if (space == std::string_view::npos) break;
    line.remove_prefix(space + 1);
  }
  return out;
}

// Digits only (no sign, no leftovers): a file of requests has nothing else.
std::optional<std::uint64_t> number(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// "KEY=DIGITS" with the key expected.
std::optional<std::uint64_t> keyed(std::string_view word, std::string_view key) {
  if (word.size() <= key.size() + 1 || word.substr(0, key.size()) != key || word[key.size()] != '=')
    return std::nullopt;
  return number(word.substr(key.size() + 1));
}

constexpr std::string_view kCountKeys[] = {"pages", "reused", "grown", "mapped", "taken", "waits"};

std::uint64_t* count_field(RecordedCounts& c, std::size_t i) {
  std::uint64_t* fields[] = {&c.pages_mapped,  &c.reused,       &c.grown_blocks,
                             &c.mapped_blocks, &c.taken_blocks, &c.device_waits};
  return fields[i];
}

}  // namespace

PagedRecording::PagedRecording(std::uint64_t page_bytes, std::uint64_t cap_bytes)
    : page_bytes_(page_bytes), cap_bytes_(cap_bytes) {}

std::uint32_t PagedRecording::stream_number(const void* stream) {
  return streams_.try_emplace(stream, static_cast<std::uint32_t>(streams_.size())).first->second;
}

void PagedRecording::allocated(std::uintptr_t address, std::uint64_t bytes, const void* stream) {
  const std::uint64_t block = next_block_++;
  live_[address] = block;
  requests_.push_back({PagedRequest::Kind::kAllocate, block, bytes, stream_number(stream)});
}

void PagedRecording::freed(std::uintptr_t address) {
  const auto found = live_.find(address);
  if (found == live_.end()) return;
  requests_.push_back({PagedRequest::Kind::kFree, found->second, 0, 0});
  live_.erase(found);
}

void PagedRecording::used(std::uintptr_t address, const void* stream) {
  const auto found = live_.find(address);
  if (found == live_.end()) return;
  requests_.push_back({PagedRequest::Kind::kUse, found->second, 0, stream_number(stream)});
}

void PagedRecording::step(const RecordedCounts& counted) {
  requests_.push_back({PagedRequest::Kind::kStep, 0, 0, 0});
  counted_.push_back(counted);
}

void PagedRecording::write(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw Error(ErrorKind::kIo, cat("cannot write the paged requests to ", path));
  out << kHeader << "page=" << page_bytes_ << " cap=" << cap_bytes_ << '\n';
  std::size_t steps = 0;
  for (const PagedRequest& r : requests_) {
    switch (r.kind) {
      case PagedRequest::Kind::kAllocate:
        out << "a " << r.block << ' ' << r.bytes << ' ' << r.stream << '\n';
        break;
      case PagedRequest::Kind::kFree: out << "f " << r.block << '\n'; break;
      case PagedRequest::Kind::kUse: out << "u " << r.block << ' ' << r.stream << '\n'; break;
      case PagedRequest::Kind::kStep: {
        out << 's';
        if (std::optional<RecordedCounts> counted = counted_.at(steps++))
          for (std::size_t i = 0; i < std::size(kCountKeys); ++i)
            out << ' ' << kCountKeys[i] << '=' << *count_field(*counted, i);
        out << '\n';
        break;
      }
    }
  }
  out.flush();
  if (!out) throw Error(ErrorKind::kIo, cat("writing the paged requests to ", path, " failed"));
}

PagedRecording PagedRecording::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, cat("cannot read paged requests from ", path));
  std::string line;
  std::getline(in, line);
  const std::vector<std::string_view> head = words(line);
  const std::optional<std::uint64_t> page = head.size() == 7 ? keyed(head[5], "page") : std::nullopt;
  const std::optional<std::uint64_t> cap = head.size() == 7 ? keyed(head[6], "cap") : std::nullopt;
  if (!std::string_view(line).starts_with(kHeader) || !page || !cap)
    throw Error(ErrorKind::kFormat,
                cat(path, ": not a file of paged requests (its first line is '", line, "')"));
  PagedRecording recording(*page, *cap);
  for (std::size_t line_number = 2; std::getline(in, line); ++line_number) {
    const std::vector<std::string_view> w = words(line);
    PagedRequest r;
    std::optional<RecordedCounts> counted;
    bool ok = !w.empty() && w[0].size() == 1;
    const auto field = [&](std::size_t i, auto& into) {
      const std::optional<std::uint64_t> value = i < w.size() ? number(w[i]) : std::nullopt;
      ok = ok && value.has_value() &&
           *value <= std::numeric_limits<std::remove_reference_t<decltype(into)>>::max();
      if (ok) into = static_cast<std::remove_reference_t<decltype(into)>>(*value);
    };
    switch (ok ? w[0][0] : '?') {
      case 'a':
        r.kind = PagedRequest::Kind::kAllocate;
        field(1, r.block);
        field(2, r.bytes);
        field(3, r.stream);
        ok = ok && w.size() == 4;
        break;
      case 'f':
        r.kind = PagedRequest::Kind::kFree;
        field(1, r.block);
        ok = ok && w.size() == 2;
        break;
      case 'u':
        r.kind = PagedRequest::Kind::kUse;
        field(1, r.block);
        field(2, r.stream);
        ok = ok && w.size() == 3;
        break;
      case 's':
        if (w.size() > 1) {
          counted.emplace();
          ok = w.size() == 1 + std::size(kCountKeys);
          for (std::size_t i = 0; ok && i < std::size(kCountKeys); ++i) {
            const std::optional<std::uint64_t> value = keyed(w[1 + i], kCountKeys[i]);
            ok = value.has_value();
            if (ok) *count_field(*counted, i) = *value;
          }
        }
        break;
      default: ok = false;
    }
    if (!ok)
      throw Error(ErrorKind::kFormat, cat(path, ":", line_number, ": not a paged request: '", line, "'"));
    recording.requests_.push_back(r);
    if (r.kind == PagedRequest::Kind::kStep) recording.counted_.push_back(counted);
  }
  return recording;
}

}  // namespace teraio::io
