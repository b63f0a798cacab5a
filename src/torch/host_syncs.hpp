// torch/host_syncs: operators that make the host wait for the device. After one, the GPU's
// queue is empty, and it waits while the host launches again through TeraIO's callbacks: on W3
// two such syncs at each micro-batch's start (a copy of the inputs from pageable memory, and
// transformers' packed-sequence check, `.all()` in a Python `if`) cost ~40 ms of GPU time each
// time (bench/RESULTS.md, session 39), where the same syncs cost the run without TeraIO little.
// The session counts them per step so that a training loop's syncs are seen, not guessed.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/Device.h>

#include <string_view>

namespace teraio::torch_binding {

// Why the operator makes the host wait for `device` (a short phrase), or an empty view:
// - aten::_local_scalar_dense of a tensor on the device: .item(), bool(), a tensor in a Python
//   `if` (nested in aten::item or aten::is_nonzero, which are not counted again);
// - aten::nonzero of a tensor on the device, whose output size is read (boolean indexing and
//   masked_select run it inside, and are not counted again);
// - aten::copy_ between the device and the CPU with non_blocking=False (.to(), .cpu(), a copy
//   from pageable memory): the host waits for the stream.
// Not counted: non-blocking copies into pageable memory, which wait too, and explicit
// synchronizations (torch.cuda.synchronize), which are not operators. Counted only while the
// session observes operators: a passive session (everything fits) has no callbacks to wait for.
// A sync inside another (the second copy_ of a non-contiguous copy) is not counted again; syncs
// on other threads during the step (a data loader's) are, though they hold up only that thread.
std::string_view host_sync(const at::RecordFunction& fn, const c10::Device& device);

}  // namespace teraio::torch_binding
