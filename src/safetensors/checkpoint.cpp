// Sharded Hugging Face checkpoints: model.safetensors.index.json maps every tensor to the
// shard file holding it; each shard loads as one file and every mapping is checked.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/safetensors/loader.hpp"

namespace teraio::safetensors {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, cat("checkpoint index ", path, ": ", what));
}

// Shards must stay inside the index's directory: an index cannot point the loader elsewhere.
void check_shard_name(const std::string& index_path, const std::string& tensor, const std::string& shard) {
  const fs::path p(shard);
  bool escapes = shard.empty() || p.is_absolute();
  for (const fs::path& part : p) escapes = escapes || part == "..";
  if (escapes)
    fail(index_path, cat("tensor \"", tensor, "\" maps to \"", shard,
                         "\", which is not a file in the index's directory"));
}

void add_stats(LoadStats& total, const LoadStats& shard) {
  auto join = [](std::string& into, const std::string& value) {
    if (into.empty()) {
      into = value;
    } else if (into.find(value) == std::string::npos) {
      into += "+" + value;
    }
  };
  join(total.mode, shard.mode);
  join(total.backend, shard.backend);
  total.bytes += shard.bytes;
}

}  // namespace

CheckpointIndex parse_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw_errno(errno, "cannot open checkpoint index ", index_path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail(index_path, cat("not valid JSON: ", e.what()));
  }
  if (!json.is_object()) fail(index_path, "not a JSON object");
  CheckpointIndex index;
  index.path = index_path;
  index.directory = fs::path(index_path).parent_path().string();
  if (index.directory.empty()) index.directory = ".";
  if (const auto meta = json.find("metadata"); meta != json.end() && meta->is_object()) {
    // The index's metadata carries numbers ("total_size"): kept as their JSON text.
    for (const auto& [key, value] : meta->items())
      index.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  const auto map = json.find("weight_map");
  if (map == json.end() || !map->is_object()) fail(index_path, "\"weight_map\" is missing or not an object");
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string()) fail(index_path, cat("tensor \"", tensor, "\" maps to a non-string"));
    const std::string name = shard.get<std::string>();
    check_shard_name(index_path, tensor, name);
    index.weight_map[tensor] = name;
    shards.insert(name);
  }
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

std::pair<const LoadedFile*, const TensorInfo*> LoadedCheckpoint::find(std::string_view name) const {
  const auto it = index.weight_map.find(std::string(name));
  if (it == index.weight_map.end()) return {nullptr, nullptr};
  for (const LoadedFile& shard : shards) {
    if (shard.path == (fs::path(index.directory) / it->second).string()) {
      return {&shard, shard.header.find(name)};
    }
  }
  return {nullptr, nullptr};
}

LoadedCheckpoint load_index(const std::string& path, io::DeviceCopier& copier, const LoadOptions& options) {
  LoadedCheckpoint checkpoint;
  std::string index_path = path;
  if (fs::is_directory(path)) {
    index_path = (fs::path(path) / kIndexName).string();
    if (!fs::exists(index_path) && fs::exists(fs::path(path) / kSingleName)) index_path.clear();
    if (index_path.empty()) {
      checkpoint.index.path = (fs::path(path) / kSingleName).string();
      checkpoint.index.directory = path;
      checkpoint.index.shards = {std::string(kSingleName)};
    }
  } else if (fs::path(path).extension() == ".safetensors") {
    checkpoint.index.path = path;
    checkpoint.index.directory = fs::path(path).parent_path().string();
    if (checkpoint.index.directory.empty()) checkpoint.index.directory = ".";
    checkpoint.index.shards = {fs::path(path).filename().string()};
    index_path.clear();
  }
  if (!index_path.empty()) checkpoint.index = parse_index(index_path);

  for (const std::string& shard : checkpoint.index.shards) {
    const std::string shard_path = (fs::path(checkpoint.index.directory) / shard).string();
    if (!fs::exists(shard_path)) {
      throw Error(ErrorKind::kIo,
                  cat("checkpoint ", checkpoint.index.path, ": shard ", shard_path, " does not exist"),
                  ENOENT);
    }
    checkpoint.shards.push_back(load_file(shard_path, copier, options));
    const LoadedFile& loaded = checkpoint.shards.back();
    add_stats(checkpoint.stats, loaded.stats);
    checkpoint.stats.seconds += loaded.stats.seconds;
    if (index_path.empty()) {
      for (const TensorInfo& t : loaded.header.tensors) checkpoint.index.weight_map[t.name] = shard;
    }
  }
  for (const auto& [tensor, shard] : checkpoint.index.weight_map) {
    const auto [file, info] = checkpoint.find(tensor);
    if (info == nullptr) {
      throw Error(ErrorKind::kFormat, cat("checkpoint ", checkpoint.index.path, ": tensor \"", tensor,
                                          "\" is mapped to ", shard, " but that shard does not hold it"));
    }
  }
  return checkpoint;
}

}  // namespace teraio::safetensors
