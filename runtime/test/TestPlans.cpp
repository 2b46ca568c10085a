//===- TestPlans.cpp ------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/plan_generated.h"

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

std::vector<uint8_t> PlanSpec::build() const {
  flatbuffers::FlatBufferBuilder b;
  uint64_t arena = 0, pool = 0;
  std::vector<flatbuffers::Offset<fb::Value>> vals;
  for (const TValue &v : values) {
    uint64_t bytes = numel(v.shape) * dtypeSize(v.dtype);
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
        v.param));
  }
  std::vector<flatbuffers::Offset<fb::Block>> blks;
  for (const TBlock &blk : blocks) {
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
    blks.push_back(fb::CreateBlock(b, static_cast<fb::BlockKind>(blk.kind), 0,
                                   b.CreateVector(ins)));
  }
  std::vector<fb::Task> ts;
  for (auto [blk, mb] : tasks)
    ts.emplace_back(blk, mb);
  auto prog = fb::CreateProgram(b, 0, 0, 0, 0, b.CreateVector(vals),
                                b.CreateVector(blks),
                                b.CreateVectorOfStructs(ts), arena, pool, slots,
                                tokens, targets, loss, arena * slots + pool);
  std::vector<flatbuffers::Offset<fb::Program>> progs = {prog};
  auto plan = fb::CreatePlan(b, version, 1, 1, 1, 1, 1, microBatchSize,
                             numMicrobatches, seqLength, vocabSize,
                             b.CreateString("gpipe"), b.CreateString(optimizer),
                             maxGradNorm, b.CreateVector(progs));
  fb::FinishPlanBuffer(b, plan);
  return std::vector<uint8_t>(b.GetBufferPointer(),
                              b.GetBufferPointer() + b.GetSize());
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
