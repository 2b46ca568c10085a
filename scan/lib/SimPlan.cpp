//===- SimPlan.cpp - replay a compiled plan's schedule on a model ---------===//

#include "mapp/scan/SimPlan.h"
#include "SimFbd.h"
#include "SimPlanOps.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/TaskPool.h"
#include "mapp/cost/CostModel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <unordered_map>

using namespace mapp::scan;
using namespace mapp::scan::planops;
namespace rt = mapp::rt;

std::vector<std::string> mapp::scan::planSchedules(const rt::Plan &plan) {
  std::vector<std::string> out;
  if (!plan.schedule.empty())
    out.push_back(plan.schedule);
  bool dfc = false, bfc = false;
  if (!plan.programs.empty())
    for (const rt::ScheduleTable &t : plan.programs[0].scheduleTables) {
      if (std::find(out.begin(), out.end(), t.name) == out.end())
        out.push_back(t.name);
      dfc |= t.name == "dfc";
      bfc |= t.name == "bfc";
    }
  if (dfc && bfc && std::find(out.begin(), out.end(), "adaptive") == out.end())
    out.push_back("adaptive");
  return out;
}

namespace {

/// Builds the engine's programs for one table name.
class JobBuilder {
public:
  JobBuilder(const rt::Plan &plan, const PlanCluster &c) : plan(plan), c(c) {}

  std::vector<fbd::ParamMessage> paramMsgs; // split plans: the step-end copy
  mapp::cost::Profile profile;
  bool profileReady = false;

  /// The ops of one task of step 0 (collectives keep their cost, not their
  /// synchronization, in adaptiveOrders' use).
  std::vector<SimOp> taskOps(const rt::Program &p, const rt::Task &t,
                             SimJob &job) {
    std::vector<SimOp> ops;
    addTask(p, t, 0, ops, job);
    return ops;
  }

  bool build(const std::string &table, SimJob &job,
             std::vector<int64_t> &peakInFlight, std::string *error) {
    job = SimJob();
    job.world = plan.worldSize;
    job.tp = plan.tp;
    job.pp = plan.pp;
    job.dp = plan.dp;
    job.programs.assign(job.world, {});
    peakInFlight.assign(plan.programs.size(), 0);
    for (const Fault &f : c.faults)
      if (f.kind == Fault::SlowCompute)
        slowdown[f.rank] = f.value;
    split = rt::isFbdPlan(plan);
    if (split && !fbd::paramMessages(plan, paramMsgs, error))
      return false;
    if (split)
      scaleSplitForwards();
    for (size_t pi = 0; pi < plan.programs.size(); ++pi) {
      const rt::Program &p = plan.programs[pi];
      const std::vector<rt::Task> *tasks = tableOf(p, plan, table);
      if (!tasks) {
        *error = "plan has no schedule table '" + table + "' (it has: ";
        for (const std::string &s : planSchedules(plan))
          *error += s + " ";
        error->back() = ')';
        return false;
      }
      std::vector<rt::Task> order = *tasks;
      if (order.empty()) // plan.fbs: every non-optimizer block per microbatch
        for (int mb = 0; mb < plan.numMicrobatches; ++mb)
          for (size_t b = 0; b < p.blocks.size(); ++b)
            if (p.blocks[b].kind != rt::BlockKind::Optimizer)
              order.push_back({int(b), mb});
      peakInFlight[pi] = peakChunksInFlight(p, order);
      // A forward rank of a split plan keeps nothing for a backward: each
      // microbatch's outputs leave as sends and its arena slot is reused.
      if (p.placement.role == "fwd")
        peakInFlight[pi] = std::min<int64_t>(peakInFlight[pi], 1);
      for (int step = 0; step < c.steps; ++step) {
        for (const rt::Task &t : order)
          addTask(p, t, step, job.programs[p.rank], job);
        if (split)
          addParamCopy(p, step, job.programs[p.rank], job);
      }
    }
    if (!groupError.empty()) {
      *error = groupError;
      return false;
    }
    return true;
  }

private:
  /// An instruction's price depends on it and the profile only: priced
  /// once (a grouped expert product looks through its program).
  double computeNs(const rt::Program &p, const rt::Instr &in) {
    auto [it, fresh] = computeCache.try_emplace(&in, 0.0);
    if (fresh)
      it->second = priceNs(p, in);
    return it->second;
  }

