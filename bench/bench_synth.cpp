// Cost of the synthetic-trace generator and of the simulator at the scales the planner is
// benchmarked on: the Llama3-70B step (about 250k operators) and W3 (Llama3-8B shape, 32
// micro-batches) planned at an 80 GB H100's budget and replayed for two steps.
#include <benchmark/benchmark.h>

#include "teraio/core/units.hpp"
#include "teraio/plan/planner.hpp"
#include "teraio/plan/simulator.hpp"
#include "teraio/plan/synth.hpp"

namespace teraio::plan {
namespace {

void BM_SynthesizeLlama3_70B(benchmark::State& state) {
  const ModelConfig m = model_preset("llama3-70b");
  const GpuModel gpu = gpu_preset("h100");
  std::size_t ops = 0, tensors = 0;
  for (auto _ : state) {
    const trace::Trace t = synthesize(m, gpu);
    ops = t.ops.size();
    tensors = t.tensors.size();
    benchmark::DoNotOptimize(t.ops.data());
  }
  state.counters["ops"] = double(ops);
  state.counters["tensors"] = double(tensors);
}
BENCHMARK(BM_SynthesizeLlama3_70B)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_SimulateW3(benchmark::State& state) {
  const trace::Trace t = synthesize(model_preset("w3"), gpu_preset("h100"));
  Hardware hw;
  hw.gpu_budget = 76 * kGiB;
  hw.host_capacity = 100 * kGiB;
  hw.ssd_capacity = 1024 * kGiB;
  const Plan plan = make_plan(t, hw).plan;
  SimulationOptions opts;
  opts.enforce_budget = state.range(0) != 0;
  double share = 0;
  for (auto _ : state) {
    const SimulationResult r = simulate(t, plan, hw, opts);
    share = r.share_of_ideal;
  }
  state.counters["ops"] = double(t.ops.size());
  state.counters["migrations"] = double(plan.migrations.size());
  state.counters["share_of_ideal"] = share;
}
BENCHMARK(BM_SimulateW3)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace teraio::plan
