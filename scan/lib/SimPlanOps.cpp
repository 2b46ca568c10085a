//===- SimPlanOps.cpp - what mapp-sim reads off a plan's instructions -----===//

#include "SimPlanOps.h"

#include "mapp/rt/FusedProgram.h"

#include <algorithm>
#include <cmath>

namespace rt = mapp::rt;

namespace mapp::scan::planops {

int64_t numel(const rt::Value &v) {
  int64_t n = 1;
  for (int64_t d : v.type.shape)
    n *= d;
  return n;
}

/// FLOPs of the instructions that dominate (matrix products, attention);
/// every other kernel is charged its bytes.
double routedRows(const rt::Program &p, const rt::Instr &in) {
  const auto &x = p.values[in.inputs[0]].type.shape;
  const auto &w = p.values[in.kernel == "moe_grouped_matmul" ? in.inputs[1]
                                                              : in.outputs[0]]
                      .type.shape;
  if (x.size() != 2 || w.size() != 3)
    return 0;
  // x's rows are the capacity buffer: under ep, room for every member
  // routing all its rows here (ep·R). Balanced routing fills the share of
  // the rank's experts (w's leading dim) among the model's (moe_assign's
  // num_experts).
  int64_t experts = w[0];
  for (const rt::Block &b : p.blocks)
    for (const rt::Instr &other : b.instrs)
      if (other.kernel == "moe_assign")
        experts = std::max(experts, other.attrs.getInt("num_experts", 0));
  return double(x[0]) * double(w[0]) / double(experts);
}

double flopsOf(const rt::Program &p, const rt::Instr &in) {
  auto val = [&](int i) -> const rt::Value & { return p.values[i]; };
  if (in.outputs.empty() || in.inputs.size() < 2)
    return 0;
  const rt::Value &out = val(in.outputs[0]);
  if (in.kernel == "linear") {
    const rt::Value &x = val(in.inputs[0]);
    return x.type.shape.empty() ? 0 : 2.0 * numel(out) * x.type.shape.back();
  }
  if (in.kernel == "matmul") {
    // a [.., M, K] (transpose_a: [.., K, M]) · b: K from a's shape. (Not
    // |a|·|b| / |out|: a 2-D b shared by every batch row is counted once.)
    const auto &a = val(in.inputs[0]).type.shape;
    if (a.size() < 2)
      return 0;
    double k = double(in.attrs.flag("transpose_a") ? a[a.size() - 2] : a.back());
    return 2.0 * numel(out) * k;
  }
  if (in.kernel == "moe_grouped_matmul" || in.kernel == "moe_grouped_matmul_wgrad") {
    // Every routed row through its expert's [K, N] (the wgrad: x_eᵀ·dy_e
    // into [E, K, N]): 2·rows·K·N.
    const rt::Value &y = val(in.inputs[1]);
    double n = double(in.kernel == "moe_grouped_matmul" ? out.type.shape.back()
                                                        : y.type.shape.back());
    return 2.0 * routedRows(p, in) * val(in.inputs[0]).type.shape.back() * n;
  }
  if (in.kernel == "attention" || in.kernel == "attention_grad") {
    const rt::Value &q = val(in.inputs[0]); // [B, T, H]
    if (q.type.shape.size() != 3)
      return 0;
    double t = q.type.shape[1];
    return (in.kernel == "attention" ? 4.0 : 8.0) * numel(q) * t;
  }
  return 0;
}

double gemmMinDimOf(const rt::Program &p, const rt::Instr &in) {
  if (in.outputs.empty())
    return 0;
  double flops = flopsOf(p, in);
  if (in.kernel == "moe_grouped_matmul" || in.kernel == "moe_grouped_matmul_wgrad") {
    // One product per expert: its share of the rows by K by N. The experts
    // (E): w's leading dim, the wgrad's result's.
    const auto &w = p.values[in.kernel == "moe_grouped_matmul" ? in.inputs[1]
                                                                : in.outputs[0]]
                        .type.shape;
    if (flops <= 0 || w.size() != 3)
      return 0;
    double rowsPerExpert = routedRows(p, in) / double(w[0]);
    return std::min(rowsPerExpert, std::min(double(w[1]), double(w[2])));
  }
  if (in.kernel != "linear" && in.kernel != "matmul")
    return 0;
  const auto &out = p.values[in.outputs[0]].type.shape;
  if (flops <= 0 || out.size() < 2)
    return 0;
  // out [.., M, N]; the rows of the batch dims are one product's where the
  // backend makes one call of them (linear; a matmul whose b is shared and
  // a not transposed: cpu::matmul), else each batch entry is a product. K
  // from the FLOPs: 2·|out|·K.
  double all = double(numel(p.values[in.outputs[0]])), n = double(out.back());
  double m = all / n;
  if (in.kernel == "matmul" && (p.values[in.inputs[1]].type.shape.size() != 2 ||
                                in.attrs.flag("transpose_a")))
    m = double(out[out.size() - 2]);
  return std::min(m, std::min(n, flops / (2.0 * all)));
}

double activationElements(const rt::Program &p, const rt::Instr &in) {
  auto isActivation = [](const std::string &k) {
    return k == "gelu" || k == "gelu_grad" || k == "silu" || k == "silu_grad";
  };
  if (isActivation(in.kernel))
    return in.outputs.empty() ? 0 : double(numel(p.values[in.outputs[0]]));
  if (in.kernel != "fused")
    return 0;
  // A region: each elementwise activation statement over the domain (the
  // plan loader has checked the program).
  rt::fused::Program prog;
  if (!rt::fused::parse(in.attrs.getStr("program", ""),
                        static_cast<int>(in.inputs.size()), prog)
           .empty())
    return 0;
  double domain = 1;
  for (int64_t d : in.attrs.getInts("domain"))
    domain *= double(d);
  double elements = 0;
  for (const rt::fused::Stmt &st : prog.stmts)
    if (!st.row && isActivation(rt::fused::info(st.op).name))
      elements += domain;
  return elements;
}

bool isCollective(const std::string &k) {
  return k == "all_reduce" || k == "all_gather" || k == "reduce_scatter" ||
         k == "all_to_all" || k == "grad_sync" || k == "param_gather";
}

Op collOp(const std::string &k, const rt::Attrs &a) {
  if (k == "all_gather" || k == "param_gather")
    return Op::AllGather;
  if (k == "reduce_scatter")
    return Op::ReduceScatter;
  if (k == "all_to_all")
    return Op::AllToAll;
  if (k == "grad_sync" && a.getStr("mode", "all_reduce") == "reduce_scatter")
    return Op::ReduceScatter;
  return Op::AllReduce;
}

const std::vector<rt::Task> *tableOf(const rt::Program &p,
                                     const rt::Plan &plan,
                                     const std::string &name) {
  for (const rt::ScheduleTable &t : p.scheduleTables)
    if (t.name == name)
      return &t.tasks;
  if (name == plan.schedule)
    return &p.tasks;
  return nullptr;
}

double blockFlops(const rt::Program &p, const rt::Block &b) {
  double f = 0;
  for (const rt::Instr &in : b.instrs)
    f += flopsOf(p, in);
  return f;
}

/// The most chunks a table keeps forwarded and not yet backwarded.
int64_t peakChunksInFlight(const rt::Program &p,
                           const std::vector<rt::Task> &t) {
  int64_t now = 0, peak = 0;
  for (const rt::Task &task : t) {
    rt::BlockKind k = p.blocks[task.block].kind;
    if (k == rt::BlockKind::Forward)
      peak = std::max(peak, ++now);
    else if (k == rt::BlockKind::Backward || k == rt::BlockKind::BackwardWeight)
      --now;
  }
  return peak;
}

} // namespace mapp::scan::planops
