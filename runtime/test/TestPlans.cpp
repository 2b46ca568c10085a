//===- TestPlans.cpp ------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/plan_generated.h"

#include <algorithm>
#include <map>
#include <stdexcept>

using namespace mapp::rt;
using namespace mapp::rt::test;
namespace fb = mapp::plan;

namespace {

flatbuffers::Offset<fb::Attr> buildAttr(flatbuffers::FlatBufferBuilder &b,
                                        const std::string &key,
                                        const AttrValue &v) {
  auto k = b.CreateString(key);
  switch (v.kind) {
  case AttrValue::Int:
    return fb::CreateAttr(b, k, fb::AttrKind::Int, v.i);
  case AttrValue::Float:
    return fb::CreateAttr(b, k, fb::AttrKind::Float, 0, v.f);
  case AttrValue::Str:
    return fb::CreateAttr(b, k, fb::AttrKind::Str, 0, 0, b.CreateString(v.s));
  case AttrValue::Ints:
    return fb::CreateAttr(b, k, fb::AttrKind::Ints, 0, 0, 0,
                          b.CreateVector(v.ints));
  case AttrValue::Floats:
    return fb::CreateAttr(b, k, fb::AttrKind::Floats, 0, 0, 0, 0,
                          b.CreateVector(v.floats));
  }
  return {};
}

} // namespace

namespace {

flatbuffers::Offset<fb::Program> buildProgram(flatbuffers::FlatBufferBuilder &b,
                                              const PlanSpec &ps) {
  uint64_t arena = 0, pool = 0;
  std::vector<flatbuffers::Offset<fb::Value>> vals;
  for (const TValue &v : ps.values) {
    uint64_t bytes = numel(v.shape) * (v.storageBf16 ? 2 : dtypeSize(v.dtype));
    uint64_t &space = inArena(v.kind) ? arena : pool;
    uint64_t off = space;
    space += (bytes + 63) / 64 * 64;
    if (v.offset >= 0)
      off = v.offset;
    if (v.bytes >= 0)
      bytes = v.bytes;
    vals.push_back(fb::CreateValue(
        b, b.CreateString(v.name), static_cast<fb::ValueKind>(v.kind),
        static_cast<fb::DType>(v.dtype), b.CreateVector(v.shape), off, bytes,
        v.param, v.shardDim,
        v.shardGroup.empty() ? 0 : b.CreateString(v.shardGroup),
        v.shardBlocks, v.storageBf16));
  }
  std::vector<flatbuffers::Offset<fb::Block>> blks;
  for (const TBlock &blk : ps.blocks) {
    std::vector<flatbuffers::Offset<fb::Instr>> ins;
    for (const TInstr &in : blk.instrs) {
      std::vector<flatbuffers::Offset<fb::Attr>> attrs;
      for (const auto &[k, v] : in.attrs.all())
        attrs.push_back(buildAttr(b, k, v));
      ins.push_back(
          fb::CreateInstr(b, b.CreateString(in.kernel), b.CreateVector(in.in),
                          b.CreateVector(in.out), b.CreateVector(attrs),
                          b.CreateString(in.kernel)));
    }
    blks.push_back(fb::CreateBlock(b, static_cast<fb::BlockKind>(blk.kind),
                                   blk.chunk, b.CreateVector(ins)));
  }
  std::vector<fb::Task> ts;
  for (auto [blk, mb] : ps.tasks)
    ts.emplace_back(blk, mb);
  std::vector<flatbuffers::Offset<fb::ScheduleTable>> tables;
  for (const auto &[name, tasks] : ps.scheduleTables) {
    std::vector<fb::Task> tt;
    for (auto [blk, mb] : tasks)
      tt.emplace_back(blk, mb);
    tables.push_back(fb::CreateScheduleTable(b, b.CreateString(name),
                                             b.CreateVectorOfStructs(tt)));
  }
  const Placement &pl = ps.placement;
  flatbuffers::Offset<fb::Placement> placement = 0;
  if (!pl.backend.empty() || pl.device != -1 || !pl.role.empty() ||
      pl.peerRank != -1 || pl.tp != 0)
    placement = fb::CreatePlacement(b, b.CreateString(pl.backend), pl.device,
                                    b.CreateString(pl.role), pl.peerRank,
                                    pl.tp);
  return fb::CreateProgram(b, ps.rank, ps.dp, ps.pp, ps.tp,
                           b.CreateVector(vals), b.CreateVector(blks),
                           b.CreateVectorOfStructs(ts), arena, pool, ps.slots,
                           ps.tokens, ps.targets, ps.loss,
                           arena * ps.slots + pool,
                           tables.empty() ? 0 : b.CreateVector(tables),
                           ps.stashBytes ? ps.stashBytes
                                         : arena / std::max<uint64_t>(
                                                       1, ps.chunksHint),
                           placement);
}

} // namespace

