//===- SimPlanOps.cpp - what mapp-sim reads off a plan's instructions -----===//

#include "SimPlanOps.h"

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
    // a [.., M, K] · b [.., K, N]: K² · batch = |a|·|b| / |out|.
    double batch = 1;
    for (size_t d = 0; d + 2 < out.type.shape.size(); ++d)
      batch *= out.type.shape[d];
    double k2 = double(numel(val(in.inputs[0]))) * numel(val(in.inputs[1])) /
                (double(numel(out)) * batch);
    return 2.0 * numel(out) * std::sqrt(std::max(k2, 0.0));
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
