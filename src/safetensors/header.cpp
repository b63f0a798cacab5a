// Header parsing and validation. The order of the checks follows the reference
// implementation, so a file is accepted here exactly when `safetensors` accepts it, except
// that duplicate keys (which serde silently collapses) are refused.
#include "teraio/safetensors/header.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"

namespace teraio::safetensors {
namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw Error(ErrorKind::kFormat, cat("safetensors file ", source, ": ", what));
}

[[noreturn]] void fail_tensor(std::string_view source, std::string_view tensor, const std::string& what) {
  throw Error(ErrorKind::kFormat, cat("safetensors file ", source, ", tensor \"", tensor, "\": ", what));
}

std::uint64_t read_le64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
  return value;
}

// Parses the JSON text, refusing duplicate keys at any depth: nlohmann keeps the last of
// them silently, which would let two tensors claim one name.
Json parse_json(std::string_view text, std::string_view source) {
  std::vector<std::set<std::string>> keys_per_object;
  std::string duplicate;
  auto callback = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: keys_per_object.emplace_back(); break;
      case Json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_per_object.empty() && !keys_per_object.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    fail(source, cat("header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) fail(source, cat("header has the key \"", duplicate, "\" more than once"));
  return json;
}

// A JSON value for an error message, cut short: a hostile header can hold megabytes in one value.
std::string excerpt(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return text;
}

std::int64_t as_dimension(const Json& value, std::string_view source, std::string_view name) {
  if (!value.is_number_unsigned())
    fail_tensor(source, name, cat("shape entry ", excerpt(value), " is not a non-negative integer"));
  const auto dim = value.get<std::uint64_t>();
  if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    fail_tensor(source, name, cat("shape entry ", dim, " is too large"));
  }
  return static_cast<std::int64_t>(dim);
}

TensorInfo parse_tensor(const std::string& name, const Json& entry, std::string_view source) {
  if (!entry.is_object()) fail_tensor(source, name, "entry is not an object");
  TensorInfo info;
  info.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string())
    fail_tensor(source, name, "\"dtype\" is missing or not a string");
  const auto parsed = parse_dtype(dtype->get_ref<const std::string&>());
  if (!parsed) fail_tensor(source, name, cat("unknown dtype \"", dtype->get_ref<const std::string&>(), "\""));
  info.dtype = *parsed;
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array())
    fail_tensor(source, name, "\"shape\" is missing or not an array");
  info.shape.reserve(shape->size());
  for (const Json& dim : *shape) info.shape.push_back(as_dimension(dim, source, name));
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    fail_tensor(source, name, "\"data_offsets\" is missing or not two non-negative integers");
  }
  info.begin = (*offsets)[0].get<std::uint64_t>();
  info.end = (*offsets)[1].get<std::uint64_t>();
  return info;
}

std::map<std::string, std::string> parse_metadata(const Json& value, std::string_view source) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) fail(source, "\"__metadata__\" is not an object");
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(source, cat("\"__metadata__\" value of \"", key, "\" is not a string"));
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// The data region must be covered exactly: tensors in offset order, each starting where the
// previous one ended, each as long as its shape and dtype say, the last ending at the file's end.
void validate_layout(Header& header, std::string_view source, std::uint64_t file_size) {
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expected_begin = 0;
  for (const TensorInfo& t : header.tensors) {
    if (t.end < t.begin)
      fail_tensor(source, t.name, cat("data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
    if (t.begin != expected_begin) {
      fail_tensor(source, t.name,
                  cat("data_offsets [", t.begin, ", ", t.end, "] ",
                      t.begin < expected_begin ? "overlap" : "leave a hole after",
                      " the previous tensor, which ends at ", expected_begin));
    }
    const auto bytes = tensor_bytes(t.dtype, t.shape);
    if (!bytes)
      fail_tensor(source, t.name,
                  cat("shape × ", dtype_name(t.dtype), " overflows or is not a whole number of bytes"));
    if (*bytes != t.end - t.begin) {
      fail_tensor(source, t.name,
                  cat("shape × ", dtype_name(t.dtype), " is ", *bytes, " bytes but data_offsets [", t.begin,
                      ", ", t.end, "] hold ", t.end - t.begin));
    }
    expected_begin = t.end;
  }
  header.data_bytes = expected_begin;
  const std::uint64_t region = file_size - header.data_offset;
  if (header.data_bytes != region) {
    const std::string last = header.tensors.empty() ? std::string("(none)") : header.tensors.back().name;
    fail(source, cat("the tensors cover ", header.data_bytes, " bytes but the data region holds ", region,
                     " (last tensor \"", last, "\"): the file is truncated or has trailing bytes"));
  }
}

}  // namespace

std::uint64_t TensorInfo::numel() const {
  std::uint64_t n = 1;
  for (const std::int64_t dim : shape) n *= static_cast<std::uint64_t>(dim);
  return n;
}

const TensorInfo* Header::find(std::string_view name) const {
  if (index.size() == tensors.size()) {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
  for (const TensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Header parse_header(std::span<const std::byte> bytes, std::string_view source_name, std::uint64_t file_size) {
  if (file_size < 8)
    fail(source_name, cat("file of ", file_size, " bytes is too small for the 8-byte header length"));
  if (bytes.size() < 8)
    fail(source_name,
         cat("only ", bytes.size(), " bytes of the file were given, fewer than its 8-byte header length"));
  Header header;
  header.header_bytes = read_le64(bytes);
  if (header.header_bytes > kMaxHeaderBytes) {
    fail(source_name,
         cat("header length ", header.header_bytes, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header.header_bytes > file_size - 8) {
    fail(source_name, cat("header length ", header.header_bytes, " exceeds the ", file_size - 8,
                          " bytes after the length"));
  }
  if (bytes.size() - 8 < header.header_bytes) {
    fail(source_name,
         cat("only ", bytes.size() - 8, " of the ", header.header_bytes, " header bytes were given"));
  }
  header.data_offset = 8 + header.header_bytes;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header.header_bytes);
  if (text.empty() || text.front() != '{') fail(source_name, "header does not start with '{'");
  const Json json = parse_json(text, source_name);
  if (!json.is_object()) fail(source_name, "header is not a JSON object");
  for (const auto& [name, entry] : json.items()) {
    if (name == kMetadataKey) {
      header.metadata = parse_metadata(entry, source_name);
    } else {
      header.tensors.push_back(parse_tensor(name, entry, source_name));
    }
  }
  validate_layout(header, source_name, file_size);
  for (std::size_t i = 0; i < header.tensors.size(); ++i) header.index.emplace(header.tensors[i].name, i);
  return header;
}

Header read_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "cannot open safetensors file ", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(errno, "cannot stat ", path);
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<std::byte> bytes(8);
  auto read_exact = [&](std::byte* dst, std::size_t n, std::uint64_t offset) {
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw_errno(errno, "cannot read ", n, " bytes at offset ", offset, " of ", path);
      if (got == 0) fail(path, cat("file ends at ", offset + done, " while reading its header"));
      done += static_cast<std::size_t>(got);
    }
  };
  if (file_size < 8) return parse_header(bytes, path, file_size);
  read_exact(bytes.data(), 8, 0);
  const std::uint64_t n = read_le64(bytes);
  // Validate the length before allocating for it: parse_header refuses it with the right message.
  if (n > kMaxHeaderBytes || n > file_size - 8) return parse_header(bytes, path, file_size);
  bytes.resize(8 + n);
  read_exact(bytes.data() + 8, n, 8);
  return parse_header(bytes, path, file_size);
}

}  // namespace teraio::safetensors
