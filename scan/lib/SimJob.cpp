//===- SimJob.cpp - mapp-sim's job model: the ranks' programs ------------===//
//
// buildSimJob: a config-mode job (SimConfig) as the engine's per-rank
// programs of compute, point-to-point and collective operations.
//
//===----------------------------------------------------------------------===//

#include "mapp/cost/CostModel.h"
#include "mapp/scan/Sim.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

using namespace mapp::scan;

namespace {
struct Builder {
  const SimConfig &c;
  SimJob &job;
  int R;
  std::map<std::string, int> groupIds;
  std::vector<std::map<int, int64_t>> seqs; // per rank: group -> next seq
  Phase phase = Phase::None; // of the ops base() makes (the task's pass)
  std::map<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>, int32_t>
      peerBytesIds;

  int rankOf(int t, int d, int p) const { return t + c.tp * (d + c.dp * p); }

  int group(const std::string &kind, std::vector<int> members) {
    std::sort(members.begin(), members.end());
    std::string key = kind;
    for (int m : members)
      key += "," + std::to_string(m);
    auto it = groupIds.find(key);
    if (it != groupIds.end())
      return it->second;
    job.groups.push_back({kind, members});
    return groupIds[key] = job.groups.size() - 1;
  }

  SimOp base(const char *name, Cat cat, int step, int mb, int layer,
             int chunk) {
    SimOp op;
    op.name = name;
    op.cat = cat;
    op.step = step;
    op.mb = mb;
    op.layer = layer;
    op.chunk = chunk;
    op.phase = phase;
    return op;
  }

  void compute(int r, SimOp op, double ns) {
    takePostGap(r, op);
    op.kind = SimOp::Compute;
    size_t idx = job.programs[r].size();
    double j = 1 + c.jitter * hashNormal(c.seed, r, idx);
    op.durNs = ns * std::max(0.2, j);
    for (const Fault &f : c.faults)
      if (f.kind == Fault::SlowCompute && f.rank == r)
        op.durNs *= f.value;
    job.programs[r].push_back(op);
  }

  void coll(int r, SimOp op, int g, uint64_t bytes) {
    op.kind = SimOp::Coll;
    op.cat = Cat::Comm;
    op.op = Op::AllReduce;
    op.group = g;
    op.bytes = bytes;
    op.seq = seqs[r][g]++;
    op.exitSkewNs = c.exitSkewUs * 1e3 *
                    hashUniform(c.seed ^ 0x5eed, r, job.programs[r].size());
    job.programs[r].push_back(op);
  }

  // A variable all_to_all over the ep group (ep_dispatch / ep_combine).
  void allToAll(int r, SimOp op, int g, const SimPeerBytes &counts) {
    uint64_t busiest = 0; // the member that moves the most paces it
    for (size_t m = 0; m < counts.send.size(); ++m)
      busiest = std::max(busiest, std::max(counts.send[m], counts.recv[m]));
    coll(r, op, g, busiest * counts.send.size());
    SimOp &o = job.programs[r].back();
    o.op = Op::AllToAll;
    auto key = std::make_pair(counts.send, counts.recv);
    auto it = peerBytesIds.find(key);
    if (it == peerBytesIds.end()) {
      it = peerBytesIds.emplace(key, (int32_t)job.peerBytes.size()).first;
      job.peerBytes.push_back(counts);
    }
    o.peerBytes = it->second;
  }

  // Share of all routed rows that member j's experts get.
  double memberShare(int j) const {
    int per = c.moeExperts / c.ep;
    double s = 0;
    for (int e = j * per; e < (j + 1) * per; ++e)
      s += c.moeExpertLoad[e];
    return s;
  }

