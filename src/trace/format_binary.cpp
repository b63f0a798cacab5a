// The binary form of a trace (docs/trace-format.md): a header, then length-prefixed
// sections holding the trace column by column, then an optional XXH64 checksum. Columns make
// loading a few bulk copies instead of a million small parses. Every count read from the file
// is checked against the bytes that remain before anything is allocated, so a hostile length
// field cannot make the reader allocate more than the file itself justifies.
#include <xxhash.h>

#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::trace {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the binary trace form is little-endian and is read with plain copies");

constexpr char kMagic[8] = {'T', 'I', 'O', 'T', 'R', 'A', 'C', 'E'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kFlagChecksum = 1;
constexpr std::size_t kHeaderBytes = 16;
constexpr std::size_t kSectionHeaderBytes = 12;
// Operator names are stored once and referenced by every operator, so a hostile file could
// make a few bytes expand into gigabytes of names (each is also at most kMaxOperatorName).
constexpr std::size_t kMaxNameExpansion = 32;

constexpr std::uint32_t tag(const char (&s)[5]) {
  return static_cast<std::uint32_t>(static_cast<unsigned char>(s[0])) |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[1])) << 8 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[2])) << 16 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[3])) << 24;
}
constexpr std::uint32_t kMeta = tag("META");
constexpr std::uint32_t kOps = tag("OPS_");
constexpr std::uint32_t kTensors = tag("TENS");
constexpr std::uint32_t kUses = tag("USES");
constexpr std::uint32_t kHeld = tag("HELD");  // optional (a later addition): held_after_use
// Optional (a later addition): one byte per use, in USES order, 1 where the use only reads.
constexpr std::uint32_t kReads = tag("READ");

// Bounds-checked little-endian reader over one section; errors give the absolute offset.
class Reader {
 public:
  Reader(std::span<const std::byte> data, std::size_t base, std::string_view section)
      : data_(data), base_(base), section_(section) {}

  [[noreturn]] void fail(std::string_view why) const {
    throw Error(ErrorKind::kFormat,
                cat("binary trace: section ", section_, " at byte ", base_ + pos_, ": ", why));
  }
  std::size_t remaining() const { return data_.size() - pos_; }
  std::size_t size() const { return data_.size(); }

  template <typename T>
  T scalar(std::string_view what) {
    T value;
    copy(&value, sizeof value, what);
    return value;
  }

  // A count of items that each take at least `min_item_bytes` further on in this section.
  std::size_t count(std::string_view what, std::size_t min_item_bytes) {
    const auto n = scalar<std::uint64_t>(what);
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes)
      fail(cat(what, " = ", n, " needs at least ", n, " x ", min_item_bytes, " bytes but only ", remaining(),
               " remain"));
    if (n > std::numeric_limits<std::uint32_t>::max()) fail(cat(what, " = ", n, " is absurd"));
    return static_cast<std::size_t>(n);
  }

  template <typename T>
  std::vector<T> column(std::size_t n, std::string_view what) {
    if (n > remaining() / sizeof(T))
      fail(cat(what, ": ", n, " values do not fit in the ", remaining(), " bytes left"));
    std::vector<T> values(n);
    copy(values.data(), n * sizeof(T), what);
    return values;
  }

  std::string string(std::size_t length, std::string_view what) {
    if (length > remaining())
      fail(cat(what, ": ", length, " bytes do not fit in the ", remaining(), " bytes left"));
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), length);
    pos_ += length;
    return s;
  }

  void expect_end() const {
    if (remaining() != 0) fail(cat(remaining(), " unexpected bytes at the end of the section"));
  }

 private:
  void copy(void* out, std::size_t bytes, std::string_view what) {
    if (bytes > remaining()) fail(cat("truncated while reading ", what));
    if (bytes == 0) return;  // an empty column's data() may be null, which memcpy forbids
    std::memcpy(out, data_.data() + pos_, bytes);
    pos_ += bytes;
  }

  std::span<const std::byte> data_;
  std::size_t base_;
  std::string_view section_;
  std::size_t pos_ = 0;
};

void read_meta(Reader r, Trace& trace) {
  trace.untracked_bytes = r.scalar<std::uint64_t>("untracked_bytes");
  trace.source = r.string(r.count("source length", 1), "source");
  const std::size_t steps = r.count("step count", sizeof(OpIndex));
  trace.step_begins = r.column<OpIndex>(steps, "step_begins");
  r.expect_end();
}

