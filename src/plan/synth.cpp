#include "teraio/plan/synth.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "teraio/core/error.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/trace/lifetime.hpp"

namespace teraio::plan {
namespace {

using trace::OpIndex;
using trace::Phase;
using trace::TensorKind;

// FNV-1a: ids derived from names stay the same when the model grows or the generator
// reorders its work, which makes plans for one config readable against another.
trace::TensorId id_of(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

// What the backward pass of a forward operator does with the gradients.
enum class NodeKind : std::uint8_t {
  kLinear,
  kEmbedding,
  kCast,
  kNorm,
  kAdd,
  kElementwise,
  kAttention,
  kLoss
};

// A forward operator as the backward pass needs to know it.
struct Node {
  NodeKind kind;
  std::string name;
  std::vector<int> inputs;  // differentiable activation inputs
  std::vector<int> saved;   // what the backward reads besides the output gradient
  int output = -1;          // the output whose gradient flows back
  int param = -1;           // index of the weight's parameter, -1 if none
  int weight_value = -1;    // the tensor the forward read as weight (the parameter or its bf16 cast)
  double flops = 0;         // forward FLOPs
  double bytes = 0;         // forward bytes moved
};

struct Param {
  std::string name;
  std::uint64_t elements;
  int tensor = -1;
  int grad = -1;
  std::vector<int> states;
  bool stepped = false;  // its optimizer operator emitted
};

class TraceBuilder {
 public:
  TraceBuilder(const ModelConfig& model, const GpuModel& gpu) : model_(model), gpu_(gpu) {
    const bool fp32 = model.precision == Precision::kFp32;
    param_bytes_ = model.precision == Precision::kBf16 ? 2 : 4;
    act_bytes_ = fp32 ? 4 : 2;
    // Under autocast the residual stream and RMSNorm outputs stay fp32 (fp32 weights).
    residual_bytes_ = model.precision == Precision::kBf16Autocast ? 4 : act_bytes_;
    matrix_rate_ = (fp32 ? gpu.fp32_flops : gpu.bf16_flops) * gpu.matmul_efficiency;
    memory_rate_ = gpu.memory_bandwidth * gpu.memory_efficiency;
    tokens_ = static_cast<std::uint64_t>(model.micro_batch) * model.seq_len;
  }

  trace::Trace build() {
    make_parameters();
    for (std::uint32_t mb = 0; mb < model_.micro_batches; ++mb) {
      stepping_in_backward_ = model_.optimizer_in_backward && mb + 1 == model_.micro_batches;
      micro_batch(mb);
    }
    optimizer();
    trace::Trace t;
    t.ops = std::move(ops_);
    t.tensors.reserve(tensors_.size());
    for (auto& d : tensors_) {
      d.id = id_of(d.name);
      // Only the optimizer writes a parameter; every other use of it reads (forward, the
      // backward's input gradient, casts). Other tensors are written where they are made or
      // accumulated, and counted as written at every use.
      if (d.kind == TensorKind::kParameter)
        for (const OpIndex u : d.uses)
          if (t.ops[u].phase != Phase::kOptimizer) d.read_only_uses.push_back(u);
      t.tensors.push_back(std::move(d));
    }
    // cuBLAS workspaces and allocator slack that no tracked tensor accounts for.
    t.untracked_bytes = 256 * 1024 * 1024;
    t.source = cat("synthetic: ", model_.name, " (", model_.layers, " layers, hidden ", model_.hidden,
                   ", ffn ", model_.ffn, ", ", model_.micro_batch, "x", model_.seq_len, " x ",
                   model_.micro_batches, " micro-batches, ", to_string(model_.precision), ", ",
                   to_string(model_.optimizer), ") on ", gpu_.name);
    return t;
  }

 private:
  int tensor(std::string name, std::uint64_t bytes, TensorKind kind, bool persistent = false) {
    trace::Tensor t;
    t.name = std::move(name);
    t.bytes = bytes;
    t.kind = kind;
    t.persistent = persistent;
    tensors_.push_back(std::move(t));
    return static_cast<int>(tensors_.size() - 1);
  }

  // Roofline: the slower of the arithmetic and the memory traffic, plus launch overhead.
  double duration(double flops, double bytes, bool matrix) const {
    const double compute = matrix ? flops / matrix_rate_ : 0.0;
    return std::max(compute, bytes / memory_rate_) + gpu_.kernel_overhead_s;
  }

  void op(std::string name, Phase phase, double flops, double bytes, bool matrix,
          const std::vector<int>& uses) {
    const auto index = static_cast<OpIndex>(ops_.size());
    ops_.push_back({std::move(name), duration(flops, bytes, matrix), phase});
    for (const int u : uses) {
      auto& list = tensors_[static_cast<std::size_t>(u)].uses;
      if (list.empty() || list.back() != index) list.push_back(index);
    }
  }

  std::uint64_t bytes_of(int t) const { return tensors_[static_cast<std::size_t>(t)].bytes; }
  const std::string& name_of(int t) const { return tensors_[static_cast<std::size_t>(t)].name; }

  void make_parameters() {
    const std::uint64_t h = model_.hidden;
    const std::uint64_t kv = h * model_.kv_heads / model_.heads;
    auto add = [&](std::string name, std::uint64_t elements) {
      params_.push_back({std::move(name), elements, -1, -1, {}});
    };
    add("embed_tokens.weight", std::uint64_t{model_.vocab} * h);
    for (std::uint32_t l = 0; l < model_.layers; ++l) {
      const std::string p = cat("layers.", l, ".");
      add(p + "input_layernorm.weight", h);
      add(p + "attn.q_proj.weight", h * h);
      add(p + "attn.k_proj.weight", h * kv);
      add(p + "attn.v_proj.weight", h * kv);
      add(p + "attn.o_proj.weight", h * h);
      add(p + "post_attention_layernorm.weight", h);
      add(p + "mlp.gate_proj.weight", h * model_.ffn);
      add(p + "mlp.up_proj.weight", h * model_.ffn);
      add(p + "mlp.down_proj.weight", h * model_.ffn);
    }
    add("norm.weight", h);
    add("lm_head.weight", std::uint64_t{model_.vocab} * h);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      param_index_[p.name] = static_cast<int>(i);
      p.tensor = tensor(p.name, p.elements * param_bytes_, TensorKind::kParameter, true);
      // Gradients are accumulated in fp32 across the micro-batches of a step.
      p.grad = tensor(p.name + ".grad", p.elements * 4, TensorKind::kGradient, true);
      if (model_.optimizer == Optimizer::kAdamW) {
        p.states.push_back(tensor(p.name + ".exp_avg", p.elements * 4, TensorKind::kOptimizerState, true));
        p.states.push_back(tensor(p.name + ".exp_avg_sq", p.elements * 4, TensorKind::kOptimizerState, true));
      } else {
        p.states.push_back(
            tensor(p.name + ".momentum_buffer", p.elements * 4, TensorKind::kOptimizerState, true));
      }
    }
  }

  int param(const std::string& name) const { return param_index_.at(name); }

  // --- forward ------------------------------------------------------------------------------

  int activation(const std::string& name, std::uint64_t bytes) {
    return tensor(prefix_ + name, bytes, TensorKind::kActivation);
  }
  int temporary(const std::string& name, std::uint64_t bytes) {
    return tensor(prefix_ + name, bytes, TensorKind::kTemporary);
  }

  void forward(Node node, const std::vector<int>& extra_uses, bool matrix) {
    std::vector<int> uses = node.inputs;
    uses.insert(uses.end(), extra_uses.begin(), extra_uses.end());
    if (node.weight_value >= 0) uses.push_back(node.weight_value);
    if (node.output >= 0) uses.push_back(node.output);
    op(prefix_ + node.name, Phase::kForward, node.flops, node.bytes, matrix, uses);
    nodes_.push_back(std::move(node));
  }

  // Under autocast, a matmul reads a bf16 copy of its fp32 input (every RMSNorm output), made
  // afresh for each matmul; the copy is saved for backward.
  int matmul_input(int x, const std::string& name, bool fp32_input) {
    if (model_.precision != Precision::kBf16Autocast || !fp32_input) return x;
    const int c = activation(name + ".input_bf16", bytes_of(x) / residual_bytes_ * act_bytes_);
    Node n{NodeKind::kCast, name + ".input_cast", {x}, {}, c, -1, -1, 0, double(bytes_of(x) + bytes_of(c))};
    forward(std::move(n), {}, false);
    return c;
  }

  // The weight as the matmul reads it: autocast casts each fp32 weight once per forward pass.
  int weight_value(int p) {
    const int t = params_[static_cast<std::size_t>(p)].tensor;
    if (model_.precision != Precision::kBf16Autocast) return t;
    const std::string& name = params_[static_cast<std::size_t>(p)].name;
    const int c = tensor(prefix_ + name + ".bf16", bytes_of(t) / 2, TensorKind::kActivation);
    op(prefix_ + name + ".cast", Phase::kForward, 0, double(bytes_of(t) + bytes_of(c)), false, {t, c});
    return c;
  }

  // `normed_input`: x is an RMSNorm output (fp32 under autocast).
  int linear(int x, const std::string& module, std::uint64_t in, std::uint64_t out,
             const std::string& out_name, bool saved_output, bool normed_input) {
    const int input = matmul_input(x, module, normed_input);
    const int p = param(module + ".weight");
    const int w = weight_value(p);
    const std::uint64_t bytes = tokens_ * out * act_bytes_;
    const int y = saved_output ? activation(out_name, bytes) : temporary(out_name, bytes);
    const double flops = 2.0 * double(tokens_) * double(in) * double(out);
    Node n{NodeKind::kLinear,
           module,
           {input},
           {input},
           y,
           p,
           w,
           flops,
           double(bytes_of(input) + bytes_of(w) + bytes_of(y))};
    forward(std::move(n), {}, true);
    return y;
  }

  int rmsnorm(int x, const std::string& module, const std::string& out_name) {
    const std::uint64_t h = model_.hidden;
    const int p = param(module + ".weight");
    const int rstd = activation(module + ".rstd", tokens_ * 4);
    // HF's eager RMSNorm keeps the normalized input (before the weight) for the weight's gradient.
    const int normalized = activation(module + ".normalized", tokens_ * h * residual_bytes_);
    const int y = activation(out_name, tokens_ * h * residual_bytes_);
    const int w = params_[static_cast<std::size_t>(p)].tensor;
    Node n{NodeKind::kNorm,
           module,
           {x},
           {x, rstd, normalized},
           y,
           p,
           w,
           0,
           double(bytes_of(x) + bytes_of(normalized) + bytes_of(y))};
    forward(std::move(n), {rstd, normalized}, false);
    return y;
  }

  int elementwise(const std::string& name, std::vector<int> inputs, std::vector<int> saved, int y) {
    double bytes = double(bytes_of(y));
    for (const int i : inputs) bytes += double(bytes_of(i));
    Node n{NodeKind::kElementwise, name, std::move(inputs), std::move(saved), y, -1, -1, 0, bytes};
    forward(std::move(n), {}, false);
    return y;
  }

  int residual_add(int a, int b, const std::string& out_name) {
    const int y = activation(out_name, bytes_of(a));
    Node n{NodeKind::kAdd,
           out_name + ".add",
           {a, b},
           {},
           y,
           -1,
           -1,
           0,
           double(bytes_of(a) + bytes_of(b) + bytes_of(y))};
    forward(std::move(n), {}, false);
    return y;
  }

  int layer(std::uint32_t l, int x) {
    const std::uint64_t h = model_.hidden;
    const std::uint64_t kv = h * model_.kv_heads / model_.heads;
    const std::uint64_t f = model_.ffn;
    const std::string p = cat("layers.", l, ".");
    const int n1 = rmsnorm(x, p + "input_layernorm", p + "input_layernorm.out");
    const int q = linear(n1, p + "attn.q_proj", h, h, p + "attn.q_out", false, true);
    const int k = linear(n1, p + "attn.k_proj", h, kv, p + "attn.k_out", false, true);
    const int v = linear(n1, p + "attn.v_proj", h, kv, p + "attn.v_out", true, true);
    const int qr = elementwise(p + "attn.rope_q", {q}, {}, activation(p + "attn.q_rot", bytes_of(q)));
    const int kr = elementwise(p + "attn.rope_k", {k}, {}, activation(p + "attn.k_rot", bytes_of(k)));
    const int lse = activation(p + "attn.lse", tokens_ * model_.heads * 4);
    const int att = activation(p + "attn.sdpa_out", tokens_ * h * act_bytes_);
    // Causal attention: QK^T and PV over half of the s x s score matrix.
    const double flops = 2.0 * model_.micro_batch * double(model_.seq_len) * model_.seq_len * double(h);
    Node sdpa{NodeKind::kAttention,
              p + "attn.sdpa",
              {qr, kr, v},
              {qr, kr, v, att, lse},
              att,
              -1,
              -1,
              flops,
              double(bytes_of(qr) + bytes_of(kr) + bytes_of(v) + bytes_of(att))};
    forward(std::move(sdpa), {lse}, true);
    const int o = linear(att, p + "attn.o_proj", h, h, p + "attn.o_out", false, false);
    const int x2 = residual_add(x, o, p + "attn.residual");
    const int n2 = rmsnorm(x2, p + "post_attention_layernorm", p + "post_attention_layernorm.out");
    const int g = linear(n2, p + "mlp.gate_proj", h, f, p + "mlp.gate_out", true, true);
    const int u = linear(n2, p + "mlp.up_proj", h, f, p + "mlp.up_out", true, true);
    const int s = elementwise(p + "mlp.silu", {g}, {g}, activation(p + "mlp.silu_out", bytes_of(g)));
    const int m = elementwise(p + "mlp.mul", {s, u}, {s, u}, activation(p + "mlp.mul_out", bytes_of(u)));
    const int d = linear(m, p + "mlp.down_proj", f, h, p + "mlp.down_out", false, false);
    return residual_add(x2, d, p + "mlp.residual");
  }

  void micro_batch(std::uint32_t mb) {
    prefix_ = cat("mb", mb, ".");
    nodes_.clear();
    grads_.clear();
    const std::uint64_t h = model_.hidden;
    const int pe = param("embed_tokens.weight");
    // Autocast leaves the embedding lookup in fp32.
    const int x0 = activation("embed_tokens.out", tokens_ * h * residual_bytes_);
    Node embed{NodeKind::kEmbedding,    "embed_tokens", {}, {}, x0, pe, params_[std::size_t(pe)].tensor, 0,
               double(2 * bytes_of(x0))};
    forward(std::move(embed), {}, false);
    int x = x0;
    for (std::uint32_t l = 0; l < model_.layers; ++l) x = layer(l, x);
    const int nf = rmsnorm(x, "norm", "norm.out");
    const int logits = linear(nf, "lm_head", h, model_.vocab, "lm_head.logits", false, true);
    int logits32 = logits;
    if (act_bytes_ != 4)
      logits32 = elementwise("lm_head.logits_float", {logits}, {},
                             activation("lm_head.logits_fp32", bytes_of(logits) * 2));
    const int logprobs = activation("loss.log_softmax", bytes_of(logits32));
    Node loss{NodeKind::kLoss,
              "loss.cross_entropy",
              {logits32},
              {logprobs},
              -1,
              -1,
              -1,
              0,
              double(bytes_of(logits32) + bytes_of(logprobs))};
    forward(std::move(loss), {logprobs}, false);
    backward();
  }

  // --- backward ------------------------------------------------------------------------------

  // The gradient tensor of an activation: created by the first backward operator that
  // produces it, accumulated into (read and written) by later ones.
  int grad_for(int t) {
    const auto it = grads_.find(t);
    if (it != grads_.end()) return it->second;
    const int g = tensor(name_of(t) + ".grad", bytes_of(t), TensorKind::kTemporary);
    grads_[t] = g;
    return g;
  }

  void bwd_op(const std::string& name, double flops, double bytes, bool matrix,
              const std::vector<int>& uses) {
    op(prefix_ + name, Phase::kBackward, flops, bytes, matrix, uses);
  }

  double sum_bytes(const std::vector<int>& ts) const {
    double b = 0;
    for (const int t : ts) b += double(bytes_of(t));
    return b;
  }

  void backward() {
    // With the optimizer in the backward pass, a parameter steps once the node that uses it
    // first in the forward pass, the last to add to its gradient, has run its backward.
    std::unordered_map<std::size_t, std::vector<int>> steps_after;
    if (stepping_in_backward_) {
      std::unordered_map<int, std::size_t> first_use;
      for (std::size_t i = nodes_.size(); i-- > 0;)
        if (nodes_[i].param >= 0) first_use[nodes_[i].param] = i;
      for (const auto& [param, node] : first_use) steps_after[node].push_back(param);
    }
    for (std::size_t i = nodes_.size(); i-- > 0;) {
      backward_of(nodes_[i]);
      if (const auto due = steps_after.find(i); due != steps_after.end())
        for (const int param : due->second) optimizer_step(params_[static_cast<std::size_t>(param)]);
    }
  }

  void backward_of(const Node& n) {
    if (n.kind == NodeKind::kLoss) {
      const int g = grad_for(n.inputs[0]);
      std::vector<int> uses{n.saved[0], g};
      bwd_op(n.name + ".bwd", 0, sum_bytes(uses), false, uses);
      return;
    }
    const auto found = grads_.find(n.output);
    if (found == grads_.end()) return;  // nothing downstream needs this output's gradient
    const int gy = found->second;
    const int grad_w = n.param >= 0 ? params_[static_cast<std::size_t>(n.param)].grad : -1;
    switch (n.kind) {
      case NodeKind::kLinear: {
        const int gx = grad_for(n.inputs[0]);
        std::vector<int> dgrad{gy, n.weight_value, gx};
        bwd_op(n.name + ".bwd_input", n.flops, sum_bytes(dgrad), true, dgrad);
        std::vector<int> wgrad{gy, n.saved[0], grad_w};
        bwd_op(n.name + ".bwd_weight", n.flops, sum_bytes(wgrad), true, wgrad);
        break;
      }
      case NodeKind::kEmbedding: {
        std::vector<int> uses{gy, grad_w};
        bwd_op(n.name + ".bwd_weight", 0, 2.0 * double(bytes_of(gy)), false, uses);
        break;
      }
      case NodeKind::kAdd:
        // The gradient passes through unchanged; a second consumer of an input adds into it.
        for (const int in : n.inputs) {
          if (grads_.count(in) == 0) {
            grads_[in] = gy;
          } else {
            std::vector<int> uses{gy, grads_[in]};
            bwd_op(n.name + ".bwd_accumulate", 0, 3.0 * double(bytes_of(gy)), false, uses);
          }
        }
        break;
      case NodeKind::kNorm: {
        const int gx = grad_for(n.inputs[0]);
        std::vector<int> uses = n.saved;
        uses.insert(uses.end(), {n.weight_value, gy, gx, grad_w});
        bwd_op(n.name + ".bwd", 0, sum_bytes({gy, gx, n.saved[0], n.saved[2]}), false, uses);
        break;
      }
      case NodeKind::kCast:
      case NodeKind::kElementwise:
      case NodeKind::kAttention: {
        std::vector<int> uses = n.saved;
        uses.push_back(gy);
        for (const int in : n.inputs) uses.push_back(grad_for(in));
        const bool matrix = n.kind == NodeKind::kAttention;
        // Flash-attention backward recomputes the scores: about 2.5 times the forward work.
        bwd_op(n.name + ".bwd", matrix ? 2.5 * n.flops : 0, 2.0 * n.bytes, matrix, uses);
        break;
      }
      case NodeKind::kLoss: break;
    }
  }

  void optimizer() {
    for (Param& p : params_)
      if (!p.stepped) optimizer_step(p);
  }

  void optimizer_step(Param& p) {
    std::vector<int> uses{p.tensor, p.grad};
    uses.insert(uses.end(), p.states.begin(), p.states.end());
    // Reads parameter, gradient and states; writes parameter and states.
    const double bytes = double(2 * bytes_of(p.tensor) + bytes_of(p.grad)) + 2.0 * sum_bytes(p.states);
    const char* kind = model_.optimizer == Optimizer::kAdamW ? "optimizer.adamw." : "optimizer.sgd.";
    op(kind + p.name, Phase::kOptimizer, 0, bytes, false, uses);
    p.stepped = true;
  }

  const ModelConfig& model_;
  const GpuModel& gpu_;
  std::uint64_t param_bytes_ = 4, act_bytes_ = 2, residual_bytes_ = 4, tokens_ = 0;
  double matrix_rate_ = 1, memory_rate_ = 1;
  std::vector<Param> params_;
  std::unordered_map<std::string, int> param_index_;
  std::vector<trace::Operator> ops_;
  std::vector<trace::Tensor> tensors_;
  std::string prefix_;
  std::vector<Node> nodes_;
  std::unordered_map<int, int> grads_;  // activation tensor -> its gradient tensor
  bool stepping_in_backward_ = false;   // this micro-batch's backward runs the optimizer
};

}  // namespace

trace::Trace synthesize(const ModelConfig& model, const GpuModel& gpu) {
  model.validate();
  if (!(gpu.bf16_flops > 0) || !(gpu.fp32_flops > 0) || !(gpu.memory_bandwidth > 0) ||
      !(gpu.matmul_efficiency > 0) || !(gpu.memory_efficiency > 0) || gpu.kernel_overhead_s < 0)
    throw Error(ErrorKind::kInvalidArgument,
                cat("GPU model '", gpu.name, "' needs positive rates and efficiencies"));
  trace::Trace t = TraceBuilder(model, gpu).build();
  trace::validate(t);
  return t;
}

SynthSummary summarize(const ModelConfig& model, const trace::Trace& trace) {
  SynthSummary s;
  s.ops = trace.ops.size();
  s.tensors = trace.tensors.size();
  s.parameters = parameter_count(model);
  for (const auto& t : trace.tensors)
    if (t.persistent) s.model_state_bytes += t.bytes;
  for (const auto& op : trace.ops) {
    s.step_time_s += op.duration_s;
    if (op.phase == trace::Phase::kForward) s.forward_s += op.duration_s;
    if (op.phase == trace::Phase::kBackward) s.backward_s += op.duration_s;
    if (op.phase == trace::Phase::kOptimizer) s.optimizer_s += op.duration_s;
  }
  const auto demand = trace::memory_demand(trace);
  const auto peak = std::max_element(demand.begin(), demand.end());
  if (peak != demand.end()) {
    s.peak_memory = *peak;
    s.peak_op = static_cast<trace::OpIndex>(peak - demand.begin());
  }
  return s;
}

}  // namespace teraio::plan