  double priceNs(const rt::Program &p, const rt::Instr &in) {
    double bytes = 0;
    for (int i : in.inputs)
      bytes += p.values[i].bytes;
    for (int i : in.outputs)
      bytes += p.values[i].bytes;
    // The cost model's instruction price (mapp/cost), as the
    // auto-parallel search prices a layer's instructions.
    mapp::cost::Costs costs(costProfile());
    double act = costs.activationNs(activationElements(p, in), bytes);
    return act + costs.instrNs(flopsOf(p, in), bytes, mapp::cost::DType::F32,
                               in.kernel == "attention" ||
                                   in.kernel == "attention_grad",
                               gemmMinDimOf(p, in));
  }

  /// The rates of the instruction model as a cost-model profile.
  const mapp::cost::Profile &costProfile() {
    if (!profileReady) {
      profile.gemmTflopsF32 = c.deviceTflops;
      profile.memGBps = c.memGBps;
      profile.opOverheadUs = c.opOverheadUs;
      profile.attentionEfficiency = c.attentionEfficiency;
      profile.gemmRatesF32 = c.gemmRates;
      profile.activationGelems = c.activationGelems;
      profileReady = true;
    }
    return profile;
  }

  double uniformUs(rt::BlockKind k) const {
    switch (k) {
    case rt::BlockKind::Forward:
      return c.forwardUs;
    case rt::BlockKind::Backward:
      return c.backwardUs;
    case rt::BlockKind::BackwardInput:
      return c.backwardInputUs;
    case rt::BlockKind::BackwardWeight:
      return c.backwardWeightUs;
    case rt::BlockKind::Optimizer:
      return 0;
    }
    return 0;
  }

  /// Split plans, uniform costs: F is one stage's forward on one rank of
  /// the backward side. A forward block is charged F times its FLOPs over
  /// that: fwd-tp T1 does T2/T1 of it on a forward rank; recompute's
  /// backward side re-runs all of it (1), activations' receives what it
  /// would compute (~0: the few ops recomputed from the received values).
  void scaleSplitForwards() {
    std::map<std::pair<int, int>, double> reference; // (stage, chunk)
    for (const rt::Program &p : plan.programs) {
      if (p.placement.role != "fwd")
        continue;
      int t1 = p.placement.tp > 0 ? p.placement.tp : plan.tp;
      for (const rt::Block &b : p.blocks)
        if (b.kind == rt::BlockKind::Forward)
          reference[{p.pp, b.chunk}] = blockFlops(p, b) * t1 / plan.tp;
    }
    for (const rt::Program &p : plan.programs)
      for (size_t b = 0; b < p.blocks.size(); ++b) {
        const rt::Block &blk = p.blocks[b];
        auto ref = reference.find({p.pp, blk.chunk});
        if (blk.kind == rt::BlockKind::Forward && ref != reference.end() &&
            ref->second > 0)
          forwardScale[{p.rank, int(b)}] = blockFlops(p, blk) / ref->second;
      }
  }

  int group(const rt::Program &p, const rt::Instr &in, SimJob &job) {
    std::vector<int> members;
    if (in.attrs.has("ranks")) {
      for (int64_t r : in.attrs.getInts("ranks"))
        members.push_back(int(r));
    } else {
      std::string g = in.attrs.getStr(
          "group", in.kernel == "grad_sync" || in.kernel == "param_gather"
                       ? "dp"
                       : "tp");
      std::string err;
      if (!fbd::namedGroup(plan, p, g, members, &err)) {
        if (groupError.empty())
          groupError = err;
        members = {p.rank};
      }
    }
    return groupId(in.kernel, members, job);
  }

