//===- KvDecoder.cpp - prefill/decode program from the plan's forward -----===//
#include "mapp/rt/KvDecoder.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Generate.h"
#include "mapp/rt/Kernels.h"

#include <map>
#include <set>

using namespace mapp::rt;

namespace {

/// Kernels that treat every token on its own: retyping [B,T,…] to [1,S,…]
/// computes the same rows. `slice` qualifies only off the batch/token dims.
const std::set<std::string> kPerToken = {
    "embedding", "linear", "add",    "mul",     "scale",   "gelu",
    "silu",      "layer_norm", "rms_norm", "dropout", "perturb", "slice",
    "softcap"};

Value makeValue(std::string name, ValueKind kind, TensorType type) {
  Value v;
  v.name = std::move(name);
  v.kind = kind;
  v.type = std::move(type);
  return v;
}

std::string where(const Instr &in) {
  return "'" + (in.name.empty() ? in.kernel : in.name) + "' (" + in.kernel +
         ")";
}

class Deriver {
public:
  Deriver(const Plan &plan, const Program &src, KvDecodePlan &out)
      : plan(plan), src(src), out(out), dst(out.plan.programs.emplace_back()),
        B(plan.microBatchSize), T(plan.seqLength) {}

  void run(int logits) {
    for (const Block &b : src.blocks)
      if (b.kind == BlockKind::Forward)
        for (size_t i = 0; i < b.instrs.size(); ++i)
          forward.push_back(&b.instrs[i]);
    addParams();
    addCaches();
    deriveBlock(T, out.prefill, logits);
    deriveBlock(1, out.decode, logits);
    dst.arenaBytes = arena;
    dst.persistentBytes = pool;
    dst.peakBytes = arena;
  }

private:
  int addValue(Value v) {
    uint64_t &top = inArena(v.kind) ? arena : pool;
    top = (top + 63) / 64 * 64;
    v.offset = top;
    v.storedBf16 = false;
    v.bytes = static_cast<uint64_t>(v.type.numel()) * dtypeSize(v.type.dtype);
    top += v.bytes;
    dst.values.push_back(std::move(v));
    return static_cast<int>(dst.values.size() - 1);
  }

  void addParams() {
    for (size_t v = 0; v < src.values.size(); ++v)
      if (src.values[v].kind == ValueKind::Param) {
        Value p = src.values[v];
        p.shardDim = -1;
        params[static_cast<int>(v)] = addValue(std::move(p));
      }
  }

  /// One key and one value cache [1,T,H] per attention instr, shared by
  /// both blocks.
  void addCaches() {
    for (const Instr *in : forward) {
      if (in->kernel != "attention")
        continue;
      if (!in->attrs.flag("causal"))
        fail("generation with a KV cache: ", where(*in),
             " is not causal; a cache needs causal attention (use "
             "--no-kv-cache)");
      const Value &k = src.values[in->inputs[1]];
      TensorType t{DType::F32, {1, T, k.type.dim(-1)}};
      int kc = addValue(makeValue(in->name + ".k_cache", ValueKind::Temp, t));
      int vc = addValue(makeValue(in->name + ".v_cache", ValueKind::Temp, t));
      caches[in] = {kc, vc};
      out.caches += 2;
    }
  }

  /// The derived id of source value `v` in the block being built; -1 when
  /// the block does not compute it (targets, the loss).
  int lookup(int v) {
    if (auto it = params.find(v); it != params.end())
      return it->second;
    if (auto it = ids.find(v); it != ids.end())
      return it->second;
    return -1;
  }

  int retype(int v, int S) {
    const Value &sv = src.values[v];
    const Shape &s = sv.type.shape;
    if (s.size() < 2 || s[0] != B || s[1] != T)
      fail("generation with a KV cache: value '", sv.name, "' ",
           shapeStr(s), " is not per token ([", B, ",", T,
           ",…]); use --no-kv-cache");
    Value d;
    d.name = sv.name;
    d.kind = ValueKind::Temp;
    d.type = sv.type;
    d.type.shape[0] = 1;
    d.type.shape[1] = S;
    int id = addValue(std::move(d));
    ids[v] = id;
    return id;
  }