std::vector<uint8_t> PlanSpec::build() const {
  MultiPlanSpec m;
  m.schedule = "gpipe";
  m.programs = {*this};
  return m.build();
}

std::vector<uint8_t> MultiPlanSpec::build() const {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::Program>> progs;
  for (const PlanSpec &ps : programs)
    progs.push_back(buildProgram(b, ps));
  const PlanSpec &f = programs.front();
  auto plan = fb::CreatePlan(
      b, f.version,
      worldSize ? worldSize : static_cast<int>(programs.size()), tp, pp, dp,
      chunks,
      f.microBatchSize, f.numMicrobatches, f.seqLength, f.vocabSize,
      b.CreateString(schedule), b.CreateString(f.optimizer), f.maxGradNorm,
      b.CreateVector(progs), traceEvery, traceWindow,
      schedule == "adaptive"
          ? fb::CreateAdaptivePolicy(b, adaptive.memCapBytes,
                                     adaptive.slowLinkRatio,
                                     adaptive.bandwidthSmoothing)
          : 0);
  fb::FinishPlanBuffer(b, plan);
  return sealPlan(b.GetBufferPointer(), b.GetSize());
}

void mapp::rt::test::setLossScaleAttrs(const MlpOptions &o, Attrs &at) {
  if (o.lossScale.empty())
    return;
  at.setStr("loss_scale", o.lossScale);
  at.setFloat("loss_scale_init", o.lossScaleInit);
  at.setFloat("loss_scale_growth", o.lossScaleGrowth);
  at.setFloat("loss_scale_backoff", o.lossScaleBackoff);
  at.setInt("loss_scale_growth_interval", o.lossScaleGrowthInterval);
  if (o.lossScaleLimit > 0)
    at.setFloat("loss_scale_limit", o.lossScaleLimit);
}