void read_ops(Reader r, Trace& trace) {
  const std::size_t names = r.count("operator name count", sizeof(std::uint32_t));
  std::vector<std::string> name_table;
  name_table.reserve(names);
  for (std::size_t i = 0; i < names; ++i) {
    const auto length = r.scalar<std::uint32_t>("operator name length");
    if (length > kMaxOperatorName)
      r.fail(cat("operator name ", i, " is ", length, " bytes long (limit ", kMaxOperatorName, ")"));
    name_table.push_back(r.string(length, "operator name"));
  }
  const std::size_t n = r.count("operator count", sizeof(std::uint32_t) + sizeof(double) + 1);
  const auto name_index = r.column<std::uint32_t>(n, "operator name indices");
  const auto durations = r.column<double>(n, "operator durations");
  const auto phases = r.column<std::uint8_t>(n, "operator phases");
  r.expect_end();
  std::size_t expanded = 0;
  for (std::size_t k = 0; k < n; ++k) {
    if (name_index[k] >= names)
      r.fail(cat("operator ", k, " names entry ", name_index[k], " of a ", names, "-entry name table"));
    expanded += name_table[name_index[k]].size();
  }
  if (expanded > kMaxNameExpansion * r.size())
    r.fail(cat("operator names would expand to ", expanded, " bytes from a ", r.size(), "-byte section"));
  trace.ops.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    if (phases[k] > static_cast<std::uint8_t>(Phase::kOther))
      r.fail(cat("operator ", k, " has unknown phase code ", int{phases[k]}));
    trace.ops[k] = {name_table[name_index[k]], durations[k], static_cast<Phase>(phases[k])};
  }
}

void read_held(Reader r, Trace& trace) {
  const std::size_t m = r.count("tensor count", 4);
  if (m != trace.tensors.size())
    r.fail(cat("holds ", m, " tensors but the TENS section has ", trace.tensors.size()));
  const auto held = r.column<std::uint32_t>(m, "held_after_use");
  for (std::size_t i = 0; i < m; ++i) trace.tensors[i].held_after_use = held[i];
  r.expect_end();
}

void read_reads(Reader r, Trace& trace) {
  std::size_t total = 0;
  for (const Tensor& t : trace.tensors) total += t.uses.size();
  const std::size_t m = r.count("use count", 1);
  if (m != total) r.fail(cat("holds ", m, " use flags but the USES section has ", total, " uses"));
  const auto flags = r.column<std::uint8_t>(m, "read-only flags");
  r.expect_end();
  std::size_t at = 0;
  for (Tensor& t : trace.tensors) {
    for (const OpIndex op : t.uses) {
      if (flags[at] > 1) r.fail(cat("use flag ", at, " is ", int{flags[at]}));
      if (flags[at++] == 1) t.read_only_uses.push_back(op);
    }
  }
}

// Returns the use count of each tensor, which the USES section must add up to.
std::vector<std::uint32_t> read_tensors(Reader r, Trace& trace) {
  const std::size_t m = r.count("tensor count", 8 + 8 + 1 + 1 + 4 + 4);
  const auto ids = r.column<std::uint64_t>(m, "tensor ids");
  const auto bytes = r.column<std::uint64_t>(m, "tensor sizes");
  const auto kinds = r.column<std::uint8_t>(m, "tensor kinds");
  const auto persistent = r.column<std::uint8_t>(m, "tensor persistence flags");
  auto use_counts = r.column<std::uint32_t>(m, "tensor use counts");
  const auto name_lengths = r.column<std::uint32_t>(m, "tensor name lengths");
  trace.tensors.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    Tensor& t = trace.tensors[i];
    t.id = ids[i];
    t.bytes = bytes[i];
    if (kinds[i] > static_cast<std::uint8_t>(TensorKind::kOther))
      r.fail(cat("tensor ", t.id, " has unknown kind code ", int{kinds[i]}));
    t.kind = static_cast<TensorKind>(kinds[i]);
    if (persistent[i] > 1) r.fail(cat("tensor ", t.id, " has persistence flag ", int{persistent[i]}));
    t.persistent = persistent[i] == 1;
    t.name = r.string(name_lengths[i], "tensor name");
  }
  r.expect_end();
  return use_counts;
}

