#include <gtest/gtest.h>

#include <set>

#include "teraio/core/error.hpp"
#include "teraio/core/units.hpp"
#include "teraio/plan/synth.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

ModelConfig tiny(std::uint32_t layers = 2, std::uint32_t micro_batches = 1) {
  ModelConfig m;
  m.name = "tiny";
  m.layers = layers;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 160;
  m.vocab = 1000;
  m.micro_batch = 2;
  m.seq_len = 32;
  m.micro_batches = micro_batches;
  return m;
}

const trace::Tensor* find(const trace::Trace& t, const std::string& name) {
  for (const auto& x : t.tensors)
    if (x.name == name) return &x;
  return nullptr;
}

TEST(Synth, CountsGrowLinearlyWithLayersAndMicroBatches) {
  const GpuModel gpu = gpu_preset("h100");
  for (const Precision p : {Precision::kFp32, Precision::kBf16Autocast, Precision::kBf16}) {
    std::size_t ops[4], tensors[4];
    for (std::uint32_t l = 1; l <= 3; ++l) {
      ModelConfig m = tiny(l);
      m.precision = p;
      const auto t = synthesize(m, gpu);
      ops[l] = t.ops.size();
      tensors[l] = t.tensors.size();
    }
    EXPECT_EQ(ops[3] - ops[2], ops[2] - ops[1]) << to_string(p);
    EXPECT_EQ(tensors[3] - tensors[2], tensors[2] - tensors[1]) << to_string(p);
    std::size_t mops[4], mtensors[4];
    for (std::uint32_t mb = 1; mb <= 3; ++mb) {
      ModelConfig m = tiny(2, mb);
      m.precision = p;
      const auto t = synthesize(m, gpu);
      mops[mb] = t.ops.size();
      mtensors[mb] = t.tensors.size();
    }
    EXPECT_EQ(mops[3] - mops[2], mops[2] - mops[1]) << to_string(p);
    EXPECT_EQ(mtensors[3] - mtensors[2], mtensors[2] - mtensors[1]) << to_string(p);
    // Persistent tensors do not multiply with micro-batches: 9 parameters per layer + 3, each with a
    // gradient and two AdamW states.
    const auto one = synthesize(tiny(2, 1), gpu);
    std::size_t persistent = 0;
    for (const auto& x : one.tensors) persistent += x.persistent ? 1 : 0;
    EXPECT_EQ(persistent, (9u * 2 + 3) * 4);
  }
}

TEST(Synth, IdsAreUniqueStableAndNamed) {
  const GpuModel gpu = gpu_preset("h100");
  const auto a = synthesize(tiny(2, 2), gpu);
  const auto b = synthesize(tiny(2, 2), gpu);
  EXPECT_EQ(a, b);  // deterministic
  std::set<trace::TensorId> ids;
  for (const auto& x : a.tensors) EXPECT_TRUE(ids.insert(x.id).second) << x.name;
  const auto bigger = synthesize(tiny(4, 3), gpu);
  for (const char* name : {"layers.1.mlp.up_proj.weight", "layers.0.attn.q_proj.weight.grad",
                           "mb1.layers.1.attn.q_out", "mb0.layers.0.mlp.gate_out"}) {
    const auto* x = find(a, name);
    const auto* y = find(bigger, name);
    ASSERT_NE(x, nullptr) << name;
    ASSERT_NE(y, nullptr) << name;
    EXPECT_EQ(x->id, y->id) << name;
  }
}

TEST(Synth, ParameterBytesMatchTheAnalyticCount) {
  const ModelConfig l8 = model_preset("llama3-8b");
  // Llama3-8B: 8.03 B parameters.
  EXPECT_NEAR(double(parameter_count(l8)), 8.03e9, 0.01e9);
  const std::uint64_t h = 4096, f = 14336, kv = 1024, L = 32, V = 128256;
  EXPECT_EQ(parameter_count(l8), L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * V * h + h);
  for (const Precision p : {Precision::kFp32, Precision::kBf16}) {
    ModelConfig m = tiny(3);
    m.precision = p;
    const auto t = synthesize(m, gpu_preset("h100"));
    std::uint64_t param_bytes = 0, grad_bytes = 0, state_bytes = 0;
    for (const auto& x : t.tensors) {
      if (x.kind == trace::TensorKind::kParameter) param_bytes += x.bytes;
      if (x.kind == trace::TensorKind::kGradient) grad_bytes += x.bytes;
      if (x.kind == trace::TensorKind::kOptimizerState) state_bytes += x.bytes;
    }
    EXPECT_EQ(param_bytes, parameter_count(m) * (p == Precision::kBf16 ? 2 : 4));
    EXPECT_EQ(grad_bytes, parameter_count(m) * 4);
    EXPECT_EQ(state_bytes, parameter_count(m) * 8);
  }
  ModelConfig sgd = tiny(1);
  sgd.optimizer = Optimizer::kSgd;
  std::uint64_t states = 0;
  for (const auto& x : synthesize(sgd, gpu_preset("h100")).tensors)
    if (x.kind == trace::TensorKind::kOptimizerState) states += x.bytes;
  EXPECT_EQ(states, parameter_count(sgd) * 4);
}