PlanSpec mapp::rt::test::mlpPlan(const MlpOptions &o) {
  PlanSpec s;
  s.microBatchSize = o.batch;
  s.seqLength = o.seq;
  s.vocabSize = o.vocab;
  s.numMicrobatches = o.microbatches;
  s.optimizer = o.optimizer;
  s.maxGradNorm = o.maxGradNorm;
  const int B = o.batch, T = o.seq, V = o.vocab, H = o.hidden, F = o.ffn;
  const DType f = DType::F32, i32 = DType::I32;
  auto temp = [&](const std::string &n, Shape sh) {
    return s.add({n, ValueKind::Temp, f, sh});
  };
  int tok = s.add({"tokens", ValueKind::Input, i32, {B, T}});
  int tgt = s.add({"targets", ValueKind::Input, i32, {B, T}});
  struct P {
    const char *name;
    Shape shape;
    int value, grad;
  };
  std::vector<P> params = {{"wte.weight", {V, H}, 0, 0},
                           {"fc.weight", {F, H}, 0, 0},
                           {"fc.bias", {F}, 0, 0},
                           {"head.weight", {V, F}, 0, 0},
                           {"head.bias", {V}, 0, 0}};
  for (P &p : params) {
    p.value = s.add({p.name, ValueKind::Param, f, p.shape});
    p.grad = s.add(
        {std::string(p.name) + ".grad", ValueKind::Grad, f, p.shape, p.value});
  }
  int x = temp("x", {B, T, H}), h = temp("h", {B, T, F}),
      a = temp("a", {B, T, F}), logits = temp("logits", {B, T, V});
  int loss = s.add({"loss", ValueKind::Loss, f, {}});
  int dloss = temp("dloss", {}), dlogits = temp("dlogits", {B, T, V}),
      dlogits2 = temp("dlogits2", {B * T, V}), a2 = temp("a2", {B * T, F}),
      dWh = temp("dWhead", {V, F}), dbh = temp("dbhead", {V}),
      da = temp("da", {B, T, F}), dh = temp("dh", {B, T, F}),
      dh2 = temp("dh2", {B * T, F}), x2 = temp("x2", {B * T, H}),
      dWf = temp("dWfc", {F, H}), dbf = temp("dbfc", {F}),
      dx = temp("dx", {B, T, H}), dwte = temp("dwte", {V, H});
  s.tokens = tok;
  s.targets = tgt;
  s.loss = loss;

  auto ins = [](std::string k, std::vector<int> in, std::vector<int> out,
                Attrs at = {}) {
    return TInstr{std::move(k), in, out, at};
  };
  Attrs none;
  Attrs tanh;
  tanh.setStr("approximate", "tanh");
  Attrs ta;
  ta.setInt("transpose_a", 1);
  Attrs dims01;
  dims01.setInts("dims", {0, 1});
  Attrs fill;
  fill.setFloat("value", 1.0 / o.microbatches);
  if (!o.lossScale.empty())
    fill.setStr("loss_scale", o.lossScale);
  Attrs vocab;
  vocab.setInt("vocab", V);

  TBlock fwd{BlockKind::Forward, {}};
  fwd.instrs = {ins("embedding", {params[0].value, tok}, {x}),
                ins("linear", {x, params[1].value, params[2].value}, {h}),
                ins("gelu", {h}, {a}, tanh),
                ins("linear", {a, params[3].value, params[4].value}, {logits}),
                ins("cross_entropy", {logits, tgt}, {loss})};
  TBlock bwd{BlockKind::Backward, {}};
  bwd.instrs = {ins("fill", {}, {dloss}, fill),
                ins("cross_entropy_grad", {dloss, logits, tgt}, {dlogits}),
                ins("reshape", {dlogits}, {dlogits2}),
                ins("reshape", {a}, {a2}),
                ins("matmul", {dlogits2, a2}, {dWh}, ta),
                ins("reduce_sum", {dlogits}, {dbh}, dims01),
                ins("matmul", {dlogits, params[3].value}, {da}),
                ins("gelu_grad", {da, h}, {dh}, tanh),
                ins("reshape", {dh}, {dh2}),
                ins("reshape", {x}, {x2}),
                ins("matmul", {dh2, x2}, {dWf}, ta),
                ins("reduce_sum", {dh}, {dbf}, dims01),
                ins("matmul", {dh, params[1].value}, {dx}),
                ins("embedding_grad", {dx, tok}, {dwte}, vocab),
                ins("grad_accumulate", {dwte}, {params[0].grad}),
                ins("grad_accumulate", {dWf}, {params[1].grad}),
                ins("grad_accumulate", {dbf}, {params[2].grad}),
                ins("grad_accumulate", {dWh}, {params[3].grad}),
                ins("grad_accumulate", {dbh}, {params[4].grad})};
  TBlock opt{BlockKind::Optimizer, {}};
  for (P &p : params) {
    Attrs at;
    at.setFloat("lr", o.lr);
    setLossScaleAttrs(o, at);
    at.setStr("schedule", o.schedule);
    if (o.schedule == "cosine") {
      at.setInt("warmup", 2);
      at.setInt("total_steps", 8);
      at.setFloat("min_lr", o.lr * 0.1);
    }
    if (o.optimizer == "adamw") {
      at.setFloat("beta1", 0.9);
      at.setFloat("beta2", 0.95);
      at.setFloat("eps", 1e-8);
      at.setFloat("weight_decay", 0.1);
      int m = s.add({std::string(p.name) + ".exp_avg", ValueKind::OptState, f,
                     p.shape, p.value});
      int v = s.add({std::string(p.name) + ".exp_avg_sq", ValueKind::OptState,
                     f, p.shape, p.value});
      opt.instrs.push_back(ins("adamw", {p.value, p.grad, m, v}, {}, at));
    } else {
      at.setFloat("momentum", 0.9);
      int m = s.add({std::string(p.name) + ".momentum_buffer",
                     ValueKind::OptState, f, p.shape, p.value});
      opt.instrs.push_back(ins("sgd", {p.value, p.grad, m}, {}, at));
    }
  }
  s.blocks = {fwd, bwd, opt};
  for (int mb = 0; mb < o.microbatches; ++mb) {
    s.tasks.push_back({0, mb});
    s.tasks.push_back({1, mb});
  }
  s.tasks.push_back({2, 0});
  (void)none;
  return s;
}