  int groupId(const std::string &kind, std::vector<int> members, SimJob &job) {
    std::sort(members.begin(), members.end());
    auto it = groupIds.find(members);
    if (it != groupIds.end())
      return it->second;
    job.groups.push_back({kind, members});
    return groupIds[members] = int(job.groups.size() - 1);
  }

  void addTask(const rt::Program &p, const rt::Task &t, int step,
               std::vector<SimOp> &ops, SimJob &job) {
    const rt::Block &blk = p.blocks[t.block];
    bool opt = blk.kind == rt::BlockKind::Optimizer;
    double factor = rankFactor(p);
    double uniform = uniformUs(blk.kind);
    auto scale = forwardScale.find({p.rank, t.block});
    if (uniform > 0 && scale != forwardScale.end())
      uniform *= scale->second;
    size_t taskStart = ops.size();
    auto base = [&](const std::string &name) {
      SimOp op;
      op.name = name;
      op.step = step;
      op.mb = opt ? -1 : t.microbatch;
      op.chunk = blk.chunk;
      return op;
    };
    auto compute = [&](double ns) {
      if (ops.size() > taskStart && ops.back().kind == SimOp::Compute) {
        ops.back().durNs += ns;
        return;
      }
      SimOp op = base(blockName(blk));
      op.kind = SimOp::Compute;
      op.cat = opt ? Cat::Optimizer : Cat::Compute;
      op.durNs = ns;
      ops.push_back(op);
    };
    // Uniform costs: the task receives, computes for its whole cost, then
    // sends (the closed forms' model); else every instruction in order.
    bool uniformCost = uniform >= 0 && c.forwardUs >= 0;
    auto p2p = [&](const rt::Instr &in) {
      SimOp op = base(in.kernel);
      bool send = in.kernel == "send";
      op.kind = send ? SimOp::Send : SimOp::Recv;
      op.async = send; // isend: the sender does not wait for the wire
      op.cat = Cat::Comm;
      op.op = send ? Op::Send : Op::Recv;
      op.peer = int(in.attrs.getInt("peer", -1));
      op.bytes = p.values[send ? in.inputs[0] : in.outputs[0]].bytes;
      int64_t tag = in.attrs.getInt("tag", 0);
      op.tag = (tag * (plan.numMicrobatches + 1) + t.microbatch) *
                   (c.steps + 1) + step;
      ops.push_back(op);
    };
    auto collective = [&](const rt::Instr &in) {
      // Gradient buffers are synced on the step's last microbatch only.
      if (in.kernel == "grad_sync" && t.microbatch != plan.numMicrobatches - 1)
        return;
      int g = group(p, in, job);
      if (job.groups[g].members.size() < 2)
        return;
      SimOp op = base(in.kernel);
      op.kind = SimOp::Coll;
      op.cat = Cat::Comm;
      op.op = collOp(in.kernel, in.attrs);
      for (int i : in.inputs)
        op.bytes += p.values[i].bytes;
      op.group = g;
      op.seq = seq[{p.rank, g}]++;
      ops.push_back(op);
    };
    // Context-parallel attention (runtime backend/cpu/ContextParallel.cpp)
    // as the kernel runs it: a ring of K/V blocks (each step's block
    // product, the next block's buffered send posted before it; the
    // gradient runs the forward ring again for the log-sum-exp, then sends
    // K, V and the double dK/dV after each block) or Ulysses' all-to-alls
    // (3 + 1 forward; dout, q, k, v in and dq, dk, dv out backward).
    // Under uniform costs (below) the task's cost stands for all of it.
    auto cpAttention = [&](const rt::Instr &in) {
      std::vector<int> members;
      std::string err;
      if (!fbd::namedGroup(plan, p, in.attrs.getStr("group", "cp"), members,
                           &err)) {
        if (groupError.empty())
          groupError = err;
        members = {p.rank};
      }
      int g = groupId("cp", members, job);
      int n = int(members.size());
      bool grad = in.kernel == "cp_attention_grad";
      const rt::Value &q = p.values[in.inputs[grad ? 1 : 0]];
      const rt::Value &k = p.values[in.inputs[grad ? 2 : 1]];
      const rt::Value &v = p.values[in.inputs[grad ? 3 : 2]];
      double tl = q.type.shape.size() == 3 ? q.type.shape[1] : 0;
      mapp::cost::Costs costs(costProfile());
      auto blockNs = [&](double perPair) { // q's rows against tl keys
        return costs.instrNs(perPair * numel(q) * tl,
                             2.0 * q.bytes + k.bytes + v.bytes,
                             mapp::cost::DType::F32, true) *
               factor;
      };
      auto exchange = [&](uint64_t bytes) {
        SimOp op = base(in.kernel);
        op.kind = SimOp::Coll;
        op.cat = Cat::Comm;
        op.op = Op::AllToAll;
        op.bytes = bytes;
        op.group = g;
        op.seq = seq[{p.rank, g}]++;
        ops.push_back(op);
      };
      if (in.attrs.getStr("comm", "ring") == "a2a" && n > 1) {
        std::vector<uint64_t> pre = {q.bytes, k.bytes, v.bytes};
        if (grad)
          pre.insert(pre.begin(), q.bytes); // dout
        for (uint64_t b : pre)
          exchange(b);
        // All S rows of the rank's heads; the gradient recomputes the
        // forward (log-sum-exp) first, as the kernel does.
        compute(blockNs(grad ? 4.0 + 8.0 : 4.0) * n);
        std::vector<uint64_t> post = grad ? std::vector<uint64_t>{q.bytes,
                                                                  k.bytes,
                                                                  v.bytes}
                                          : std::vector<uint64_t>{q.bytes};
        for (uint64_t b : post)
          exchange(b);
        return;
      }
      int self = int(std::find(members.begin(), members.end(), p.rank) -
                     members.begin());
      int next = members[(self + 1) % n], prev = members[(self + n - 1) % n];
      auto msg = [&](bool send, int64_t tag, uint64_t bytes) {
        SimOp op = base(in.kernel);
        op.kind = send ? SimOp::Send : SimOp::Recv;
        op.async = send; // buffered: the sender goes on
        op.cat = Cat::Comm;
        op.op = send ? Op::Send : Op::Recv;
        op.peer = send ? next : prev;
        op.tag = tag;
        op.bytes = bytes;
        op.group = g;
        ops.push_back(op);
      };
      // Tags below the plans' (which are >= 0): ring messages only.
      const int64_t fwdTag = -32001, gradTag = -32002;
      for (int s = 0; s < n; ++s) {
        if (s + 1 < n)
          msg(true, grad ? gradTag : fwdTag, k.bytes + v.bytes);
        compute(blockNs(4.0));
        if (s + 1 < n)
          msg(false, grad ? gradTag : fwdTag, k.bytes + v.bytes);
      }
      if (!grad)
        return;
      for (int s = 0; s < n && n > 1; ++s) {
        compute(blockNs(8.0));
        uint64_t bytes = 3 * (k.bytes + v.bytes); // fp32 K, V; double dK, dV
        msg(true, gradTag, bytes);
        msg(false, gradTag, bytes);
      }
      if (n == 1)
        compute(blockNs(8.0));
    };
    if (uniformCost) {
      for (const rt::Instr &in : blk.instrs)
        if (in.kernel == "recv")
          p2p(in);
      if (uniform > 0)
        compute(uniform * 1e3 * factor);
      for (const rt::Instr &in : blk.instrs)
        if (isCollective(in.kernel))
          collective(in);
        else if (in.kernel == "send")
          p2p(in);
      return;
    }
    for (const rt::Instr &in : blk.instrs) {
      if (in.kernel == "send" || in.kernel == "recv")
        p2p(in);
      else if (in.kernel == "cp_attention" || in.kernel == "cp_attention_grad")
        cpAttention(in);
      else if (isCollective(in.kernel))
        collective(in);
      else
        compute(computeNs(p, in) * factor);
    }
  }

