// torch/observer: the one set of RecordFunction callbacks through which sessions see every
// operator (no patched PyTorch). RecordFunction is chosen over __torch_dispatch__ modes and
// autograd hooks because it fires in C++ for every dispatcher operator on every thread —
// forward, the autograd engine's backward threads and the optimizer alike — with inputs and
// outputs, on PyTorch 1.13 and 2.x, and costs nothing once removed. Sessions register in a
// small fixed registry so the callbacks (plain function pointers) can find them.
#pragma once

namespace teraio::torch_binding {

class Session;

// Adds a session; the callbacks are installed with the first one. Returns its slot.
// Throws Error{kUnsupported} when the registry is full.
int observe(Session* session);
// Removes a session; the callbacks are removed with the last one.
void stop_observing(int slot);

}  // namespace teraio::torch_binding
