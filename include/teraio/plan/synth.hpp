// plan/synth: synthetic lifetime traces of decoder-only (Llama-style) transformer training
// steps, built from a model configuration and a GPU model, with operator times from a
// roofline model. It lets users plan for models and GPUs they do not have, and gives tests
// and benchmarks realistic large inputs (Llama3-70B: about a quarter of a million operators).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/trace/trace.hpp"

namespace teraio::plan {

// kFp32: fp32 everywhere (matmuls on TF32 tensor cores). kBf16Autocast: fp32 parameters,
// bf16 matmuls through torch.autocast (weights and matmul inputs cast per micro-batch).
// kBf16: bf16 parameters and activations. Gradients and optimizer states are fp32 in all.
enum class Precision : std::uint8_t { kFp32, kBf16Autocast, kBf16 };
// AdamW keeps two fp32 states per parameter; SGD with momentum keeps one.
enum class Optimizer : std::uint8_t { kAdamW, kSgd };

std::string_view to_string(Precision precision);
std::string_view to_string(Optimizer optimizer);
// Inverse of to_string ("fp32", "bf16-autocast", "bf16"; "adamw", "sgd"); throws Error{kInvalidArgument}.
Precision parse_precision(std::string_view name);
Optimizer parse_optimizer(std::string_view name);

struct ModelConfig {
  std::string name = "custom";
  std::uint32_t layers = 2;
  std::uint32_t hidden = 256;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 4;
  std::uint32_t ffn = 688;
  std::uint32_t vocab = 32000;
  std::uint32_t micro_batch = 1;    // sequences per micro-batch
  std::uint32_t seq_len = 128;      // tokens per sequence
  std::uint32_t micro_batches = 1;  // micro-batches per optimizer step (gradient accumulation)
  Precision precision = Precision::kBf16Autocast;
  Optimizer optimizer = Optimizer::kAdamW;
  // Each parameter's optimizer operator right after its gradient is complete in the last
  // micro-batch's backward pass (PyTorch's register_post_accumulate_grad_hook recipe), instead
  // of all of them after it: its states may then move while earlier layers run their backward.
  bool optimizer_in_backward = false;

  // Throws Error{kInvalidArgument} for a zero dimension or heads that do not divide evenly.
  void validate() const;
};

// Parameters of the model (embedding and LM head untied, RMSNorm weights included):
// L * (2*h*h + 2*h*h*kv/heads + 3*h*f + 2*h) + 2*V*h + h.
std::uint64_t parameter_count(const ModelConfig& model);

struct GpuModel {
  std::string name = "custom";
  double bf16_flops = 790e12;        // dense bf16 matrix rate, FLOP/s
  double fp32_flops = 395e12;        // dense fp32 matrix rate on TF32 tensor cores, FLOP/s
  double memory_bandwidth = 3.0e12;  // device copy bandwidth counting read + write, bytes/s
  double kernel_overhead_s = 4e-6;   // launch and tail cost added to every operator
  // Calibration: the share of peak that real kernels reach. Fitted per preset to the
  // measured PyTorch step times of shared/WORKLOADS.md (see the README).
  double matmul_efficiency = 1.0;
  double memory_efficiency = 1.0;
  std::uint64_t memory_bytes = 0;  // device memory, for reporting
};

// Presets: "llama3-8b", "llama3-70b", "w1", "w2", "w3" (case-insensitive).
ModelConfig model_preset(std::string_view name);
std::vector<std::string> model_preset_names();
// Presets: "h100", "h200".
GpuModel gpu_preset(std::string_view name);
std::vector<std::string> gpu_preset_names();

// One training step: for each micro-batch the forward pass (embedding, per layer RMSNorm,
// Q/K/V/O projections, RoPE, SDPA, residual adds, RMSNorm, gate/up/down MLP with SiLU, then
// final norm, LM head and cross-entropy) and the backward pass mirroring it, then one
// optimizer operator per parameter. Tensor ids are stable hashes of meaningful names
// ("layers.3.mlp.up_proj.weight", "mb2.layers.3.attn.q_out"), so they do not change when the
// config grows; validate(trace) holds.
trace::Trace synthesize(const ModelConfig& model, const GpuModel& gpu);

// Numbers a user wants to see before planning.
struct SynthSummary {
  std::size_t ops = 0;
  std::size_t tensors = 0;
  std::uint64_t parameters = 0;
  std::uint64_t model_state_bytes = 0;  // parameters + gradients + optimizer states
  double step_time_s = 0;               // sum of operator durations (the ideal step time)
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  std::uint64_t peak_memory = 0;  // peak memory demand without migrations
  trace::OpIndex peak_op = 0;
};
SynthSummary summarize(const ModelConfig& model, const trace::Trace& trace);

}  // namespace teraio::plan
