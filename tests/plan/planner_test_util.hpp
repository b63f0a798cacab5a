// Builders for hand-made traces and an independent checker of plans: it recomputes memory
// per operator from the migrations alone, host occupancy, and whether every channel can
// serve its migrations by their deadlines (earliest-deadline-first over repeated steps).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/trace_builder.hpp"
#include "teraio/plan/plan.hpp"
#include "teraio/trace/lifetime.hpp"
#include "teraio/trace/trace.hpp"

namespace teraio::plan::testing {

inline trace::Trace ops_trace(std::size_t n, double duration_s = 1.0) {
  return teraio::testing::trace_of_durations(std::vector<double>(n, duration_s));
}

inline trace::Tensor& add_tensor(trace::Trace& t, std::uint64_t bytes, std::vector<trace::OpIndex> uses,
                                 bool persistent = false) {
  return teraio::testing::append_tensor(
      t, 1001 + t.tensors.size(), bytes, std::move(uses), persistent,
      persistent ? trace::TensorKind::kOptimizerState : trace::TensorKind::kActivation);
}

// Ten 1 s operators; tensor T (100 B) used at ops 0 and 9, tensor U (60 B) at ops 4-5.
// Demand is 100 everywhere and 160 at ops 4-5: T must be away during ops 4-5.
inline trace::Trace idle_tensor_trace() {
  trace::Trace t = ops_trace(10);
  add_tensor(t, 100, {0, 9});
  add_tensor(t, 60, {4, 5});
  return t;
}

// Hardware with every channel at `bandwidth` bytes/s, no latency, both tiers large.
inline Hardware uniform_hardware(std::uint64_t budget, double bandwidth) {
  Hardware hw;
  hw.gpu_budget = budget;
  hw.host_capacity = 1ull << 40;
  hw.ssd_capacity = 1ull << 40;
  hw.d2h_bandwidth = hw.h2d_bandwidth = hw.ssd_write_bandwidth = hw.ssd_read_bandwidth = bandwidth;
  hw.gpudirect = true;
  hw.request_latency_s = 0;
  return hw;
}

// Random trace: tensors of mixed sizes with a few uses each, some persistent.
inline trace::Trace random_trace(std::uint32_t seed, std::size_t ops, std::size_t tensors) {
  std::mt19937 rng(seed);
  trace::Trace t;
  std::uniform_real_distribution<double> dur(0.1e-3, 2e-3);
  for (std::size_t k = 0; k < ops; ++k)
    t.ops.push_back({"op" + std::to_string(k), dur(rng), trace::Phase::kOther});
  std::uniform_int_distribution<std::uint32_t> op(0, static_cast<std::uint32_t>(ops - 1));
  std::uniform_int_distribution<int> nuses(1, 4);
  std::uniform_int_distribution<std::uint64_t> size(1, 64);
  for (std::size_t i = 0; i < tensors; ++i) {
    std::vector<trace::OpIndex> uses;
    for (int u = nuses(rng); u > 0; --u) uses.push_back(op(rng));
    std::sort(uses.begin(), uses.end());
    uses.erase(std::unique(uses.begin(), uses.end()), uses.end());
    add_tensor(t, size(rng) << 20, std::move(uses), rng() % 4 == 0);
  }
  t.untracked_bytes = 32ull << 20;
  return t;
}

struct CheckResult {
  std::vector<std::int64_t> memory;  // per operator, with the plan applied
  std::uint64_t peak = 0;
  std::uint64_t host_peak = 0;
  std::vector<std::string> violations;
};

// Circular "op k lies in [from, to)" where to <= from means the range wraps.
inline bool in_range(std::size_t k, std::size_t from, std::size_t to) {
  return from < to ? (k >= from && k < to) : (k >= from || k < to);
}

inline CheckResult check_plan(const trace::Trace& t, const Plan& plan) {
  CheckResult r;
  const std::size_t n = t.ops.size();
  const std::vector<std::uint64_t> demand = trace::memory_demand(t);
  r.memory.assign(demand.begin(), demand.end());
  std::vector<std::int64_t> host(n, 0);
  std::map<trace::TensorId, const trace::Tensor*> by_id;
  for (const trace::Tensor& x : t.tensors) by_id[x.id] = &x;
  const Hardware& hw = plan.hardware;
  // Channel jobs: release op, deadline op (unrolled), bytes; channel 0..3 = d2h, h2d, ssd w, ssd r.
  struct Job {
    std::size_t release, deadline;
    double bytes;
  };
  std::vector<Job> jobs[4];
  const double bw[4] = {hw.d2h_bandwidth, hw.h2d_bandwidth, hw.ssd_write_bandwidth, hw.ssd_read_bandwidth};
  for (const Migration& off : plan.migrations) {
    if (off.direction != Direction::kOffload) continue;
    const trace::Tensor& x = *by_id.at(off.tensor);
    // The period: last use just before the issue, next use = first use after it (circular).
    const std::size_t last = (off.issue_before + n - 1) % n;
    auto it = std::upper_bound(x.uses.begin(), x.uses.end(), static_cast<trace::OpIndex>(last));
    const std::size_t next = it != x.uses.end() ? *it : x.uses.front();
    const Migration* pre = nullptr;
    for (const Migration& m : plan.migrations)
      if (m.tensor == off.tensor && m.direction == Direction::kPrefetch && m.deadline == next) pre = &m;
    if (!pre) {
      r.violations.push_back("offload of tensor " + std::to_string(off.tensor) + " has no prefetch");
      continue;
    }
    for (trace::OpIndex u : x.uses)
      if (in_range(u, off.issue_before, next))
        r.violations.push_back("tensor " + std::to_string(off.tensor) + " used while away");
    for (std::size_t k = 0; k < n; ++k) {
      if (in_range(k, off.deadline, pre->issue_before)) r.memory[k] -= static_cast<std::int64_t>(x.bytes);
      if (off.tier == Tier::kHost && in_range(k, off.issue_before, next))
        host[k] += static_cast<std::int64_t>(x.bytes);
    }
    const auto unroll = [&](std::size_t from, std::size_t to) { return to > from ? to : to + n; };
    const double latency = hw.request_latency_s;
    const bool ssd = off.tier == Tier::kSsd;
    const std::size_t off_ch[2] = {ssd ? 2u : 0u, 0u};
    const std::size_t pre_ch[2] = {ssd ? 3u : 1u, 1u};
    const int channels = ssd && !hw.gpudirect ? 2 : 1;
    for (int c = 0; c < channels; ++c) {
      const double rate_off = ssd && !hw.gpudirect ? std::min(bw[2], bw[0]) : bw[off_ch[0]];
      const double rate_pre = ssd && !hw.gpudirect ? std::min(bw[3], bw[1]) : bw[pre_ch[0]];
      jobs[off_ch[c]].push_back({off.issue_before, unroll(off.issue_before, off.deadline),
                                 static_cast<double>(x.bytes) + latency * rate_off});
      jobs[pre_ch[c]].push_back({pre->issue_before, unroll(pre->issue_before, pre->deadline),
                                 static_cast<double>(x.bytes) + latency * rate_pre});
    }
  }
  for (std::size_t k = 0; k < n; ++k) {
    r.peak =
        std::max<std::uint64_t>(r.peak, static_cast<std::uint64_t>(std::max<std::int64_t>(0, r.memory[k])));
    r.host_peak = std::max<std::uint64_t>(r.host_peak, static_cast<std::uint64_t>(host[k]));
  }
  // EDF per channel over three repetitions of the step, fluid, preemptive at operator grain.
  for (int c = 0; c < 4; ++c) {
    struct Live {
      std::size_t deadline;
      double left;
    };
    std::vector<Live> live;
    for (std::size_t step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t now = step * n + k;
        for (const Job& j : jobs[c])
          if (j.release + step * n == now) live.push_back({j.deadline + step * n, j.bytes});
        std::sort(live.begin(), live.end(),
                  [](const Live& a, const Live& b) { return a.deadline < b.deadline; });
        double capacity = t.ops[k].duration_s * bw[c];
        for (Live& l : live) {
          const double used = std::min(capacity, l.left);
          l.left -= used;
          capacity -= used;
        }
        for (const Live& l : live)
          if (l.left > 1.0 && l.deadline == now + 1)
            r.violations.push_back("channel " + std::to_string(c) + " misses a deadline at op " +
                                   std::to_string(k) + " of step " + std::to_string(step));
        std::erase_if(live, [&](const Live& l) { return l.left <= 1.0 || l.deadline <= now + 1; });
      }
    }
  }
  return r;
}

}  // namespace teraio::plan::testing