namespace {

/// One rank's program of the parallel MLP.
class ParallelMlp {
public:
  ParallelMlp(const MlpOptions &o, const ParallelOptions &po, int rank)
      : o(o), po(po), rank(rank) {
    tpi = rank % po.tp;
    dpi = (rank / po.tp) % po.dp;
    ppi = rank / (po.tp * po.dp);
    B = o.batch;
    T = o.seq;
    V = o.vocab;
    H = o.hidden;
    F = o.ffn;
    Ft = F / po.tp;
    M = o.microbatches;
    numV = po.pp * po.chunks;
  }

  PlanSpec build() {
    s.microBatchSize = B;
    s.seqLength = T;
    s.vocabSize = V;
    s.numMicrobatches = M;
    s.optimizer = o.optimizer;
    s.maxGradNorm = o.maxGradNorm;
    s.slots = M;
    s.rank = rank;
    s.tp = tpi;
    s.dp = dpi;
    s.pp = ppi;
    std::vector<int> fwdBlock(po.chunks, -1), bwdBlock(po.chunks, -1);
    for (int c = 0; c < po.chunks; ++c) {
      int v = c * po.pp + ppi;
      std::vector<int> pieces;
      for (int p = 0; p < 4; ++p)
        if (virtualOf(p) == v)
          pieces.push_back(p);
      TBlock f{BlockKind::Forward, {}, c}, b{BlockKind::Backward, {}, c};
      for (int p : pieces)
        forward(p, f.instrs);
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it)
        backward(*it, b.instrs);
      fwdBlock[c] = add(f);
      bwdBlock[c] = add(b);
    }
    int sync = -1;
    if (po.dp > 1) {
      TBlock sb{BlockKind::Backward, {}, 0};
      Attrs at;
      at.setStr("group", "dp");
      at.setStr("reduction", "avg");
      for (auto &[name, pr] : params)
        sb.instrs.push_back({"all_reduce", {pr.grad}, {pr.grad}, at});
      sync = add(sb);
    }
    int opt = add(optimizer());
    // Schedule.
    auto F_ = [&](int c, int m) { s.tasks.push_back({fwdBlock[c], m}); };
    auto B_ = [&](int c, int m) { s.tasks.push_back({bwdBlock[c], m}); };
    s.chunksHint = po.chunks;
    s.stashBytes = po.stashBytes;
    if (!po.dpp.empty()) {
      std::vector<std::pair<int, int>> order[2];
      for (const ChunkTask &t :
           interleavedOrder(po.pp, ppi, po.chunks, M, po.pp))
        order[0].push_back({(t.backward ? bwdBlock : fwdBlock)[t.chunk], t.mb});
      for (int c = 0; c < po.chunks; ++c)
        for (int m = 0; m < M; ++m)
          order[1].push_back({fwdBlock[c], m});
      for (int c = po.chunks - 1; c >= 0; --c)
        for (int m = 0; m < M; ++m)
          order[1].push_back({bwdBlock[c], m});
      for (auto &o : order) {
        if (sync >= 0)
          o.push_back({sync, M - 1});
        o.push_back({opt, 0});
      }
      s.tasks = order[po.dpp == "bfc" ? 1 : 0];
      if (po.dpp == "adaptive")
        s.scheduleTables = {{"dfc", order[0]}, {"bfc", order[1]}};
      return s;
    }
    if (po.pp == 1 && po.chunks == 1) {
      for (int m = 0; m < M; ++m)
        F_(0, m), B_(0, m);
    } else if (po.chunks == 1) {
      int warm = std::min(M, po.pp - ppi - 1), f = 0, b = 0;
      for (; f < warm; ++f)
        F_(0, f);
      for (; f < M; ++f, ++b)
        F_(0, f), B_(0, b);
      for (; b < M; ++b)
        B_(0, b);
    } else {
      for (int c = 0; c < po.chunks; ++c)
        for (int m = 0; m < M; ++m)
          F_(c, m);
      for (int c = po.chunks - 1; c >= 0; --c)
        for (int m = 0; m < M; ++m)
          B_(c, m);
    }
    if (sync >= 0)
      s.tasks.push_back({sync, M - 1});
    s.tasks.push_back({opt, 0});
    return s;
  }

private:
  struct Par {
    int value, grad;
    Shape shape;
  };

