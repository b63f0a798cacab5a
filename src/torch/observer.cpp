#include "observer.hpp"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "session.hpp"
#include "teraio/core/error.hpp"

namespace teraio::torch_binding {
namespace {

constexpr int kMaxSessions = 8;

std::array<std::atomic<Session*>, kMaxSessions> g_sessions{};
std::mutex g_registry_mutex;
int g_observed = 0;
at::CallbackHandle g_handle = 0;

// Per thread: how deep in aten operators, autograd backward functions and optimizer steps we
// are (the phase of an operator), and each session's operator in progress.
struct ThreadState {
  int depth = 0;
  int backward = 0;
  int optimizer = 0;
  std::array<Session::OpState, kMaxSessions> ops;
};
thread_local ThreadState t_state;

// The autograd engine wraps each backward node in a FUNCTION-scope record that is not an
// operator; the operators it runs are the backward pass's top-level operators.
bool is_backward_node(const at::RecordFunction& fn) {
  const char* name = fn.name();
  return name != nullptr && std::strncmp(name, "autograd::engine::evaluate_function", 35) == 0;
}

bool is_optimizer_scope(const at::RecordFunction& fn) {
  const char* name = fn.name();
  return name != nullptr && std::strncmp(name, "Optimizer.step", 14) == 0;
}

trace::Phase current_phase(const ThreadState& state) {
  if (state.optimizer > 0) return trace::Phase::kOptimizer;
  if (state.backward > 0) return trace::Phase::kBackward;
  return trace::Phase::kForward;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& state = t_state;
  switch (fn.scope()) {
    case at::RecordScope::BACKWARD_FUNCTION: ++state.backward; return nullptr;
    case at::RecordScope::USER_SCOPE:
      if (is_optimizer_scope(fn)) ++state.optimizer;
      return nullptr;
    case at::RecordScope::FUNCTION: {
      if (!fn.operator_name()) {
        if (is_backward_node(fn)) ++state.backward;
        return nullptr;
      }
      const int depth = state.depth++;
      const trace::Phase phase = current_phase(state);
      for (int i = 0; i < kMaxSessions; ++i) {
        if (Session* session = g_sessions[static_cast<std::size_t>(i)].load(std::memory_order_acquire)) {
          const TimedNs clock(session->callback_ns());  // also when it returns early
          session->on_op_start(fn, state.ops[static_cast<std::size_t>(i)], depth, phase);
        }
      }
      return nullptr;
    }
    default: return nullptr;
  }
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& state = t_state;
  switch (fn.scope()) {
    case at::RecordScope::BACKWARD_FUNCTION:
      if (state.backward > 0) --state.backward;
      return;
    case at::RecordScope::USER_SCOPE:
      if (is_optimizer_scope(fn) && state.optimizer > 0) --state.optimizer;
      return;
    case at::RecordScope::FUNCTION: {
      if (!fn.operator_name()) {
        if (is_backward_node(fn) && state.backward > 0) --state.backward;
        return;
      }
      if (state.depth > 0) --state.depth;
      for (int i = 0; i < kMaxSessions; ++i) {
        if (Session* session = g_sessions[static_cast<std::size_t>(i)].load(std::memory_order_acquire)) {
          const TimedNs clock(session->callback_ns());  // also when it returns early
          session->on_op_end(fn, state.ops[static_cast<std::size_t>(i)], state.depth);
        }
      }
      return;
    }
    default: return;
  }
}

}  // namespace

int observe(Session* session) {
  std::lock_guard lock(g_registry_mutex);
  for (int i = 0; i < kMaxSessions; ++i) {
    auto& slot = g_sessions[static_cast<std::size_t>(i)];
    if (slot.load() == nullptr) {
      slot.store(session, std::memory_order_release);
      if (g_observed++ == 0) {
        g_handle =
            at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                      .needsInputs(true)
                                      .needsOutputs(true)
                                      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                               at::RecordScope::USER_SCOPE}));
      }
      return i;
    }
  }
  throw Error(ErrorKind::kUnsupported,
              "too many TeraIO sessions in this process (at most 8, one per device)");
}

void stop_observing(int slot) {
  std::lock_guard lock(g_registry_mutex);
  if (slot < 0 || slot >= kMaxSessions) return;
  auto& entry = g_sessions[static_cast<std::size_t>(slot)];
  if (entry.load() == nullptr) return;
  entry.store(nullptr, std::memory_order_release);
  if (--g_observed == 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

}  // namespace teraio::torch_binding