  void emit(Block &blk, Instr in) {
    const KernelSpec *spec = findKernelSpec(in.kernel);
    std::vector<TensorType> ti, to;
    for (int v : in.inputs)
      ti.push_back(dst.values[v].type);
    for (int v : in.outputs)
      to.push_back(dst.values[v].type);
    try {
      checkKernelCall(*spec, in.attrs, ti, to);
    } catch (const Error &e) {
      fail("generation with a KV cache: derived ", where(in), ": ", e.what());
    }
    blk.instrs.push_back(std::move(in));
  }

  /// A [T,…] parameter broadcast over the batch (learned positions) becomes
  /// a lookup at the block's positions.
  int positional(Block &blk, const Instr &in, int v, int S, int positions) {
    const Value &pv = src.values[v];
    if (pv.kind != ValueKind::Param || pv.type.rank() != 2 ||
        pv.type.dim(0) != T)
      return lookup(v);
    const Value &o = src.values[in.outputs[0]];
    if (o.type.rank() != 3 || o.type.dim(1) != T)
      return lookup(v);
    Instr e;
    e.kernel = "embedding";
    e.name = pv.name + "@positions";
    e.layer = in.layer;
    e.inputs = {lookup(v), positions};
    Value r;
    r.name = e.name;
    r.type = {DType::F32, {1, S, pv.type.dim(1)}};
    e.outputs = {addValue(std::move(r))};
    int id = e.outputs[0];
    emit(blk, std::move(e));
    return id;
  }

  void deriveBlock(int S, KvDecodePlan::Io &io, int logits) {
    ids.clear();
    emittedAttention.clear();
    Block &blk = dst.blocks.emplace_back();
    blk.kind = BlockKind::Forward;
    TensorType ids1S{DType::I32, {1, S}};
    io.tokens = addValue(makeValue("tokens", ValueKind::Input, ids1S));
    io.positions = addValue(makeValue("positions", ValueKind::Input, ids1S));
    if (src.tokens >= 0)
      ids[src.tokens] = io.tokens;
    // Attention probes read the cache, so they wait for their attention.
    std::map<const Instr *, std::vector<Instr>> pending;
    for (const Instr *in : forward) {
      if (isExecutorKernel(in->kernel))
        continue;
      std::vector<int> inputs;
      bool available = true;
      for (int v : in->inputs) {
        int d = lookup(v);
        available &= d >= 0;
        inputs.push_back(d);
      }
      // Whatever needs the targets (the loss) is not part of generation.
      if (!available)
        continue;
      Instr d;
      d.kernel = in->kernel;
      d.name = in->name;
      d.layer = in->layer;
      d.attrs = in->attrs;
      d.inputs = inputs;
      if (in->kernel == "probe") {
        deriveProbe(blk, *in, d, S, io.positions, pending);
        continue;
      }
      if (in->kernel == "attention") {
        auto [kc, vc] = caches.at(in);
        d.kernel = "cached_attention";
        d.inputs.insert(d.inputs.end(), {io.positions, kc, vc});
      } else if (!kPerToken.count(in->kernel) ||
                 (in->kernel == "slice" && sliceMixes(*in))) {
        fail("generation with a KV cache: ", where(*in),
             " is not per token, so the forward cannot be decoded one token "
             "at a time; use --no-kv-cache");
      } else if (in->kernel == "add" || in->kernel == "mul") {
        for (size_t i = 0; i < in->inputs.size(); ++i)
          d.inputs[i] = positional(blk, *in, in->inputs[i], S, io.positions);
      }
      for (int v : in->outputs)
        d.outputs.push_back(retype(v, S));
      emit(blk, std::move(d));
      if (in->kernel == "attention")
        emittedAttention.insert(in);
      if (auto it = pending.find(in); it != pending.end()) {
        for (Instr &p : it->second)
          emit(blk, std::move(p));
        pending.erase(it);
      }
    }
    io.logits = lookup(logits);
    if (io.logits < 0)
      fail("generation with a KV cache: the logits '",
           src.values[logits].name, "' are not computed from the tokens");
  }

  bool sliceMixes(const Instr &in) {
    int rank = src.values[in.inputs[0]].type.rank();
    int64_t dim = in.attrs.getInt("dim", 0);
    if (dim < 0)
      dim += rank;
    return dim < 2;
  }