  /// Compute time multiplier: a slow-compute fault over the placement's
  /// device speed.
  double rankFactor(const rt::Program &p) const {
    auto slow = slowdown.find(p.rank);
    return (slow != slowdown.end() ? slow->second : 1.0) /
           fbd::speedOf(c, p);
  }

  /// The step-end parameter copy of a split plan (runtime syncFbdParams,
  /// after the optimizer): a backward rank sends each forward rank of its
  /// (stage, dp) its pieces in one blocking message, a forward rank
  /// receives them in backward-rank order. Through the coordinator (the
  /// default) the transfers fire after one world all-reduce of the
  /// pairs x world table and are followed by the one-double progress
  /// all-reduce and the table's second, empty round. Instruction costs also
  /// charge the host copies at mem_gbps: gathering each message, and the
  /// forward rank rebuilding what it received and storing its piece.
  void addParamCopy(const rt::Program &p, int step, std::vector<SimOp> &ops,
                    SimJob &job) {
    double factor = rankFactor(p);
    bool instrCost = !(c.forwardUs >= 0);
    auto op = [&](SimOp::Kind kind, const std::string &name) {
      SimOp o;
      o.kind = kind;
      o.name = name;
      o.step = step;
      o.cat = kind == SimOp::Compute ? Cat::Compute : Cat::Comm;
      return o;
    };
    std::vector<int> world(plan.worldSize);
    std::iota(world.begin(), world.end(), 0);
    int wg = groupId("world", world, job);
    auto worldAllReduce = [&](uint64_t bytes) {
      SimOp o = op(SimOp::Coll, "coordinator");
      o.op = Op::AllReduce;
      o.bytes = bytes;
      o.group = wg;
      o.seq = seq[{p.rank, wg}]++;
      ops.push_back(o);
    };
    uint64_t table = uint64_t(paramMsgs.size()) * plan.worldSize * 8;
    if (c.fbdCoordinator)
      worldAllReduce(table);
    int64_t tag = (rt::kFbdParamTag * (plan.numMicrobatches + 1) +
                   plan.numMicrobatches) * (c.steps + 1) + step;
    auto transfer = [&](SimOp::Kind kind, Op o, int peer, uint64_t bytes) {
      SimOp t = op(kind, "fbd_params");
      t.op = o;
      t.peer = peer;
      t.bytes = bytes;
      t.tag = tag;
      ops.push_back(t);
    };
    uint64_t received = 0;
    for (const fbd::ParamMessage &m : paramMsgs) {
      if (m.bwd == p.rank) {
        if (instrCost) {
          SimOp g = op(SimOp::Compute, "fbd_params.gather");
          g.durNs = m.bytes / c.memGBps * factor;
          ops.push_back(g);
        }
        transfer(SimOp::Send, Op::Send, m.fwd, m.bytes);
      } else if (m.fwd == p.rank) {
        transfer(SimOp::Recv, Op::Recv, m.bwd, m.bytes);
        received += m.bytes;
      }
    }
    if (instrCost && p.placement.role == "fwd") {
      uint64_t own = 0;
      for (const rt::Value &v : p.values)
        if (v.kind == rt::ValueKind::Param)
          own += uint64_t(v.type.numel()) * sizeof(float);
      SimOp r = op(SimOp::Compute, "fbd_params.rebuild");
      r.durNs = (received + own) / c.memGBps * factor;
      ops.push_back(r);
    }
    if (c.fbdCoordinator) {
      worldAllReduce(8);
      worldAllReduce(table);
    }
  }