  int virtualOf(int piece) const {
    return numV == 1 ? 0 : numV == 2 ? piece / 2 : piece;
  }
  int stageOf(int v) const { return v % po.pp; }
  int rankAt(int stage) const { return tpi + po.tp * (dpi + po.dp * stage); }

  int add(TBlock b) {
    if (po.traceInstrs) {
      std::vector<TInstr> wrapped;
      for (TInstr &in : b.instrs) {
        Attrs ba, ea;
        ba.setInt("id", nextTraceId);
        int operand = in.out.empty() ? in.in[0] : in.out[0];
        ba.setStr("name", in.kernel + "." + s.values[operand].name);
        bool comm = in.kernel == "send" || in.kernel == "recv" ||
                    in.kernel == "all_reduce";
        ba.setStr("category", comm ? "comm"
                              : b.kind == BlockKind::Optimizer ? "optimizer"
                                                               : "compute");
        ea.setInt("id", nextTraceId++);
        wrapped.push_back({"trace_begin", {}, {}, ba});
        wrapped.push_back(in);
        wrapped.push_back({"trace_end", {}, {}, ea});
      }
      b.instrs = std::move(wrapped);
    }
    s.blocks.push_back(std::move(b));
    return static_cast<int>(s.blocks.size()) - 1;
  }

  int temp(const std::string &n, Shape sh) {
    auto it = temps.find(n);
    if (it != temps.end())
      return it->second;
    return temps[n] = s.add({n, ValueKind::Temp, DType::F32, sh});
  }
  int tokens() {
    if (s.tokens < 0)
      s.tokens = s.add({"tokens", ValueKind::Input, DType::I32, {B, T}});
    return s.tokens;
  }
  int targets() {
    if (s.targets < 0)
      s.targets = s.add({"targets", ValueKind::Input, DType::I32, {B, T}});
    return s.targets;
  }
  Par &param(const std::string &name, Shape full, int shardDim) {
    auto it = params.find(name);
    if (it != params.end())
      return it->second;
    Shape sh = full;
    if (shardDim >= 0 && po.tp > 1)
      sh[shardDim] /= po.tp;
    TValue pv{name, ValueKind::Param, DType::F32, sh};
    if (shardDim >= 0 && po.tp > 1) {
      pv.shardDim = shardDim;
      pv.shardGroup = "tp";
    }
    int v = s.add(pv);
    int g = s.add({name + ".grad", ValueKind::Grad, DType::F32, sh, v});
    return params[name] = Par{v, g, sh};
  }