  // The experts of one layer on rank r: dispatch, the experts' compute
  // (proportional to the rows they got), combine. The backward runs the
  // same exchanges around the experts' backward: the combine's gradient
  // moves what the dispatch did, the dispatch's gradient what the combine
  // did (named as the runtime names them, after the forward op).
  void experts(int r, int step, int mb, int l, int chunk, bool fwd) {
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    double factor = fwd ? 1.0 : c.backwardFactor;
    const char *work = fwd ? "fwd.experts" : "bwd.experts";
    if (c.ep == 1) {
      compute(r, base(work, Cat::Compute, step, mb, l, chunk),
              factor * c.moeExpertUs * 1e3 * tokenShare());
      return;
    }
    std::vector<int> members;
    for (int k = 0; k < c.ep; ++k)
      members.push_back(rankOf(t, d - d % c.ep + k, s));
    int g = group("ep", members);
    int me = d % c.ep, n = c.ep;
    SimPeerBytes dispatch, combine;
    for (int j = 0; j < n; ++j) {
      uint64_t toJ = (uint64_t)std::llround(c.moeDispatchBytes * memberShare(j));
      uint64_t fromJ =
          (uint64_t)std::llround(c.moeDispatchBytes * memberShare(me));
      dispatch.send.push_back(toJ);
      dispatch.recv.push_back(fromJ);
      combine.send.push_back(fromJ);
      combine.recv.push_back(toJ);
    }
    allToAll(r, base(fwd ? "fwd.ep_dispatch" : "bwd.ep_combine", Cat::Comm,
                     step, mb, l, chunk),
             g, dispatch);
    compute(r, base(work, Cat::Compute, step, mb, l, chunk),
            factor * c.moeExpertUs * 1e3 * n * memberShare(me));
    allToAll(r, base(fwd ? "fwd.ep_combine" : "bwd.ep_dispatch", Cat::Comm,
                     step, mb, l, chunk),
             g, combine);
  }

  void p2p(int r, SimOp op, bool send, int peer, int64_t tag) {
    op.kind = send ? SimOp::Send : SimOp::Recv;
    op.cat = Cat::Comm;
    op.op = send ? Op::Send : Op::Recv;
    op.peer = peer;
    op.tag = tag;
    op.bytes = scaled(c.activationBytes);
    job.programs[r].push_back(op);
  }

  //===--- Context parallelism (docs/mapp-sim.md) --------------------------===//

  // Ring messages' tags, the runtime kernel's (backend/cpu/ContextParallel).
  static constexpr int64_t kRingTag = 32001, kRingGradTag = 32002,
                           kRingDkvTag = 32003;

  bool attentionModeled() const { return c.attentionForwardNs() > 0; }
  /// A rank's share of the position-local work: its S/cp tokens.
  double tokenShare() const { return attentionModeled() ? 1.0 / c.cp : 1.0; }
  uint64_t scaled(uint64_t bytes) const {
    return uint64_t(std::llround(bytes * tokenShare()));
  }

  SimOp named(const std::string &name, Cat cat, int step, int mb, int layer,
              int chunk) {
    SimOp op = base("", cat, step, mb, layer, chunk);
    op.name = name;
    return op;
  }

  // A ring transfer: sends are non-blocking (posted before the block's
  // compute, so the transfer overlaps it); receives wait for the bytes.
  void ringMsg(int r, SimOp op, bool send, int peer, int64_t tag,
               uint64_t bytes, int g) {
    takePostGap(r, op);
    if (send) // the op after it starts a nanosecond later (takePostGap)
      postGap.insert(r);
    op.kind = send ? SimOp::Send : SimOp::Recv;
    op.cat = Cat::Comm;
    op.op = send ? Op::Send : Op::Recv;
    op.peer = peer;
    op.tag = tag;
    op.bytes = bytes;
    op.async = send;
    op.group = g; // classifies the transfer as cp in the exposure truth
    job.programs[r].push_back(op);
  }

  // A non-blocking send takes no time; the op after it starts 1 ns later,
  // so that in the trace the send does not lie inside that op (the
  // exposure's regions: mapp/monitor/Exposure.h would take an event that
  // begins with a zero-length one as a region around it).
  std::set<int> postGap;
  void takePostGap(int r, SimOp &op) {
    if (postGap.erase(r))
      op.gapNs += 1;
  }

  void cpAllToAll(int r, SimOp op, int g, uint64_t bytes) {
    coll(r, op, g, bytes);
    job.programs[r].back().op = Op::AllToAll;
  }