  static std::string blockName(const rt::Block &b) {
    return std::string(rt::blockKindName(b.kind)) + ".c" +
           std::to_string(b.chunk);
  }

  const rt::Plan &plan;
  const PlanCluster &c;
  std::map<int, double> slowdown; // slow-compute faults
  bool split = false;
  std::map<std::pair<int, int>, double> forwardScale; // (rank, block)
  std::string groupError;
  std::unordered_map<const rt::Instr *, double> computeCache;
  std::map<std::vector<int>, int> groupIds;
  std::map<std::pair<int, int>, int64_t> seq;
};

SimConfig networkConfig(const rt::Plan &plan, const PlanCluster &c,
                        bool faults) {
  SimConfig sc;
  sc.tp = plan.tp;
  sc.pp = plan.pp;
  sc.dp = plan.dp;
  sc.gpusPerNode = c.gpusPerNode;
  sc.interGbps = c.gbps;
  sc.interLatencyUs = c.latencyUs;
  sc.intraGbps = c.intraGbps;
  sc.intraLatencyUs = c.intraLatencyUs;
  if (faults)
    sc.faults = c.faults;
  return sc;
}

bool replay(const rt::Plan &plan, const std::string &table,
            const PlanCluster &c, PlanSimResult &out, std::string *error) {
  SimJob job;
  JobBuilder jb(plan, c);
  if (!jb.build(table, job, out.peakInFlight, error))
    return false;
  SimTimes times;
  if (!runSim(job, makeNetwork(networkConfig(plan, c, true)), times, error)) {
    *error = "schedule '" + table + "': " + *error;
    return false;
  }
  std::vector<double> st = stepTimesNs(job, times);
  out.stepUs = st.empty() ? 0
                          : std::accumulate(st.begin(), st.end(), 0.0) /
                                st.size() * 1e-3;
  out.peakBytes.clear();
  out.roles.clear();
  out.paramCopyBytes = 0;
  for (const fbd::ParamMessage &m : jb.paramMsgs)
    out.paramCopyBytes += m.bytes;
  out.stagingBytes.clear();
  if (rt::isFbdPlan(plan))
    out.stagingBytes = fbd::stagingBytes(plan, jb.paramMsgs);
  for (const rt::Program &p : plan.programs)
    if (!p.placement.role.empty())
      out.roles.push_back(p.placement.role);
  for (size_t i = 0; i < plan.programs.size(); ++i) {
    const rt::Program &p = plan.programs[i];
    int64_t extra = std::max<int64_t>(0, out.peakInFlight[i] - 1);
    out.peakBytes.push_back(p.persistentBytes + p.arenaBytes +
                            uint64_t(extra) * p.stashBytes);
  }
  out.chosen = table;
  return true;
}

/// The slowest ratio (faulted / nominal transfer time) over the links the
/// plan's sends use, with the largest message each.
double slowestLink(const rt::Plan &plan, const PlanCluster &c, int &src,
                   int &dst) {
  SimNetwork nominal = makeNetwork(networkConfig(plan, c, false)),
             faulted = makeNetwork(networkConfig(plan, c, true));
  std::map<std::pair<int, int>, uint64_t> links;
  for (const rt::Program &p : plan.programs)
    for (const rt::Block &b : p.blocks)
      for (const rt::Instr &in : b.instrs)
        if (in.kernel == "send") {
          uint64_t &bytes =
              links[{p.rank, int(in.attrs.getInt("peer", -1))}];
          bytes = std::max<uint64_t>(bytes, p.values[in.inputs[0]].bytes);
        }
  double worst = 1;
  for (auto &[link, bytes] : links) {
    double t0 = nominal.p2p(link.first, link.second, bytes);
    double t1 = faulted.p2p(link.first, link.second, bytes);
    if (t0 > 0 && t1 / t0 > worst) {
      worst = t1 / t0;
      src = link.first;
      dst = link.second;
    }
  }
  return worst;
}

/// The order every rank runs one step in under the adaptive scheduler,
/// simulated: each rank, when free, takes among its candidate tasks (the
/// runtime's rules, mapp/rt/TaskPool.h) whose receives have arrived the one
/// first in the policy's table, or waits for the earliest arrival. The
/// policy is bfc while `slow` and the next microbatch fits the cap, else dfc.
/// Ranks decide in time order, so a decision sees every message that has
/// arrived by then. Collectives inside tasks are charged their transfer time
/// without synchronizing (tensor-parallel peers decide alike). The orders
/// then replay in the full engine for every step.
bool adaptiveOrders(const rt::Plan &plan, const PlanCluster &c, uint64_t cap,
                    bool slow, std::vector<std::vector<rt::Task>> &orders,
                    uint64_t &peakStash, bool &capBound, std::string *error) {
  SimNetwork net = makeNetwork(networkConfig(plan, c, true));
  JobBuilder jb(plan, c);
  SimJob scratch;
  scratch.world = plan.worldSize;
  struct Rank {
    const rt::Program *prog;
    std::unique_ptr<rt::sched::TaskPool> pool;
    std::vector<std::vector<SimOp>> ops; // per pool task
    double now = 0;
  };
  std::vector<Rank> ranks;
  try {
    for (const rt::Program &p : plan.programs) {
      Rank r;
      r.prog = &p;
      r.pool = std::make_unique<rt::sched::TaskPool>(plan, p, cap);
      for (size_t i = 0; i < r.pool->size(); ++i)
        r.ops.push_back(jb.taskOps(p, (*r.pool)[i].task, scratch));
      ranks.push_back(std::move(r));
    }
  } catch (const rt::Error &e) {
    *error = std::string("schedule 'adaptive': ") + e.what();
    return false;
  }
  std::map<std::tuple<int, int, int64_t>, double> arrival;
  std::map<std::pair<int, int>, double> linkFree;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  orders.assign(ranks.size(), {});
  capBound = false;
  std::map<int, size_t> indexOf; // program rank -> ranks[] index
  for (size_t k = 0; k < ranks.size(); ++k)
    indexOf[ranks[k].prog->rank] = k;
  // Each rank's next decision (when, which task, under which policy), kept
  // until the rank acts or a message to it is sent.
  struct Decision {
    bool valid = false;
    double when = kNever;
    int pick = -1, policy = rt::sched::DFC;
  };
  std::vector<Decision> next(ranks.size());
  auto decide = [&](size_t k) {
    Rank &r = ranks[k];
    Decision d;
    d.valid = true;
    if (!r.pool->remaining())
      return d;
    std::vector<int> cand[2];
    r.pool->candidates(cand);
    d.policy = slow && r.pool->nextFits() ? rt::sched::BFC : rt::sched::DFC;
    const std::vector<int> &from =
        cand[d.policy].empty() ? cand[rt::sched::BFC] : cand[d.policy];
    std::vector<double> readyAt(r.pool->size(), kNever);
    for (int i : from) {
      double t = r.now;
      for (const SimOp &op : r.ops[i])
        if (op.kind == SimOp::Recv) {
          auto it = arrival.find({op.peer, r.prog->rank, op.tag});
          t = std::max(t, it == arrival.end() ? kNever : it->second);
        }
      readyAt[i] = t;
      d.when = std::min(d.when, t);
    }
    if (d.when == kNever)
      return d;
    std::vector<char> ok(r.pool->size(), 0);
    for (int i : from)
      ok[i] = readyAt[i] <= d.when;
    d.pick = r.pool->pick(from, d.policy, &ok);
    return d;
  };
  for (;;) {
    int who = -1;
    double when = kNever;
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (!next[k].valid)
        next[k] = decide(k);
      if (next[k].when < when) {
        who = int(k);
        when = next[k].when;
      }
    }
    if (who < 0)
      break;
    const int pick = next[who].pick;
    capBound |= slow && next[who].policy == rt::sched::DFC;
    next[who].valid = false;
    Rank &r = ranks[who];
    double t = when;
    for (const SimOp &op : r.ops[pick]) {
      if (op.kind == SimOp::Compute) {
        t += op.durNs;
      } else if (op.kind == SimOp::Coll) {
        t += net.coll(scratch.groups[op.group], op.op, op.bytes);
      } else if (op.kind == SimOp::Send) {
        arrival[{r.prog->rank, op.peer, op.tag}] = postAsyncSend(
            t, linkFree[{r.prog->rank, op.peer}],
            net.p2p(r.prog->rank, op.peer, op.bytes),
            net.p2p(r.prog->rank, op.peer, 0));
        auto peer = indexOf.find(op.peer);
        if (peer != indexOf.end())
          next[peer->second].valid = false;
      }
    }
    r.now = t;
    const rt::Task task = (*r.pool)[pick].task;
    r.pool->start(pick);
    r.pool->finish(task);
    orders[who].push_back(task);
  }
  peakStash = 0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    Rank &r = ranks[k];
    if (r.pool->remaining()) {
      *error = "schedule 'adaptive': rank " + std::to_string(r.prog->rank) +
               " cannot run its remaining " +
               std::to_string(r.pool->remaining()) +
               " task(s): their receives are never sent (tables that "
               "disagree with the sends?)";
      return false;
    }
    peakStash = std::max(peakStash, r.pool->peakStashBytes());
    // Optimizer blocks run at the step's end, in the dfc table's order.
    for (const rt::ScheduleTable &tab : r.prog->scheduleTables)
      if (tab.name == "dfc")
        for (const rt::Task &task : tab.tasks)
          if (r.prog->blocks[task.block].kind == rt::BlockKind::Optimizer)
            orders[k].push_back(task);
  }
  return true;
}

} // namespace