  TInstr ins(std::string k, std::vector<int> in, std::vector<int> out,
             Attrs at = {}) {
    return TInstr{std::move(k), std::move(in), std::move(out), std::move(at)};
  }
  Attrs tpSum() {
    Attrs a;
    a.setStr("group", "tp");
    a.setStr("reduction", "sum");
    return a;
  }
  Attrs p2p(int peerStage, int tag) {
    Attrs a;
    a.setInt("peer", rankAt(peerStage));
    a.setInt("tag", tag);
    return a;
  }
  /// Boundary activation k (after piece k-1): x, a, logits.
  Shape boundaryShape(int k) const {
    return k == 1 ? Shape{B, T, H} : k == 2 ? Shape{B, T, Ft} : Shape{B, T, V};
  }
  const char *boundaryName(int k) const {
    return k == 1 ? "x" : k == 2 ? "a" : "logits";
  }
  const char *boundaryGradName(int k) const {
    return k == 1 ? "dx" : k == 2 ? "da" : "dlogits";
  }

  void forward(int p, std::vector<TInstr> &out) {
    int v = virtualOf(p);
    if (p > 0 && virtualOf(p - 1) != v)
      out.push_back(ins("recv", {},
                        {temp(boundaryName(p), boundaryShape(p))},
                        p2p(stageOf(v - 1), 2 * p)));
    Attrs tanh;
    tanh.setStr("approximate", "tanh");
    switch (p) {
    case 0:
      out.push_back(ins("embedding", {param("wte.weight", {V, H}, -1).value,
                                      tokens()},
                        {temp("x", {B, T, H})}));
      break;
    case 1:
      out.push_back(ins("linear",
                        {temp("x", {B, T, H}),
                         param("fc.weight", {F, H}, 0).value,
                         param("fc.bias", {F}, 0).value},
                        {temp("h", {B, T, Ft})}));
      out.push_back(
          ins("gelu", {temp("h", {B, T, Ft})}, {temp("a", {B, T, Ft})}, tanh));
      break;
    case 2:
      if (po.tp == 1) {
        out.push_back(ins("linear",
                          {temp("a", {B, T, Ft}),
                           param("head.weight", {V, F}, 1).value,
                           param("head.bias", {V}, -1).value},
                          {temp("logits", {B, T, V})}));
      } else {
        int part = temp("logits.partial", {B, T, V});
        out.push_back(ins("linear",
                          {temp("a", {B, T, Ft}),
                           param("head.weight", {V, F}, 1).value},
                          {part}));
        int sum = temp("logits.sum", {B, T, V});
        out.push_back(ins("all_reduce", {part}, {sum}, tpSum()));
        out.push_back(ins("add", {sum, param("head.bias", {V}, -1).value},
                          {temp("logits", {B, T, V})}));
      }
      break;
    case 3:
      s.loss = s.add({"loss", ValueKind::Loss, DType::F32, {}});
      out.push_back(ins("cross_entropy", {temp("logits", {B, T, V}), targets()},
                        {s.loss}));
      break;
    }
    if (p < 3 && virtualOf(p + 1) != v)
      out.push_back(ins("send", {temp(boundaryName(p + 1),
                                      boundaryShape(p + 1))},
                        {}, p2p(stageOf(v + 1), 2 * (p + 1))));
  }