TEST(Synth, LifetimesFollowTheTrainingStep) {
  const auto t = synthesize(tiny(2, 2), gpu_preset("h100"));
  for (const auto& x : t.tensors) {
    std::set<trace::Phase> phases;
    for (const auto u : x.uses) phases.insert(t.ops[u].phase);
    switch (x.kind) {
      case trace::TensorKind::kOptimizerState:
        EXPECT_EQ(phases, std::set<trace::Phase>{trace::Phase::kOptimizer}) << x.name;
        break;
      case trace::TensorKind::kGradient:
        EXPECT_TRUE(phases.count(trace::Phase::kBackward) && phases.count(trace::Phase::kOptimizer))
            << x.name;
        break;
      case trace::TensorKind::kParameter:
        EXPECT_TRUE(phases.count(trace::Phase::kOptimizer)) << x.name;
        break;
      case trace::TensorKind::kActivation:
        EXPECT_FALSE(x.persistent);
        // Saved for backward: produced in forward, read in backward (the rstd of the final
        // norm included); only the bf16 weight copies' readers can be forward-only under autocast.
        EXPECT_TRUE(phases.count(trace::Phase::kForward)) << x.name;
        break;
      default: EXPECT_FALSE(x.persistent) << x.name;
    }
  }
  const auto* q = find(t, "mb0.layers.1.attn.q_rot");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(t.ops[q->uses.front()].phase, trace::Phase::kForward);
  EXPECT_EQ(t.ops[q->uses.back()].phase, trace::Phase::kBackward);
}

// With the optimizer in the backward pass each parameter steps once, right after the last
// backward operator of the last micro-batch that adds to its gradient, and before the backward
// ends; the step's work is the same.
TEST(Synth, TheOptimizerInTheBackwardPassStepsEachParameterAfterItsLastGradient) {
  ModelConfig in_backward = tiny(2, 2);
  in_backward.optimizer_in_backward = true;
  const auto after = synthesize(tiny(2, 2), gpu_preset("h100"));
  const auto within = synthesize(in_backward, gpu_preset("h100"));
  ASSERT_EQ(within.ops.size(), after.ops.size());
  double after_s = 0, within_s = 0;
  for (const auto& op : after.ops) after_s += op.duration_s;
  for (const auto& op : within.ops) within_s += op.duration_s;
  EXPECT_DOUBLE_EQ(within_s, after_s);
  trace::OpIndex last_backward = 0;
  for (trace::OpIndex i = 0; i < within.ops.size(); ++i)
    if (within.ops[i].phase == trace::Phase::kBackward) last_backward = i;
  std::size_t steps = 0, steps_before_the_end = 0;
  for (const auto& x : within.tensors) {
    if (x.kind != trace::TensorKind::kGradient || !x.persistent) continue;
    trace::OpIndex last_grad_write = 0, step = 0;
    for (const auto u : x.uses) {
      if (within.ops[u].phase == trace::Phase::kBackward) last_grad_write = u;
      if (within.ops[u].phase == trace::Phase::kOptimizer) {
        step = u;
        ++steps;
      }
    }
    EXPECT_GT(step, last_grad_write) << x.name;
    if (step < last_backward) ++steps_before_the_end;
  }
  std::size_t optimizer_ops = 0;
  for (const auto& op : within.ops) optimizer_ops += op.phase == trace::Phase::kOptimizer;
  EXPECT_EQ(steps, optimizer_ops);
  EXPECT_GT(steps_before_the_end, optimizer_ops / 2);  // most step while the backward runs
}

TEST(Synth, PresetsMatchTheMeasuredWorkloads) {
  const GpuModel h100 = gpu_preset("h100");
  // shared/WORKLOADS.md: W1 ideal 0.320 s, peak 49.7 GiB; W2 ideal 2.035 s, peak 42.5 GiB (H100).
  struct Expect {
    const char* preset;
    double step_s;
    double peak_gib;
  };
  for (const Expect e : {Expect{"w1", 0.320, 49.7}, Expect{"w2", 2.035, 42.5}}) {
    const ModelConfig m = model_preset(e.preset);
    const auto s = summarize(m, synthesize(m, h100));
    EXPECT_NEAR(s.step_time_s, e.step_s, 0.1 * e.step_s) << e.preset;
    EXPECT_NEAR(double(s.peak_memory) / double(kGiB), e.peak_gib, 0.1 * e.peak_gib) << e.preset;
  }
  // The H200 has more memory bandwidth and the same matrix rate: never slower.
  const ModelConfig w1 = model_preset("w1");
  EXPECT_LT(summarize(w1, synthesize(w1, gpu_preset("h200"))).step_time_s,
            summarize(w1, synthesize(w1, h100)).step_time_s);
}

TEST(Synth, RejectsBadConfigs) {
  ModelConfig m = tiny();
  m.heads = 5;
  EXPECT_THROW(synthesize(m, gpu_preset("h100")), Error);
  m = tiny();
  m.layers = 0;
  EXPECT_THROW(synthesize(m, gpu_preset("h100")), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
  EXPECT_THROW(gpu_preset("b300"), Error);
  EXPECT_THROW(parse_precision("fp8"), Error);
  EXPECT_EQ(parse_precision("BF16-autocast"), Precision::kBf16Autocast);
  EXPECT_EQ(model_preset("W3").vocab, 128256u);
}

}  // namespace
}  // namespace teraio::plan
