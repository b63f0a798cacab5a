// Trace file and lifetime-analysis speed on a Llama3-70B-scale trace: 250k operators, 50k
// tensors, 1M uses. The trace is a regular layered one built here (weights used once per
// micro-batch in forward and twice in backward, optimizer states once per step, activations from
// forward to backward), so the benchmark depends on nothing but the trace module.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "teraio/core/strings.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace {

using namespace teraio::trace;

constexpr int kLayers = 80;
constexpr int kMicroBatches = 8;
constexpr int kTensorsPerLayer = 625;  // 50k tensors over 80 layers
constexpr int kOpsPerLayerPass = 190;  // per layer, per micro-batch, per direction

// Forward passes of all micro-batches, then backward passes, then the optimizer:
// 2 * 8 * 80 * 190 = 243,200 operators plus 6,800 optimizer operators = 250k.
Trace make_large_trace() {
  std::mt19937_64 rng(42);
  const char* names[] = {"aten::mm",          "aten::addmm",        "aten::bmm",
                         "aten::add",         "aten::mul",          "aten::silu",
                         "aten::rms_norm",    "aten::softmax",      "aten::_flash_attention_forward",
                         "aten::view",        "aten::transpose",    "aten::copy_",
                         "aten::mm_backward", "aten::silu_backward"};
  Trace t;
  t.source = "bench: regular layered trace";
  t.untracked_bytes = 2ull << 30;
  std::exponential_distribution<double> duration(1.0 / 40e-6);
  const auto add_op = [&](Phase phase) {
    t.ops.push_back({names[rng() % std::size(names)], duration(rng), phase});
    return static_cast<OpIndex>(t.ops.size() - 1);
  };
  const auto pass_begin = [](int direction, int mb, int layer) {
    const int l = direction == 0 ? layer : kLayers - 1 - layer;
    return static_cast<OpIndex>(((direction * kMicroBatches + mb) * kLayers + l) * kOpsPerLayerPass);
  };
  for (int k = 0; k < 2 * kMicroBatches * kLayers * kOpsPerLayerPass; ++k)
    add_op(k < kMicroBatches * kLayers * kOpsPerLayerPass ? Phase::kForward : Phase::kBackward);
  const auto optimizer_begin = static_cast<OpIndex>(t.ops.size());
  while (t.ops.size() < 250000) add_op(Phase::kOptimizer);
  const auto optimizer_ops = static_cast<OpIndex>(t.ops.size()) - optimizer_begin;

  for (int layer = 0; layer < kLayers; ++layer)
    for (int j = 0; j < kTensorsPerLayer; ++j) {
      Tensor& x = t.tensors.emplace_back();
      x.id = t.tensors.size();
      x.name = "layers." + std::to_string(layer) + ".tensor" + std::to_string(j);
      const auto at = [&](int direction, int mb) {
        return pass_begin(direction, mb, layer) + rng() % kOpsPerLayerPass;
      };
      switch (j % 5) {
        case 0:  // weight: once per micro-batch forward and twice backward
        case 1:
          x.kind = TensorKind::kParameter;
          x.persistent = true;
          x.bytes = (16ull + rng() % 200) << 20;
          for (int mb = 0; mb < kMicroBatches; ++mb) {
            x.uses.push_back(static_cast<OpIndex>(at(0, mb)));
            x.uses.push_back(static_cast<OpIndex>(at(1, mb)));
            x.uses.push_back(static_cast<OpIndex>(at(1, mb)));
          }
          x.uses.push_back(optimizer_begin + static_cast<OpIndex>(rng() % optimizer_ops));
          break;
        case 2:  // optimizer state
          x.kind = TensorKind::kOptimizerState;
          x.persistent = true;
          x.bytes = (32ull + rng() % 400) << 20;
          x.uses.push_back(optimizer_begin + static_cast<OpIndex>(rng() % optimizer_ops));
          break;
        default: {  // activation of one micro-batch: forward uses, then backward uses
          x.kind = TensorKind::kActivation;
          x.bytes = (1ull + rng() % 64) << 20;
          const int mb = static_cast<int>(rng() % kMicroBatches);
          for (int u = 0; u < 24; ++u) x.uses.push_back(static_cast<OpIndex>(at(u % 2, mb)));
        }
      }
      std::sort(x.uses.begin(), x.uses.end());
      x.uses.erase(std::unique(x.uses.begin(), x.uses.end()), x.uses.end());
    }
  return t;
}

const Trace& large_trace() {
  static const Trace trace = make_large_trace();
  return trace;
}

std::size_t use_count(const Trace& t) {
  std::size_t n = 0;
  for (const Tensor& x : t.tensors) n += x.uses.size();
  return n;
}

void set_counters(benchmark::State& state, const Trace& t, std::size_t file_bytes) {
  state.counters["ops"] = static_cast<double>(t.ops.size());
  state.counters["tensors"] = static_cast<double>(t.tensors.size());
  state.counters["uses"] = static_cast<double>(use_count(t));
  if (file_bytes) state.counters["file_MB"] = static_cast<double>(file_bytes) / 1e6;
}

std::string temp_path(const char* extension) {
  return (std::filesystem::temp_directory_path() /
          ("teraio_bench_trace_" + std::to_string(::getpid()) + extension))
      .string();
}

void load_file(benchmark::State& state, const char* extension) {
  const std::string path = temp_path(extension);
  save_trace(large_trace(), path);
  const auto bytes = std::filesystem::file_size(path);
  for (auto _ : state) benchmark::DoNotOptimize(load_trace(path));
  std::filesystem::remove(path);
  set_counters(state, large_trace(), bytes);
}

void BM_LoadTraceJson(benchmark::State& state) {
  load_file(state, ".json");
}
void BM_LoadTraceBinary(benchmark::State& state) {
  load_file(state, ".tiotrace");
}

void BM_SaveTraceJson(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(trace_to_json(large_trace()));
  set_counters(state, large_trace(), 0);
}

void BM_SaveTraceBinary(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(trace_to_binary(large_trace()));
  set_counters(state, large_trace(), 0);
}

void BM_InactivePeriods(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(inactive_periods(large_trace()));
  set_counters(state, large_trace(), 0);
}

void BM_MemoryDemand(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(memory_demand(large_trace()));
    benchmark::DoNotOptimize(active_bytes(large_trace()));
  }
  set_counters(state, large_trace(), 0);
}

// TERAIO_BENCH_TRACE=a.json,b.tiotrace also times loading those files (a profiled or
// `teraio synth` trace, say).
const bool kFileBenchmarks = [] {
  const char* paths = std::getenv("TERAIO_BENCH_TRACE");
  if (!paths) return false;
  for (const std::string& path : teraio::split(paths, ','))
    benchmark::RegisterBenchmark(("BM_LoadTraceFile/" + path).c_str(), [path](benchmark::State& state) {
      const auto bytes = std::filesystem::file_size(path);
      Trace t;
      for (auto _ : state) t = load_trace(path);
      set_counters(state, t, bytes);
    })->Unit(benchmark::kMillisecond);
  return true;
}();

BENCHMARK(BM_LoadTraceJson)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_LoadTraceBinary)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SaveTraceJson)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_SaveTraceBinary)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_InactivePeriods)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemoryDemand)->Unit(benchmark::kMillisecond);

}  // namespace