  // One layer's causal attention core on rank r, forward or backward.
  // `pre` names a recomputation ("recompute.").
  void attentionCore(int r, int step, int mb, int l, int chunk, bool fwd,
                     const std::string &pre) {
    double core = c.attentionForwardNs();
    if (!fwd)
      core *= c.attentionBackwardFactor > 0 ? c.attentionBackwardFactor
                                            : c.backwardFactor;
    std::string dir = pre + (fwd ? "fwd" : "bwd");
    auto op = [&](const char *what, Cat cat) {
      return named(dir + what, cat, step, mb, l, chunk);
    };
    if (c.cp == 1) {
      compute(r, op(".attn.core", Cat::Compute), core);
      return;
    }
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    int n = c.cp, me = d % n;
    std::vector<int> members;
    for (int k = 0; k < n; ++k)
      members.push_back(rankOf(t, d - me + k, s));
    int g = group("cp", members);
    if (c.cpComm == "a2a") {
      // Ulysses: sequence-sharded q, k, v become head-sharded over all S
      // rows (each member the same work: 1/cp of the heads); the output
      // goes back. The backward exchanges dout in and dq, dk, dv out.
      uint64_t q = c.headsShareBytes(c.heads / c.tp),
               kv = c.headsShareBytes(c.kvHeads / c.tp);
      std::vector<uint64_t> in = fwd ? std::vector<uint64_t>{q, kv, kv}
                                     : std::vector<uint64_t>{q};
      std::vector<uint64_t> out = fwd ? std::vector<uint64_t>{q}
                                      : std::vector<uint64_t>{q, kv, kv};
      for (uint64_t b : in)
        cpAllToAll(r, op(".cp_a2a", Cat::Comm), g, b);
      compute(r, op(".attn.core", Cat::Compute), core / n);
      for (uint64_t b : out)
        cpAllToAll(r, op(".cp_a2a", Cat::Comm), g, b);
      return;
    }
    // Ring: at step k the rank holds member (me - k)'s K/V block and does
    // its causal pairs against it; the next block travels meanwhile.
    int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
    uint64_t block = c.kvBlockBytes();
    for (int k = 0; k < n; ++k) {
      int src = (me - k + n) % n;
      bool more = k < n - 1;
      if (more)
        ringMsg(r, op(".cp_ring", Cat::Comm), true, next,
                fwd ? kRingTag : kRingGradTag, block, g);
      compute(r, op(".attn.core", Cat::Compute),
              core * c.causalPairShare(me, src));
      if (!fwd) {
        // dK/dV of the block: the partial sum of the members before this
        // one comes in, this member's part is added, the sum goes on.
        if (k > 0)
          ringMsg(r, op(".cp_ring.grad", Cat::Comm), false, prev, kRingDkvTag,
                  block, g);
        ringMsg(r, op(".cp_ring.grad", Cat::Comm), true, next, kRingDkvTag,
                block, g);
      }
      if (more)
        ringMsg(r, op(".cp_ring", Cat::Comm), false, prev,
                fwd ? kRingTag : kRingGradTag, block, g);
    }
    if (!fwd) // the rank's own block's full dK/dV comes home
      ringMsg(r, op(".cp_ring.grad", Cat::Comm), false, prev, kRingDkvTag,
              block, g);
  }

  // One layer's forward on rank r (again, under full recomputation, at the
  // start of its backward).
  void layerForward(int r, int step, int mb, int l, int chunk, int tpg,
                    bool recompute) {
    std::string pre = recompute ? "recompute." : "";
    double lf = c.layerForwardNs() * tokenShare();
    uint64_t tpBytes = scaled(c.tpAllreduceBytes);
    compute(r, named(pre + "fwd.attn", Cat::Compute, step, mb, l, chunk),
            0.4 * lf);
    if (attentionModeled())
      attentionCore(r, step, mb, l, chunk, true, pre);
    if (tpg >= 0)
      coll(r, named(pre + "fwd.attn.allreduce", Cat::Comm, step, mb, l, chunk),
           tpg, tpBytes);
    compute(r, named(pre + "fwd.mlp", Cat::Compute, step, mb, l, chunk),
            0.6 * lf);
    if (c.moeExperts > 0)
      experts(r, step, mb, l, chunk, true);
    if (tpg >= 0)
      coll(r, named(pre + "fwd.mlp.allreduce", Cat::Comm, step, mb, l, chunk),
           tpg, tpBytes);
  }

  // One forward or backward task of (chunk, mb) on rank r.
  void task(int r, int step, int chunk, int mb, bool fwd) {
    phase = fwd ? Phase::Forward : Phase::Backward;
    taskOps(r, step, chunk, mb, fwd);
    phase = Phase::None;
  }