void read_uses(Reader r, Trace& trace, const std::vector<std::uint32_t>& use_counts) {
  const std::size_t total = r.count("use count", sizeof(OpIndex));
  std::uint64_t expected = 0;
  for (std::uint32_t c : use_counts) expected += c;
  if (expected != total)
    r.fail(cat("holds ", total, " uses but the tensors' use counts add up to ", expected));
  const auto uses = r.column<OpIndex>(total, "uses");
  r.expect_end();
  std::size_t at = 0;
  for (std::size_t i = 0; i < trace.tensors.size(); ++i) {
    trace.tensors[i].uses.assign(uses.begin() + static_cast<std::ptrdiff_t>(at),
                                 uses.begin() + static_cast<std::ptrdiff_t>(at + use_counts[i]));
    at += use_counts[i];
  }
}

class Writer {
 public:
  template <typename T>
  void scalar(T value) {
    append(&value, sizeof value);
  }
  template <typename T>
  void column(const std::vector<T>& values) {
    append(values.data(), values.size() * sizeof(T));
  }
  void string(const std::string& s) { append(s.data(), s.size()); }
  void append(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  // Opens a section; end_section() fills in its length.
  void begin_section(std::uint32_t section_tag) {
    scalar(section_tag);
    length_at_ = out_.size();
    scalar(std::uint64_t{0});
  }
  void end_section() {
    const std::uint64_t length = out_.size() - length_at_ - sizeof(std::uint64_t);
    std::memcpy(out_.data() + length_at_, &length, sizeof length);
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
  std::size_t length_at_ = 0;
};

}  // namespace

Trace parse_trace_binary(std::span<const std::byte> data) {
  if (data.size() < kHeaderBytes || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    throw Error(ErrorKind::kFormat,
                "binary trace: missing the TIOTRACE header (not a binary trace, or truncated)");
  std::uint32_t version;
  std::uint32_t flags;
  std::memcpy(&version, data.data() + 8, 4);
  std::memcpy(&flags, data.data() + 12, 4);
  if (version != kVersion)
    throw Error(ErrorKind::kFormat, cat("binary trace: unsupported version ", version,
                                        " (this build reads version ", kVersion, ")"));
  if ((flags & ~kFlagChecksum) != 0)
    throw Error(ErrorKind::kFormat, cat("binary trace: unknown flags 0x", std::hex, flags));
  std::size_t end = data.size();
  if (flags & kFlagChecksum) {
    if (end < kHeaderBytes + 8)
      throw Error(ErrorKind::kFormat, "binary trace: truncated before its checksum");
    end -= 8;
    std::uint64_t stored;
    std::memcpy(&stored, data.data() + end, 8);
    const std::uint64_t actual = XXH64(data.data(), end, 0);
    if (stored != actual)
      throw Error(ErrorKind::kFormat, cat("binary trace: checksum mismatch (stored ", std::hex, stored,
                                          ", computed ", actual, "): the file is corrupt or truncated"));
  }
  Trace trace;
  std::map<std::uint32_t, std::pair<std::size_t, std::size_t>> sections;  // tag -> (offset, length)
  for (std::size_t at = kHeaderBytes; at < end;) {
    if (end - at < kSectionHeaderBytes)
      throw Error(ErrorKind::kFormat, cat("binary trace: truncated section header at byte ", at));
    std::uint32_t section_tag;
    std::uint64_t length;
    std::memcpy(&section_tag, data.data() + at, 4);
    std::memcpy(&length, data.data() + at + 4, 8);
    at += kSectionHeaderBytes;
    if (length > end - at)
      throw Error(ErrorKind::kFormat,
                  cat("binary trace: section at byte ", at - kSectionHeaderBytes, " claims ", length,
                      " bytes but only ", end - at, " remain (truncated file?)"));
    // Sections of later minor additions are skipped; a repeated one would be ambiguous.
    if (!sections.emplace(section_tag, std::pair{at, static_cast<std::size_t>(length)}).second)
      throw Error(ErrorKind::kFormat,
                  cat("binary trace: section at byte ", at - kSectionHeaderBytes, " is repeated"));
    at += static_cast<std::size_t>(length);
  }
  const auto section = [&](std::uint32_t section_tag, std::string_view name) {
    const auto it = sections.find(section_tag);
    if (it == sections.end()) throw Error(ErrorKind::kFormat, cat("binary trace: missing section ", name));
    return Reader(data.subspan(it->second.first, it->second.second), it->second.first, name);
  };
  read_meta(section(kMeta, "META"), trace);
  read_ops(section(kOps, "OPS_"), trace);
  const auto use_counts = read_tensors(section(kTensors, "TENS"), trace);
  read_uses(section(kUses, "USES"), trace, use_counts);
  if (sections.contains(kHeld)) read_held(section(kHeld, "HELD"), trace);
  if (sections.contains(kReads)) read_reads(section(kReads, "READ"), trace);
  try {
    validate(trace);
  } catch (const Error& e) {
    throw Error(ErrorKind::kFormat, cat("binary trace: ", e.what()));
  }
  return trace;
}

std::vector<std::byte> trace_to_binary(const Trace& trace) {
  validate(trace);
  Writer w;
  w.append(kMagic, sizeof kMagic);
  w.scalar(kVersion);
  w.scalar(kFlagChecksum);

  w.begin_section(kMeta);
  w.scalar(trace.untracked_bytes);
  w.scalar(std::uint64_t{trace.source.size()});
  w.string(trace.source);
  w.scalar(std::uint64_t{trace.step_begins.size()});
  w.column(trace.step_begins);
  w.end_section();

  // Operator names repeat (a few dozen distinct kernels), so they are stored once.
  w.begin_section(kOps);
  std::unordered_map<std::string_view, std::uint32_t> name_ids;
  std::vector<std::string_view> names;
  std::vector<std::uint32_t> name_index(trace.ops.size());
  std::vector<double> durations(trace.ops.size());
  std::vector<std::uint8_t> phases(trace.ops.size());
  for (std::size_t k = 0; k < trace.ops.size(); ++k) {
    const Operator& op = trace.ops[k];
    const auto [it, added] = name_ids.emplace(op.name, static_cast<std::uint32_t>(names.size()));
    if (added) names.push_back(op.name);
    name_index[k] = it->second;
    durations[k] = op.duration_s;
    phases[k] = static_cast<std::uint8_t>(op.phase);
  }
  w.scalar(std::uint64_t{names.size()});
  for (std::string_view name : names) {
    w.scalar(static_cast<std::uint32_t>(name.size()));
    w.append(name.data(), name.size());
  }
  w.scalar(std::uint64_t{trace.ops.size()});
  w.column(name_index);
  w.column(durations);
  w.column(phases);
  w.end_section();

  const std::size_t m = trace.tensors.size();
  std::vector<std::uint64_t> ids(m), bytes(m);
  std::vector<std::uint8_t> kinds(m), persistent(m);
  std::vector<std::uint32_t> use_counts(m), name_lengths(m);
  std::uint64_t total_uses = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const Tensor& t = trace.tensors[i];
    ids[i] = t.id;
    bytes[i] = t.bytes;
    kinds[i] = static_cast<std::uint8_t>(t.kind);
    persistent[i] = t.persistent ? 1 : 0;
    use_counts[i] = static_cast<std::uint32_t>(t.uses.size());
    name_lengths[i] = static_cast<std::uint32_t>(t.name.size());
    total_uses += t.uses.size();
  }
  w.begin_section(kTensors);
  w.scalar(std::uint64_t{m});
  w.column(ids);
  w.column(bytes);
  w.column(kinds);
  w.column(persistent);
  w.column(use_counts);
  w.column(name_lengths);
  for (const Tensor& t : trace.tensors) w.string(t.name);
  w.end_section();

  w.begin_section(kUses);
  w.scalar(total_uses);
  for (const Tensor& t : trace.tensors) w.column(t.uses);
  w.end_section();

  std::vector<std::uint32_t> held(m);
  for (std::size_t i = 0; i < m; ++i) held[i] = trace.tensors[i].held_after_use;
  w.begin_section(kHeld);
  w.scalar(std::uint64_t{m});
  w.column(held);
  w.end_section();

  std::vector<std::uint8_t> reads;
  reads.reserve(total_uses);
  for (const Tensor& t : trace.tensors)
    for (const OpIndex op : t.uses) reads.push_back(only_reads(t, op) ? 1 : 0);
  w.begin_section(kReads);
  w.scalar(std::uint64_t{reads.size()});
  w.column(reads);
  w.end_section();

  const std::uint64_t checksum = XXH64(w.bytes().data(), w.bytes().size(), 0);
  w.scalar(checksum);
  return std::move(w.bytes());
}

}  // namespace teraio::trace
