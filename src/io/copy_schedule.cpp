#include "teraio/io/copy_schedule.hpp"

#include <algorithm>

#include "teraio/core/error.hpp"

namespace teraio::io {

CopySchedule::CopySchedule(std::size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunk_bytes_ == 0)
    throw Error(ErrorKind::kInvalidArgument, "a copy schedule needs a chunk size above 0");
}

CopySchedule::Id CopySchedule::add(std::size_t bytes, CopyPriority priority) {
  const Id id = next_id_++;
  const Key key{!priority.urgent, priority.deadline, id};
  copies_.emplace(id, Copy{key, bytes, 0});
  order_.insert(key);
  return id;
}

std::optional<CopySchedule::Chunk> CopySchedule::next(const std::function<bool(Id)>& ready) {
  for (const Key& key : order_) {
    const Id id = std::get<2>(key);
    if (!ready(id)) continue;
    Copy& copy = copies_.at(id);
    Chunk chunk{id, copy.sent, std::min(chunk_bytes_, copy.bytes - copy.sent), false};
    copy.sent += chunk.bytes;
    if (copy.sent == copy.bytes) {
      chunk.last = true;
      order_.erase(key);  // `key` dies here: nothing below reads it
      copies_.erase(id);
    }
    return chunk;
  }
  return std::nullopt;
}

bool CopySchedule::has_ready(const std::function<bool(Id)>& ready) const {
  return std::any_of(order_.begin(), order_.end(), [&](const Key& key) { return ready(std::get<2>(key)); });
}

std::optional<CopySchedule::Chunk> CopySchedule::take_rest(Id id) {
  auto found = copies_.find(id);
  if (found == copies_.end()) return std::nullopt;
  const Copy& copy = found->second;
  const Chunk chunk{id, copy.sent, copy.bytes - copy.sent, true};
  order_.erase(copy.key);
  copies_.erase(found);
  return chunk;
}

std::size_t CopySchedule::remaining(Id id) const {
  const auto found = copies_.find(id);
  return found == copies_.end() ? 0 : found->second.bytes - found->second.sent;
}

}  // namespace teraio::io