  void taskOps(int r, int step, int chunk, int mb, bool fwd) {
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    int V = c.pp * c.chunks, vs = chunk * c.pp + s;
    const int l0 = c.firstLayer(vs), l1 = c.firstLayer(vs + 1);
    int prev = rankOf(t, d, (s + c.pp - 1) % c.pp);
    int next = rankOf(t, d, (s + 1) % c.pp);
    int64_t M = c.microbatches;
    int tpg = c.tp > 1 ? group("tp", tpMembers(d, s)) : -1;
    double lf = c.layerForwardNs() * tokenShare();
    if (fwd) {
      if (vs == 0) {
        if (c.dataUs > 0)
          compute(r, base("data.load", Cat::Data, step, mb, -1, chunk),
                  c.dataUs * 1e3 * tokenShare());
        if (c.embeddingUs > 0)
          compute(r, base("fwd.embedding", Cat::Compute, step, mb, -1, chunk),
                  c.embeddingUs * 1e3 * tokenShare());
      } else {
        p2p(r, base("recv.fwd", Cat::Comm, step, mb, -1, chunk), false, prev,
            (2 * vs) * M + mb);
      }
      for (int l = l0; l < l1; ++l)
        layerForward(r, step, mb, l, chunk, tpg, false);
      if (vs == V - 1) {
        if (c.lossUs > 0)
          compute(r, base("fwd.loss", Cat::Compute, step, mb, -1, chunk),
                  c.lossUs * 1e3 * tokenShare());
      } else {
        p2p(r, base("send.fwd", Cat::Comm, step, mb, -1, chunk), true, next,
            (2 * (vs + 1)) * M + mb);
      }
      return;
    }
    if (vs != V - 1)
      p2p(r, base("recv.bwd", Cat::Comm, step, mb, -1, chunk), false, next,
          (2 * vs + 1) * M + mb);
    double bf = c.backwardFactor * lf;
    uint64_t tpBytes = scaled(c.tpAllreduceBytes);
    for (int l = l1 - 1; l >= l0; --l) {
      if (c.recomputeFull)
        layerForward(r, step, mb, l, chunk, tpg, true);
      if (c.moeExperts > 0)
        experts(r, step, mb, l, chunk, false);
      compute(r, base("bwd.mlp", Cat::Compute, step, mb, l, chunk), 0.6 * bf);
      if (tpg >= 0)
        coll(r, base("bwd.mlp.allreduce", Cat::Comm, step, mb, l, chunk), tpg,
             tpBytes);
      if (attentionModeled())
        attentionCore(r, step, mb, l, chunk, false, "");
      compute(r, base("bwd.attn", Cat::Compute, step, mb, l, chunk), 0.4 * bf);
      if (tpg >= 0)
        coll(r, base("bwd.attn.allreduce", Cat::Comm, step, mb, l, chunk), tpg,
             tpBytes);
      if (c.overlapGradReduce && c.dp > 1 && mb == M - 1)
        gradBucket(r, step, chunk, l, l1 - l0);
    }
    if (vs != 0)
      p2p(r, base("send.bwd", Cat::Comm, step, mb, -1, chunk), true, prev,
          (2 * (vs - 1) + 1) * M + mb);
    else if (c.embeddingUs > 0)
      compute(r, base("bwd.embedding", Cat::Compute, step, mb, -1, chunk),
              c.embeddingUs * 1e3 * tokenShare());
  }

  // Overlapped gradient reduction: the layer's gradients are complete after
  // the last microbatch's backward of it; the rank's communication stream
  // (program R + r) all-reduces them over its DP peers' streams while the
  // compute stream goes on.
  void gradBucket(int r, int step, int chunk, int layer, int layersPerChunk) {
    int t = r % c.tp, s = r / (c.tp * c.dp);
    std::vector<int> m;
    for (int dd = 0; dd < c.dp; ++dd)
      m.push_back(R + rankOf(t, dd, s));
    streamSignal(r, R + r, step);
    SimOp op = base("grad.allreduce", Cat::Comm, step, -1, layer, chunk);
    op.phase = Phase::None;
    coll(R + r, op, group("dp", m),
         c.dpAllreduceBytes / (c.chunks * layersPerChunk));
  }

  // Program `to` waits here until `from` reaches this point.
  void streamSignal(int from, int to, int step) {
    SimOp s = base("stream.signal", Cat::Comm, step, -1, -1, -1);
    s.kind = SimOp::Send;
    s.op = Op::Send;
    s.peer = to;
    s.tag = 0;
    s.streamSync = true;
    job.programs[from].push_back(s);
    s.kind = SimOp::Recv;
    s.op = Op::Recv;
    s.peer = from;
    job.programs[to].push_back(s);
  }

  std::vector<int> tpMembers(int d, int s) const {
    std::vector<int> m;
    for (int t = 0; t < c.tp; ++t)
      m.push_back(rankOf(t, d, s));
    return m;
  }

