#include <functional>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/synth.hpp"

namespace teraio::plan {
namespace {

// Share of peak reached by the measured PyTorch steps (calibration, see GpuModel).
constexpr double kMatmulEfficiency = 0.86;
constexpr double kMemoryEfficiency = 0.37;

ModelConfig llama(std::string name, std::uint32_t layers, std::uint32_t hidden, std::uint32_t heads,
                  std::uint32_t kv_heads, std::uint32_t ffn, std::uint32_t vocab, std::uint32_t micro_batch,
                  std::uint32_t seq_len, std::uint32_t micro_batches, Precision precision) {
  ModelConfig m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.micro_batch = micro_batch;
  m.seq_len = seq_len;
  m.micro_batches = micro_batches;
  m.precision = precision;
  m.optimizer = Optimizer::kAdamW;
  return m;
}

struct ModelPreset {
  const char* name;
  std::function<ModelConfig()> make;
};

const std::vector<ModelPreset>& model_presets() {
  // W1-W3 are the end-to-end workloads of shared/WORKLOADS.md. The Llama3 presets train in
  // fp32 as the paper does; Llama3-70B's gradient accumulation is chosen so that its step has
  // about 250k operators, the scale the paper reports for it.
  static const std::vector<ModelPreset> presets{
      {"w1", [] { return llama("W1", 16, 2048, 16, 16, 5632, 32000, 8, 2048, 1, Precision::kBf16Autocast); }},
      {"w2", [] { return llama("W2", 8, 4096, 32, 8, 14336, 32000, 1, 4096, 16, Precision::kBf16Autocast); }},
      {"w3", [] { return llama("W3", 32, 4096, 32, 8, 14336, 128256, 1, 2048, 32, Precision::kFp32); }},
      {"llama3-8b",
       [] { return llama("Llama3-8B", 32, 4096, 32, 8, 14336, 128256, 1, 2048, 16, Precision::kFp32); }},
      {"llama3-70b",
       [] { return llama("Llama3-70B", 80, 8192, 64, 8, 28672, 128256, 1, 2048, 84, Precision::kFp32); }},
  };
  return presets;
}

struct GpuPreset {
  const char* name;
  std::function<GpuModel()> make;
};

const std::vector<GpuPreset>& gpu_presets() {
  // Rates measured on the project's machines (shared/WORKLOADS.md): 798 TFLOP/s dense bf16
  // on an H100, TF32 at about half of that, device copies at 3.0 TB/s (read + write). The
  // efficiencies calibrate the roofline to PyTorch's measured W1 and W2 step times.
  static const std::vector<GpuPreset> presets{
      {"h100",
       [] {
         GpuModel g;
         g.name = "H100";
         g.bf16_flops = 790e12;
         g.fp32_flops = 395e12;
         g.memory_bandwidth = 3.0e12;
         g.matmul_efficiency = kMatmulEfficiency;
         g.memory_efficiency = kMemoryEfficiency;
         g.memory_bytes = 80 * kGiB;
         return g;
       }},
      {"h200",
       [] {
         GpuModel g;
         g.name = "H200";
         g.bf16_flops = 790e12;
         g.fp32_flops = 395e12;
         g.memory_bandwidth = 4.3e12;
         g.matmul_efficiency = kMatmulEfficiency;
         g.memory_efficiency = kMemoryEfficiency;
         g.memory_bytes = 140 * kGiB;
         return g;
       }},
  };
  return presets;
}

}  // namespace

std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16Autocast: return "bf16-autocast";
    case Precision::kBf16: return "bf16";
  }
  return "fp32";
}

std::string_view to_string(Optimizer optimizer) {
  return optimizer == Optimizer::kAdamW ? "adamw" : "sgd";
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16Autocast, Precision::kBf16})
    if (to_string(p) == to_lower(name)) return p;
  throw Error(ErrorKind::kInvalidArgument, cat("unknown precision '", name, "' (fp32, bf16-autocast, bf16)"));
}

Optimizer parse_optimizer(std::string_view name) {
  for (Optimizer o : {Optimizer::kAdamW, Optimizer::kSgd})
    if (to_string(o) == to_lower(name)) return o;
  throw Error(ErrorKind::kInvalidArgument, cat("unknown optimizer '", name, "' (adamw, sgd)"));
}

void ModelConfig::validate() const {
  if (layers == 0 || hidden == 0 || heads == 0 || kv_heads == 0 || ffn == 0 || vocab == 0 ||
      micro_batch == 0 || seq_len == 0 || micro_batches == 0)
    throw Error(ErrorKind::kInvalidArgument, cat("model '", name, "': every dimension must be positive"));
  if (hidden % heads != 0 || heads % kv_heads != 0)
    throw Error(ErrorKind::kInvalidArgument,
                cat("model '", name, "': hidden ", hidden, " must divide by heads ", heads,
                    " and heads by KV heads ", kv_heads));
}

std::uint64_t parameter_count(const ModelConfig& m) {
  const std::uint64_t h = m.hidden;
  const std::uint64_t kv = h * m.kv_heads / m.heads;
  const std::uint64_t per_layer = 2 * h * h + 2 * h * kv + 3 * h * m.ffn + 2 * h;
  return m.layers * per_layer + 2 * std::uint64_t{m.vocab} * h + h;
}

ModelConfig model_preset(std::string_view name) {
  for (const auto& p : model_presets())
    if (p.name == to_lower(name)) return p.make();
  throw Error(ErrorKind::kInvalidArgument,
              cat("unknown model preset '", name, "' (w1, w2, w3, llama3-8b, llama3-70b)"));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : model_presets()) names.emplace_back(p.name);
  return names;
}

GpuModel gpu_preset(std::string_view name) {
  for (const auto& p : gpu_presets())
    if (p.name == to_lower(name)) return p.make();
  throw Error(ErrorKind::kInvalidArgument, cat("unknown GPU preset '", name, "' (h100, h200)"));
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : gpu_presets()) names.emplace_back(p.name);
  return names;
}

}  // namespace teraio::plan
