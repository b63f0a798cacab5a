#include <cstdio>

#include "command.hpp"
#include "teraio/core/error.hpp"
#include "teraio/core/options.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/synth.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::cli {
namespace {

std::uint32_t dimension(const Options& opts, const char* name, std::uint32_t current) {
  if (!opts.has(name)) return current;
  const std::int64_t v = opts.integer(name);
  if (v <= 0 || v > 0xffffffffLL)
    throw Error(ErrorKind::kInvalidArgument, cat("--", name, " must be positive"));
  return static_cast<std::uint32_t>(v);
}

int run_synth(const std::vector<std::string>& args) {
  Options opts("synth", "generate a synthetic training-step trace of a Llama-style transformer");
  opts.add("preset", "model preset: w1, w2, w3, llama3-8b, llama3-70b (fields below override it)", "w1");
  opts.add("gpu", "GPU preset for operator times: h100, h200", "h100");
  opts.add("output", "trace file to write (.json, or binary otherwise); -o works too");
  opts.add("layers", "decoder layers");
  opts.add("hidden", "hidden size");
  opts.add("heads", "attention heads");
  opts.add("kv-heads", "key/value heads (grouped-query attention)");
  opts.add("ffn", "MLP intermediate size");
  opts.add("vocab", "vocabulary size");
  opts.add("micro-batch", "sequences per micro-batch");
  opts.add("seq-len", "tokens per sequence");
  opts.add("micro-batches", "micro-batches per optimizer step (gradient accumulation)");
  opts.add("precision", "fp32, bf16-autocast (fp32 parameters) or bf16");
  opts.add("optimizer", "adamw or sgd");
  opts.add_flag("optimizer-in-backward",
                "each parameter's optimizer step right after its gradient is complete in the last "
                "micro-batch's backward pass, not after it");
  opts.add("matmul-efficiency", "override the GPU preset's matmul calibration (share of peak)");
  opts.add("memory-efficiency", "override the GPU preset's memory-bandwidth calibration (share of peak)");
  std::vector<std::string> normalized = args;
  for (auto& a : normalized)
    if (a == "-o") a = "--output";
  if (!opts.parse(normalized)) {
    std::printf("%s", opts.help().c_str());
    return 0;
  }
  plan::ModelConfig m = plan::model_preset(opts.str("preset"));
  const plan::ModelConfig preset = m;
  m.layers = dimension(opts, "layers", m.layers);
  m.hidden = dimension(opts, "hidden", m.hidden);
  m.heads = dimension(opts, "heads", m.heads);
  m.kv_heads = dimension(opts, "kv-heads", m.kv_heads);
  m.ffn = dimension(opts, "ffn", m.ffn);
  m.vocab = dimension(opts, "vocab", m.vocab);
  m.micro_batch = dimension(opts, "micro-batch", m.micro_batch);
  m.seq_len = dimension(opts, "seq-len", m.seq_len);
  m.micro_batches = dimension(opts, "micro-batches", m.micro_batches);
  if (opts.has("precision")) m.precision = plan::parse_precision(opts.str("precision"));
  if (opts.has("optimizer")) m.optimizer = plan::parse_optimizer(opts.str("optimizer"));
  m.optimizer_in_backward = opts.flag("optimizer-in-backward");
  if (m.layers != preset.layers || m.hidden != preset.hidden || m.ffn != preset.ffn ||
      m.heads != preset.heads || m.kv_heads != preset.kv_heads || m.vocab != preset.vocab)
    m.name = preset.name + "-custom";
  plan::GpuModel gpu = plan::gpu_preset(opts.str("gpu"));
  if (opts.has("matmul-efficiency")) gpu.matmul_efficiency = opts.number("matmul-efficiency");
  if (opts.has("memory-efficiency")) gpu.memory_efficiency = opts.number("memory-efficiency");

  const trace::Trace t = plan::synthesize(m, gpu);
  const plan::SynthSummary s = plan::summarize(m, t);
  std::printf("%s\n", t.source.c_str());
  std::printf("  operators        %zu\n", s.ops);
  std::printf("  tensors          %zu\n", s.tensors);
  std::printf("  parameters       %.3f B\n", double(s.parameters) / 1e9);
  std::printf("  model states     %s (parameters, gradients, optimizer states)\n",
              format_bytes(s.model_state_bytes).c_str());
  std::printf("  step time        %s (forward %s, backward %s, optimizer %s)\n",
              format_duration(s.step_time_s).c_str(), format_duration(s.forward_s).c_str(),
              format_duration(s.backward_s).c_str(), format_duration(s.optimizer_s).c_str());
  std::printf("  peak memory      %s at operator %u (%s)\n", format_bytes(s.peak_memory).c_str(), s.peak_op,
              t.ops.empty() ? "" : t.ops[s.peak_op].name.c_str());
  if (opts.has("output")) {
    const std::string out = opts.str("output");
    trace::save_trace(t, out);
    std::printf("  written to       %s\n", out.c_str());
  }
  return 0;
}

const CommandRegistration kRegistration{
    "synth", "generate a synthetic LLM training trace (roofline op times)", run_synth};

}  // namespace
}  // namespace teraio::cli