  // The (forward?, chunk, mb) task order of pipeline stage s.
  std::vector<std::tuple<bool, int, int>> order(int s) const {
    std::vector<std::tuple<bool, int, int>> o;
    int M = c.microbatches, v = c.chunks, p = c.pp;
    if (c.schedule == "gpipe") {
      for (int ch = 0; ch < v; ++ch)
        for (int m = 0; m < M; ++m)
          o.push_back({true, ch, m});
      for (int ch = v - 1; ch >= 0; --ch)
        for (int m = 0; m < M; ++m)
          o.push_back({false, ch, m});
      return o;
    }
    if (c.schedule == "1f1b") {
      int warm = std::min(p - s - 1, M);
      for (int m = 0; m < warm; ++m)
        o.push_back({true, 0, m});
      for (int m = 0; m < M - warm; ++m) {
        o.push_back({true, 0, m + warm});
        o.push_back({false, 0, m});
      }
      for (int m = M - warm; m < M; ++m)
        o.push_back({false, 0, m});
      return o;
    }
    // Megatron's interleaved 1F1B.
    int total = M * v;
    int warm = std::min((p - s - 1) * 2 + (v - 1) * p, total);
    auto chunkOf = [&](int k, bool fwd) {
      int ch = (k % (p * v)) / p;
      return fwd ? ch : v - 1 - ch;
    };
    auto mbOf = [&](int k) { return (k / (p * v)) * p + k % p; };
    for (int k = 0; k < warm; ++k)
      o.push_back({true, chunkOf(k, true), mbOf(k)});
    for (int k = 0; k < total - warm; ++k) {
      o.push_back({true, chunkOf(k + warm, true), mbOf(k + warm)});
      o.push_back({false, chunkOf(k, false), mbOf(k)});
    }
    for (int k = total - warm; k < total; ++k)
      o.push_back({false, chunkOf(k, false), mbOf(k)});
    return o;
  }
};
} // namespace

bool mapp::scan::buildSimJob(const SimConfig &c, SimJob &job,
                             std::string *error) {
  int R = c.tp * c.pp * c.dp;
  job = SimJob();
  job.world = R;
  job.tp = c.tp;
  job.pp = c.pp;
  job.dp = c.dp;
  // With overlapped gradient reduction each rank has a communication
  // stream: program R + r.
  int programs = c.overlapGradReduce && c.dp > 1 ? 2 * R : R;
  job.programs.assign(programs, {});
  for (int r = 0; R + r < programs; ++r) {
    job.streamOwner.push_back(r);
    job.streamName.push_back("comm");
  }
  Builder b{c, job, R, {}, std::vector<std::map<int, int64_t>>(programs)};
  for (int step = 0; step < c.steps; ++step)
    for (int r = 0; r < R; ++r) {
      int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
      for (auto [fwd, ch, mb] : b.order(s))
        b.task(r, step, ch, mb, fwd);
      if (c.dp > 1 && c.overlapGradReduce) {
        b.streamSignal(R + r, r, step); // the update waits for the buckets
      } else if (c.dp > 1) {
        std::vector<int> m;
        for (int dd = 0; dd < c.dp; ++dd)
          m.push_back(b.rankOf(t, dd, s));
        int g = b.group("dp", m);
        for (int ch = 0; ch < c.chunks; ++ch)
          b.coll(r, b.base("grad.allreduce", Cat::Comm, step, -1, -1, ch), g,
                 c.dpAllreduceBytes / c.chunks);
      }
      if (c.gradNormAllreduce && c.tp * c.pp > 1) {
        std::vector<int> m;
        for (int ss = 0; ss < c.pp; ++ss)
          for (int tt = 0; tt < c.tp; ++tt)
            m.push_back(b.rankOf(tt, d, ss));
        b.coll(r, b.base("grad-norm.allreduce", Cat::Comm, step, -1, -1, -1),
               b.group("mp", m), 8);
      }
      if (c.optimizerUs > 0)
        b.compute(r, b.base("optimizer.step", Cat::Optimizer, step, -1, -1, -1),
                  c.optimizerUs * 1e3);
    }
  // Memory: what a stage stashes per microbatch in flight (its layers'
  // activations over the rank's S/cp tokens) at the schedule's worst point.
  if (c.persistentBytes || c.layerStashBytes || c.workingBytes) {
    double share = b.tokenShare();
    for (int r = 0; r < R; ++r) {
      int s = r / (c.tp * c.dp);
      double inFlight = 0, peak = 0;
      for (auto [fwd, ch, mb] : b.order(s)) {
        int vs = ch * c.pp + s;
        int layers = c.firstLayer(vs + 1) - c.firstLayer(vs);
        inFlight += (fwd ? 1 : -1) * double(layers) * c.layerStashBytes;
        peak = std::max(peak, inFlight);
      }
      job.peakBytes.push_back(
          c.persistentBytes +
          uint64_t(std::llround((peak + c.workingBytes) * share)));
    }
  }
  (void)error;
  return true;
}