bool mapp::scan::simulatePlan(const rt::Plan &plan, const std::string &schedule,
                              const PlanCluster &cluster, PlanSimResult &out,
                              std::string *error) {
  out = PlanSimResult();
  out.schedule = schedule;
  if (cluster.steps < 1) {
    *error = "steps must be >= 1";
    return false;
  }
  if (schedule != "adaptive")
    return replay(plan, schedule, cluster, out, error);
  std::vector<std::string> names = planSchedules(plan);
  if (std::find(names.begin(), names.end(), "adaptive") == names.end()) {
    *error = "schedule 'adaptive' needs a plan compiled with "
             "schedule=adaptive (dfc and bfc tables)";
    return false;
  }
  // The adaptive policy, decided task by task with the runtime's rules on
  // the modeled arrivals (adaptiveOrders): depth-first while no link is
  // slow; under a slow link breadth-first, admitting a microbatch only while
  // the stash it reserves fits the cap (--mem-cap, else the plan's).
  uint64_t cap = cluster.memCapBytes ? cluster.memCapBytes
                                     : plan.adaptive.memCapBytes;
  int src = -1, dst = -1;
  double ratio = slowestLink(plan, cluster, src, dst);
  const bool slow = ratio >= plan.adaptive.slowLinkRatio;
  std::vector<std::vector<rt::Task>> orders;
  uint64_t peakStash = 0;
  bool capBound = false;
  if (!adaptiveOrders(plan, cluster, cap, slow, orders, peakStash, capBound,
                      error))
    return false;
  rt::Plan ordered = plan;
  for (size_t k = 0; k < ordered.programs.size(); ++k)
    ordered.programs[k].tasks = orders[k];
  ordered.schedule = "adaptive";
  if (!replay(ordered, "adaptive", cluster, out, error))
    return false;
  char why[320];
  if (!slow) {
    out.chosen = "dfc";
    std::snprintf(why, sizeof why,
                  "no link is %.2fx slower than nominal (slowest %.2fx)",
                  plan.adaptive.slowLinkRatio, ratio);
  } else if (!capBound) {
    out.chosen = "bfc";
    std::snprintf(why, sizeof why,
                  "link %d->%d is %.2fx slower (>= %.2f) and %s", src, dst,
                  ratio, plan.adaptive.slowLinkRatio,
                  cap ? "bfc's stash fits the cap" : "no memory cap");
  } else {
    out.chosen = "bfc under the cap";
    std::snprintf(why, sizeof why,
                  "link %d->%d is %.2fx slower (>= %.2f); under the cap %llu "
                  "B (stash peak %llu B) a microbatch waits for backwards to "
                  "free its stash",
                  src, dst, ratio, plan.adaptive.slowLinkRatio,
                  (unsigned long long)cap, (unsigned long long)peakStash);
  }
  out.schedule = "adaptive";
  out.reason = why;
  out.peakStashBytes = peakStash;
  return true;
}