  /// Value probes see the block's rows (decode: the new token; a `tokens`
  /// selection is dropped there). Attention probes read the key cache at the
  /// block's positions: prefill the [T,T] map, decode the new row.
  void deriveProbe(Block &blk, const Instr &in, Instr &d, int S, int positions,
                   std::map<const Instr *, std::vector<Instr>> &pending) {
    if (in.attrs.getStr("reduce", "") == "attn") {
      const Instr *att = nullptr;
      for (const Instr *a : forward)
        if (a->kernel == "attention" && a->inputs[0] == in.inputs[0] &&
            a->inputs[1] == in.inputs[1])
          att = a;
      if (!att)
        fail("generation with a KV cache: attention probe ", where(in),
             " does not observe an attention's q and k");
      d.inputs = {d.inputs[0], caches.at(att).first, positions};
      d.attrs.setInt("kv_cache", 1);
      if (!emittedAttention.count(att)) {
        pending[att].push_back(std::move(d));
        return;
      }
    } else if (S != T && in.attrs.has("tokens")) {
      Attrs kept;
      for (const auto &[k, v] : in.attrs.all())
        if (k != "tokens")
          kept.set(k, v);
      d.attrs = kept;
    }
    emit(blk, std::move(d));
  }

  const Plan &plan;
  const Program &src;
  KvDecodePlan &out;
  Program &dst;
  int B, T;
  std::vector<const Instr *> forward;
  std::map<int, int> params, ids;
  std::map<const Instr *, std::pair<int, int>> caches;
  std::set<const Instr *> emittedAttention; // in the block being built
  uint64_t arena = 0, pool = 0;
};

} // namespace

KvDecodePlan mapp::rt::deriveKvDecodePlan(const Plan &plan, const Program &p,
                                          int logits) {
  if (plan.worldSize != 1)
    fail("generation with a KV cache runs single-rank plans (this one has "
         "world_size ",
         plan.worldSize, ")");
  KvDecodePlan out;
  Plan &d = out.plan;
  d.version = plan.version;
  d.microBatchSize = 1;
  d.seqLength = plan.seqLength;
  d.vocabSize = plan.vocabSize;
  d.schedule = "generate";
  d.traceEvery = plan.traceEvery;
  d.traceWindow = plan.traceWindow;
  Deriver(plan, p, out).run(logits);
  return out;
}

KvDecoder::KvDecoder(Executor &full)
    : full_(full),
      derived_(deriveKvDecodePlan(
          full.plan(), full.program(),
          logitsValueIndex(full.program(), full.plan().vocabSize))) {
  exec_ = std::make_unique<Executor>(derived_.plan, full.backend(),
                                     full.comm());
  exec_->setProbeRuntime(full.probeRuntime());
  exec_->loadParams(full.saveParams(), "the generating plan's parameters");
}

std::vector<float> KvDecoder::run(int block, const KvDecodePlan::Io &io,
                                  const std::vector<int32_t> &tokens,
                                  const std::vector<int32_t> &positions,
                                  int64_t row, int64_t step) {
  Backend &be = full_.backend();
  be.copyToStorage(exec_->valueData(io.tokens), tokens.data(),
                   tokens.size() * sizeof(int32_t));
  be.copyToStorage(exec_->valueData(io.positions), positions.data(),
                   positions.size() * sizeof(int32_t));
  exec_->runBlockOnce(block, step);
  int64_t V = derived_.plan.vocabSize;
  return exec_->readFloats(io.logits, 0, row * V, V);
}

std::vector<float> KvDecoder::prefill(const std::vector<int32_t> &tokens,
                                      int64_t step) {
  int64_t T = maxPositions(), n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n > T)
    fail("generation: prefill of ", n, " tokens, the plan has ", T,
         " positions");
  // Padding rows fill cache rows n..T−1 with keys that decode overwrites
  // before any query can see them.
  std::vector<int32_t> padded(tokens), positions(T);
  padded.resize(T, 0);
  for (int64_t t = 0; t < T; ++t)
    positions[t] = static_cast<int32_t>(t);
  filled_ = n;
  return run(0, derived_.prefill, padded, positions, n - 1, step);
}

std::vector<float> KvDecoder::decode(int32_t token, int64_t position,
                                     int64_t step) {
  if (position != filled_ || position >= maxPositions())
    fail("generation: decode at position ", position, " but the cache holds ",
         filled_, " of ", maxPositions(), " positions");
  filled_ = position + 1;
  return run(1, derived_.decode, {token},
             {static_cast<int32_t>(position)}, 0, step);
}