  void backward(int p, std::vector<TInstr> &out) {
    int v = virtualOf(p);
    if (p < 3 && virtualOf(p + 1) != v)
      out.push_back(ins("recv", {},
                        {temp(boundaryGradName(p + 1), boundaryShape(p + 1))},
                        p2p(stageOf(v + 1), 2 * (p + 1) + 1)));
    Attrs tanh;
    tanh.setStr("approximate", "tanh");
    Attrs ta;
    ta.setInt("transpose_a", 1);
    Attrs dims01;
    dims01.setInts("dims", {0, 1});
    switch (p) {
    case 3: {
      Attrs fill;
      fill.setFloat("value", 1.0 / M);
      if (!o.lossScale.empty())
        fill.setStr("loss_scale", o.lossScale);
      int dloss = temp("dloss", {});
      out.push_back(ins("fill", {}, {dloss}, fill));
      out.push_back(ins("cross_entropy_grad",
                        {dloss, temp("logits", {B, T, V}), targets()},
                        {temp("dlogits", {B, T, V})}));
      break;
    }
    case 2: {
      int dl = temp("dlogits", {B, T, V});
      Par &w = param("head.weight", {V, F}, 1);
      Par &bias = param("head.bias", {V}, -1);
      out.push_back(ins("reshape", {dl}, {temp("dlogits2", {B * T, V})}));
      out.push_back(
          ins("reshape", {temp("a", {B, T, Ft})}, {temp("a2", {B * T, Ft})}));
      out.push_back(ins("matmul",
                        {temp("dlogits2", {B * T, V}), temp("a2", {B * T, Ft})},
                        {temp("dWhead", {V, Ft})}, ta));
      out.push_back(ins("reduce_sum", {dl}, {temp("dbhead", {V})}, dims01));
      out.push_back(ins("matmul", {dl, w.value}, {temp("da", {B, T, Ft})}));
      out.push_back(ins("grad_accumulate", {temp("dWhead", {V, Ft})}, {w.grad}));
      out.push_back(ins("grad_accumulate", {temp("dbhead", {V})}, {bias.grad}));
      break;
    }
    case 1: {
      Par &w = param("fc.weight", {F, H}, 0);
      Par &bias = param("fc.bias", {F}, 0);
      Attrs tanh2 = tanh;
      out.push_back(ins("gelu_grad",
                        {temp("da", {B, T, Ft}), temp("h", {B, T, Ft})},
                        {temp("dh", {B, T, Ft})}, tanh2));
      out.push_back(
          ins("reshape", {temp("dh", {B, T, Ft})}, {temp("dh2", {B * T, Ft})}));
      out.push_back(
          ins("reshape", {temp("x", {B, T, H})}, {temp("x2", {B * T, H})}));
      out.push_back(ins("matmul",
                        {temp("dh2", {B * T, Ft}), temp("x2", {B * T, H})},
                        {temp("dWfc", {Ft, H})}, ta));
      out.push_back(ins("reduce_sum", {temp("dh", {B, T, Ft})},
                        {temp("dbfc", {Ft})}, dims01));
      if (po.tp == 1) {
        out.push_back(ins("matmul", {temp("dh", {B, T, Ft}), w.value},
                          {temp("dx", {B, T, H})}));
      } else {
        int part = temp("dx.partial", {B, T, H});
        out.push_back(
            ins("matmul", {temp("dh", {B, T, Ft}), w.value}, {part}));
        out.push_back(
            ins("all_reduce", {part}, {temp("dx", {B, T, H})}, tpSum()));
      }
      out.push_back(ins("grad_accumulate", {temp("dWfc", {Ft, H})}, {w.grad}));
      out.push_back(ins("grad_accumulate", {temp("dbfc", {Ft})}, {bias.grad}));
      break;
    }
    case 0: {
      Par &w = param("wte.weight", {V, H}, -1);
      Attrs vocab;
      vocab.setInt("vocab", V);
      out.push_back(ins("embedding_grad", {temp("dx", {B, T, H}), tokens()},
                        {temp("dwte", {V, H})}, vocab));
      out.push_back(ins("grad_accumulate", {temp("dwte", {V, H})}, {w.grad}));
      break;
    }
    }
    if (p > 0 && virtualOf(p - 1) != v)
      out.push_back(ins("send", {temp(boundaryGradName(p), boundaryShape(p))},
                        {}, p2p(stageOf(v - 1), 2 * p + 1)));
  }

