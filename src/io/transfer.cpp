#include "teraio/io/transfer.hpp"

#include <atomic>

#include "teraio/core/error.hpp"

namespace teraio::io {
namespace {

std::atomic<std::uint64_t> g_finished{0};

}  // namespace

void TransferState::finish(std::exception_ptr failure) {
  {
    std::lock_guard lock(mutex);
    error = std::move(failure);
    done = true;
  }
  // Counted after `done`, so that a count read later covers it (see finished_count()).
  g_finished.fetch_add(1, std::memory_order_release);
  finished.notify_all();
}

std::uint64_t Transfer::finished_count() {
  return g_finished.load(std::memory_order_acquire);
}

void Transfer::wait() const {
  if (!state_) throw Error(ErrorKind::kInvalidArgument, "wait() on an empty Transfer");
  std::unique_lock lock(state_->mutex);
  state_->finished.wait(lock, [this] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Transfer::ready() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

bool Transfer::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) return false;
  std::unique_lock lock(state_->mutex);
  return state_->finished.wait_for(lock, timeout, [this] { return state_->done; });
}

}  // namespace teraio::io
