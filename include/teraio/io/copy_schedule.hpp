// io/copy_schedule: the order in which one direction's copies share the PCIe link. The planner
// and the simulator serve requests urgent first, then by earliest deadline, and let a more
// pressing request take the link over between chunks; a CUDA stream runs copies in the order
// they were issued, so an early prefetch for a far deadline would hold up every later one for a
// near deadline. The CUDA copier's dispatcher keeps its copies here and feeds the stream one
// chunk at a time in this order. Pure bookkeeping, no CUDA: tested on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

namespace teraio::io {

// How pressing a copy is. The default (urgent, deadline 0) puts a copy ahead of every planned
// one, in issue order among its kind: what a copy that something already waits for needs.
struct CopyPriority {
  bool urgent = true;
  // Smaller is sooner; only compared between copies (the runtime uses step and operator).
  std::uint64_t deadline = 0;
};

class CopySchedule {
 public:
  using Id = std::uint64_t;
  struct Chunk {
    Id id = 0;
    std::size_t offset = 0;
    std::size_t bytes = 0;
    bool last = false;  // the copy's final chunk: the copy is complete once it is
  };

  explicit CopySchedule(std::size_t chunk_bytes);

  // Adds a copy of `bytes` (0 is allowed: one empty last chunk); ids rise in issue order.
  Id add(std::size_t bytes, CopyPriority priority);
  // Hands out the next chunk of the most pressing copy that `ready` accepts, or nothing when
  // no copy is pending or none is ready. A copy whose last chunk went out leaves the schedule.
  std::optional<Chunk> next(const std::function<bool(Id)>& ready);
  // Whether next(ready) would hand out a chunk; changes nothing.
  bool has_ready(const std::function<bool(Id)>& ready) const;
  // Everything not yet handed out of copy `id`, as its last chunk (it leaves the schedule);
  // nothing for an unknown or finished id. For a copy something must wait for right away.
  std::optional<Chunk> take_rest(Id id);
  // The bytes of copy `id` not yet handed out; 0 for an unknown or finished id.
  std::size_t remaining(Id id) const;

  bool empty() const { return order_.empty(); }
  std::size_t pending() const { return order_.size(); }

 private:
  // (not urgent, deadline, id): smaller goes first.
  using Key = std::tuple<bool, std::uint64_t, Id>;
  struct Copy {
    Key key;
    std::size_t bytes = 0;
    std::size_t sent = 0;
  };

  std::size_t chunk_bytes_;
  Id next_id_ = 0;
  std::set<Key> order_;
  std::unordered_map<Id, Copy> copies_;
};

}  // namespace teraio::io
