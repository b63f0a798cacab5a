// Bringing the tensors a session moved off the device back: for session.resident()'s count,
// when the session goes passive, and when it closes.
#include <algorithm>

#include "observer.hpp"
#include "session.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"

namespace teraio::torch_binding {
namespace {

// A close() that failed, said with what it had to do and how far it got: W3's failure named
// only the tensor the device had no room for, not that most of the model states were away.
std::string why_close_failed(const Error& error, const c10::Device& device, std::uint64_t away,
                             std::uint64_t still_away) {
  std::string why =
      cat("session.close() brings every tensor the session moved off ", device.str(),
          " back to it and could not: ", format_bytes(away), " were away, ",
          format_bytes(away - std::min(away, still_away)), " came back before this: ", error.what(),
          ". The session stays open with nothing lost: training goes on under it, and a later close() can "
          "succeed.");
  if (error.kind() == ErrorKind::kOutOfMemory)
    why +=
        cat(" The device has no room for every tensor still alive: delete those you are done with (the "
            "model and its optimizer, once saved) before close(), or keep the session open until the "
            "process ends.");
  return why;
}

}  // namespace

void Session::bring_everything_back() {
  executor_->set_mode(runtime::Mode::kPassive);
  // A prefetch that failed after its step already ended with an error left its tensor in the
  // tier: the fetches below bring it back, so its failure is only logged here.
  executor_->drain_keeping_valid();
  remove_dead();
  const std::vector<TensorId> all = tracked_ids({});
  // A fetch that fails part-way (a close() that runs out of device memory) leaves the session
  // open with these back: the next planned step positions again.
  position_due_ = true;
  executor_->fetch(all);
  // Unobserved from here on: writes would go unseen, so no copy may stay kept.
  executor_->written(all);
  memory_->hand_back_settled(*executor_);
}

void Session::stop_with_everything_back() {
  // Tensors outlive the observer: every storage gets its bytes back before it goes.
  const std::uint64_t away = offloaded_bytes({});
  try {
    bring_everything_back();
  } catch (const Error& error) {
    throw Error(error.kind(), why_close_failed(error, device_, away, offloaded_bytes({})), error.sys_errno());
  }
  for (const TensorId id : tracked_ids({})) executor_->remove_tensor(id);
  table_.clear();
  stop_observing(slot_);
  observing_ = false;
}

std::uint64_t Session::offloaded_bytes(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(mutex_);
  if (!observing_) return 0;
  std::uint64_t bytes = 0;
  for (const TensorId id : tracked_ids(tensors)) {
    const runtime::Location where = executor_->location(id);
    if (where == runtime::Location::kHost || where == runtime::Location::kSsd) {
      if (c10::StorageImpl* impl = table_.find_id(id)) bytes += impl->nbytes();
    }
  }
  return bytes;
}

void Session::close() {
  std::lock_guard lock(mutex_);
  if (phase_ == SessionPhase::kClosed) return;
  if (hole_) hole_->release();
  if (observing_) stop_with_everything_back();
  executor_.reset();
  memory_.reset();
  table_.clear();
  closed_engine_report_ = io::format_report(store_->report());
  store_.reset();
  copy_holds_.reset();  // no copies of this session's to hold
  phase_ = SessionPhase::kClosed;
  if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
}

}  // namespace teraio::torch_binding