  TBlock optimizer() {
    TBlock opt{BlockKind::Optimizer, {}, 0};
    for (auto &[name, pr] : params) {
      Attrs at;
      at.setFloat("lr", o.lr);
      setLossScaleAttrs(o, at);
      at.setStr("schedule", o.schedule);
      if (o.schedule == "cosine") {
        at.setInt("warmup", 2);
        at.setInt("total_steps", 8);
        at.setFloat("min_lr", o.lr * 0.1);
      }
      if (o.optimizer == "adamw") {
        at.setFloat("beta1", 0.9);
        at.setFloat("beta2", 0.95);
        at.setFloat("eps", 1e-8);
        at.setFloat("weight_decay", 0.1);
        int m = s.add({name + ".exp_avg", ValueKind::OptState, DType::F32,
                       pr.shape, pr.value});
        int v = s.add({name + ".exp_avg_sq", ValueKind::OptState, DType::F32,
                       pr.shape, pr.value});
        opt.instrs.push_back(ins("adamw", {pr.value, pr.grad, m, v}, {}, at));
      } else {
        at.setFloat("momentum", 0.9);
        int m = s.add({name + ".momentum_buffer", ValueKind::OptState,
                       DType::F32, pr.shape, pr.value});
        opt.instrs.push_back(ins("sgd", {pr.value, pr.grad, m}, {}, at));
      }
    }
    return opt;
  }

  const MlpOptions &o;
  const ParallelOptions &po;
  int rank, tpi, dpi, ppi;
  int B, T, V, H, F, Ft, M, numV;
  int nextTraceId = 0;
  PlanSpec s;
  std::map<std::string, int> temps;
  std::map<std::string, Par> params;
};

} // namespace

MultiPlanSpec mapp::rt::test::parallelMlpPlan(const MlpOptions &o,
                                              const ParallelOptions &p) {
  int V = p.pp * p.chunks;
  if (V != 1 && V != 2 && V != 4)
    throw std::invalid_argument("parallelMlpPlan: pp*chunks must be 1, 2 or 4");
  if (p.chunks > 1 && p.pp == 1)
    throw std::invalid_argument("parallelMlpPlan: chunks > 1 needs pp > 1");
  if (o.ffn % p.tp)
    throw std::invalid_argument("parallelMlpPlan: tp must divide ffn");
  MultiPlanSpec m;
  m.tp = p.tp;
  m.pp = p.pp;
  m.dp = p.dp;
  m.chunks = p.chunks;
  m.traceEvery = p.traceEvery;
  m.traceWindow = p.traceWindow;
  m.schedule = p.pp == 1 ? "gpipe" : p.chunks > 1 ? "interleaved" : "1f1b";
  if (!p.dpp.empty()) {
    if (p.dpp != "dfc" && p.dpp != "bfc" && p.dpp != "adaptive")
      throw std::invalid_argument("parallelMlpPlan: dpp must be dfc, bfc or "
                                  "adaptive");
    if (p.chunks > 1 && o.microbatches % p.pp)
      throw std::invalid_argument("parallelMlpPlan: dpp with chunks > 1 "
                                  "needs microbatches % pp == 0");
    m.schedule = p.dpp;
    m.adaptive = p.adaptive;
  }
  for (int r = 0; r < p.tp * p.pp * p.dp; ++r)
    m.programs.push_back(ParallelMlp(o, p, r).build());
  return m;
}

std::vector<mapp::rt::test::ChunkTask>
mapp::rt::test::interleavedOrder(int p, int r, int v, int m, int n) {
  int total = m * v;
  auto at = [&](int k, bool backward) {
    int group = k / (n * v), inGroup = k % (n * v);
    int chunk = inGroup / n;
    if (backward)
      chunk = v - 1 - chunk;
    return ChunkTask{chunk, group * n + inGroup % n, backward};
  };
  int warm = v == 1 ? std::min(total, p - r - 1)
                    : std::min(total, 2 * (p - r - 1) + (v - 1) * n);
  std::vector<ChunkTask> out;
  int f = 0, b = 0;
  for (; f < warm; ++f)
    out.push_back(at(f, false));
  for (; f < total; ++f, ++b) {
    out.push_back(at(f, false));
    out.push_back(at(b, true));
  }
  for (; b < total; ++b)
    out.push_back(at(b, true));
  return out;
}
