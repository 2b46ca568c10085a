// --mapp-tensor-parallel: Megatron tensor (and sequence) parallelism on the
// forward graph, before autodiff.
//
// The pass recognizes the transformer's structure in the IR rather than by
// parameter names:
//   * attention: `mapp.attention` whose q, k, v are last-dim slices of one
//     linear (fused qkv) or three linears; the linear consuming its output
//     is the attention projection;
//   * MLP: a linear whose input is an elementwise chain (gelu, silu, mul,
//     dropout) of linears sharing one input (fc1 → gelu → fc2, or
//     silu(gate) · up → down);
//   * LM head: a linear whose logits feed `mapp.cross_entropy`;
//   * embedding: `mapp.embedding` of a parameter table.
// Column-parallel linears shard the weight's rows (`shard_dim = 0`), the
// row-parallel ones its columns (`shard_dim = 1`) and all-reduce the partial
// outputs. Megatron's conjugate operators make autodiff produce the right
// backward collectives: `mapp.copy_to_group` (f) before a column-parallel
// region, all_reduce (g, identity gradient) after a row-parallel one.
// Everything the pass does not recognize stays replicated.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPTENSORPARALLEL
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

RankedTensorType tensorTy(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// `t` with `dim` divided by `parts`.
RankedTensorType shrink(RankedTensorType t, int64_t dim, int64_t parts) {
  SmallVector<int64_t> shape(t.getShape());
  if (dim < 0)
    dim += shape.size();
  shape[dim] /= parts;
  return RankedTensorType::get(shape, t.getElementType());
}

void setResultType(Value v, RankedTensorType t) { v.setType(t); }

/// How one parameter is sharded: along `dim`, in `blocks` separately
/// sharded blocks (3 for a fused qkv).
struct ShardSpec {
  int64_t dim;
  int64_t blocks;
  Operation *user; // the op that asked for this spec, for diagnostics
};

struct TensorParallelPass
    : mapp::impl::MappTensorParallelBase<TensorParallelPass> {
  using Base::Base;

  ModuleOp module;
  llvm::MapVector<StringAttr, ShardSpec> specs;
  /// Ops that consume a sharded parameter in the way the pass rewrote them.
  llvm::DenseSet<Operation *> shardedUsers;
  /// One copy_to_group per replicated value entering column-parallel linears.
  llvm::DenseMap<Value, Value> copies;
  /// The all_reduces after row-parallel linears and embeddings: where the
  /// sequence-parallel region starts when that option is on.
  SmallVector<AllReduceOp> reductions;

  InFlightDiagnostic fail(Operation *op, const Twine &msg) {
    return op->emitError("mapp-tensor-parallel: ") << msg;
  }

  /// "tp=3 does not divide num_attention_heads=4".
  LogicalResult divides(Operation *op, int64_t n, StringRef what) {
    if (n % tp == 0)
      return success();
    fail(op, "tp=") << tp.getValue() << " does not divide " << what << "="
                    << n;
    return failure();
  }

  ParamRefOp paramOf(Value v) { return v.getDefiningOp<ParamRefOp>(); }

  LogicalResult require(Value paramValue, int64_t dim, int64_t blocks,
                        Operation *user) {
    ParamRefOp ref = paramOf(paramValue);
    if (!ref)
      return fail(user, "expected a parameter operand to shard");
    StringAttr name = ref.getParamAttr().getAttr();
    auto [it, inserted] = specs.try_emplace(name, ShardSpec{dim, blocks, user});
    if (!inserted && (it->second.dim != dim || it->second.blocks != blocks)) {
      auto d = fail(user, "parameter @")
               << name.getValue() << " would be sharded along dim " << dim
               << " here but along dim " << it->second.dim << " elsewhere";
      d.attachNote(it->second.user->getLoc()) << "first sharded here";
      return failure();
    }
    shardedUsers.insert(user);
    return success();
  }

  /// The value `x` wrapped in copy_to_group (Megatron's f), made once.
  Value copyOf(Value x) {
    auto [it, inserted] = copies.try_emplace(x, Value());
    if (!inserted)
      return it->second;
    OpBuilder b(x.getContext());
    b.setInsertionPointAfterValue(x);
    it->second = b.create<CopyToGroupOp>(x.getLoc(), x.getType(), x,
                                         b.getStringAttr("tp"));
    return it->second;
  }

  /// Shards a linear's output features: weight and bias rows.
  LogicalResult columnParallel(LinearOp lin, int64_t blocks) {
    if (failed(require(lin.getW(), 0, blocks, lin)) ||
        (lin.getBias() && failed(require(lin.getBias(), 0, blocks, lin))))
      return failure();
    lin.getXMutable().assign(copyOf(lin.getX()));
    setResultType(lin.getResult(), shrink(tensorTy(lin.getResult()), -1, tp));
    return success();
  }

  /// A key/value linear when tp is a multiple of its `kvHeads` heads: the
  /// parameters stay whole on every rank (they are small: that is what
  /// grouped-query attention is for); each rank's weight and bias are the
  /// rows of head r / (tp/kvHeads), the head its query heads read. Built from
  /// existing ops so autodiff gives the gradient: the head rows repeated
  /// tp/kvHeads times (reshape, concat, reshape to [tp·D, ...]) and cut with
  /// scatter_to_group, whose gradient all-gathers every rank's partial
  /// gradient; the concat's gradient sums the replicas of each head, so every
  /// rank gets the full, identical gradient of the whole parameter. The input
  /// enters through copy_to_group as for a column-parallel linear.
  LogicalResult replicateKV(LinearOp lin, int64_t kvHeads) {
    int64_t replicas = tp / kvHeads;
    OpBuilder b(lin);
    Location loc = lin.getLoc();
    auto perRank = [&](Value param) -> Value {
      RankedTensorType full = tensorTy(param);
      Type elem = full.getElementType();
      SmallVector<int64_t> rest(full.getShape().drop_front());
      int64_t rows = full.getShape()[0] / kvHeads, restSize = 1;
      for (int64_t d : rest)
        restSize *= d;
      auto one = b.create<ReshapeOp>(
          loc, RankedTensorType::get({kvHeads, 1, rows * restSize}, elem),
          param);
      SmallVector<Value> copies(replicas, one);
      auto repeated = b.create<ConcatOp>(
          loc, RankedTensorType::get({kvHeads, replicas, rows * restSize}, elem),
          copies, b.getI64IntegerAttr(1));
      SmallVector<int64_t> tiled{tp * rows}, mine{rows};
      tiled.append(rest);
      mine.append(rest);
      auto flat = b.create<ReshapeOp>(loc, RankedTensorType::get(tiled, elem),
                                      repeated);
      return b.create<ScatterToGroupOp>(loc, RankedTensorType::get(mine, elem),
                                        flat, b.getStringAttr("tp"),
                                        b.getI64IntegerAttr(0));
    };
    lin.getWMutable().assign(perRank(lin.getW()));
    if (Value bias = lin.getBias()) {
      if (!paramOf(bias))
        return fail(lin, "expected a parameter bias on the key/value linear");
      lin.getBiasMutable().assign(perRank(bias));
    }
    lin.getXMutable().assign(copyOf(lin.getX()));
    setResultType(lin.getResult(),
                  shrink(tensorTy(lin.getResult()), -1, kvHeads));
    return success();
  }

  /// Shards a linear's input features; the partial outputs are all-reduced
  /// and the bias is added once, after the reduction.
  LogicalResult rowParallel(LinearOp lin) {
    if (failed(require(lin.getW(), 1, 1, lin)))
      return failure();
    OpBuilder b(lin);
    Location loc = lin.getLoc();
    auto partial = b.create<LinearOp>(loc, lin.getType(), lin.getX(),
                                      lin.getW(), Value());
    partial->setAttrs(lin->getAttrs());
    shardedUsers.insert(partial);
    auto sum = b.create<AllReduceOp>(loc, lin.getType(), partial,
                                     b.getStringAttr("tp"),
                                     DenseI64ArrayAttr(),
                                     b.getStringAttr("sum"));
    reductions.push_back(sum);
    Value out = sum;
    if (Value bias = lin.getBias())
      out = b.create<AddOp>(loc, lin.getType(), out, bias);
    // The name (what probes and traces address) moves to the full output.
    if (auto name = lin->getAttr("mapp.name")) {
      partial->removeAttr("mapp.name");
      out.getDefiningOp()->setAttr("mapp.name", name);
    }
    lin.replaceAllUsesWith(out);
    lin.erase();
    return success();
  }

  LogicalResult shardAttention(AttentionOp attn) {
    int64_t heads = attn.getHeadsAttr().getInt();
    int64_t hidden = tensorTy(attn.getQ()).getShape().back();
    if (failed(divides(attn, heads, "num_attention_heads")) ||
        failed(divides(attn, hidden, "hidden_size")))
      return failure();

    // The projection consuming the heads is row-parallel.
    if (!attn->hasOneUse())
      return fail(attn, "attention output must feed exactly one linear "
                        "(the output projection)");
    auto proj = dyn_cast<LinearOp>(*attn->getUsers().begin());
    if (!proj || proj.getX() != attn.getResult() || !paramOf(proj.getW()))
      return fail(attn, "attention output must feed the x operand of a "
                        "linear with a parameter weight");

    // Grouped-query attention: each rank holds kv_heads/tp whole key/value
    // heads (Megatron's query groups) when tp divides them; when tp is a
    // multiple of them, each rank holds the one key/value head its query
    // heads read (replicateKV). A key/value head split across ranks would be
    // wrong, so any other combination is refused.
    int64_t kvHidden = tensorTy(attn.getK()).getShape().back();
    int64_t kvHeads = kvHidden / (hidden / heads);
    bool replicate = kvHeads != heads && kvHeads % tp != 0;
    if (replicate && tp % kvHeads != 0)
      return fail(attn, "tp=" + std::to_string(tp) + " and the " +
                            std::to_string(kvHeads) +
                            " key/value heads (num_query_groups): tp must "
                            "divide them (each rank holds kv_heads/tp) or be "
                            "a multiple of them (each key/value head "
                            "replicated on tp/kv_heads ranks)");

    // q, k, v: slices of one fused linear, or three linears.
    auto sq = attn.getQ().getDefiningOp<SliceOp>();
    auto sk = attn.getK().getDefiningOp<SliceOp>();
    auto sv = attn.getV().getDefiningOp<SliceOp>();
    if (sq && sk && sv && sq.getX() == sk.getX() && sk.getX() == sv.getX()) {
      auto qkv = sq.getX().getDefiningOp<LinearOp>();
      int64_t last = tensorTy(sq.getX()).getRank() - 1;
      bool blocks = qkv && paramOf(qkv.getW()) &&
                    tensorTy(qkv.getResult()).getShape().back() == 3 * hidden;
      for (auto [i, s] : llvm::enumerate(SmallVector<SliceOp>{sq, sk, sv}))
        blocks &= s.getDimAttr().getInt() == last &&
                  s.getStartAttr().getInt() == (int64_t)i * hidden &&
                  s.getEndAttr().getInt() == (int64_t)(i + 1) * hidden;
      if (!blocks)
        return fail(attn, "q, k, v must be the three [H]-blocks (in order) "
                          "of one fused qkv linear with a parameter weight");
      for (Operation *user : qkv->getUsers())
        if (!isa<SliceOp>(user))
          return fail(user, "the fused qkv output may only be sliced");
      // Each rank holds heads/tp heads of each of q, k and v (shard_blocks
      // = 3), so its local output is again [q_r | k_r | v_r].
      if (failed(columnParallel(qkv, /*blocks=*/3)))
        return failure();
      int64_t local = hidden / tp;
      for (auto [i, s] : llvm::enumerate(SmallVector<SliceOp>{sq, sk, sv})) {
        s.setStartAttr(IntegerAttr::get(s.getStartAttr().getType(), i * local));
        s.setEndAttr(
            IntegerAttr::get(s.getEndAttr().getType(), (i + 1) * local));
        setResultType(s.getResult(), shrink(tensorTy(s.getResult()), -1, tp));
      }
    } else {
      for (Value v : {attn.getQ(), attn.getK(), attn.getV()}) {
        auto lin = v.getDefiningOp<LinearOp>();
        if (!lin || !paramOf(lin.getW()) || !lin->hasOneUse())
          return fail(attn, "q, k, v must come from a fused qkv linear "
                            "(sliced) or from one linear each");
      }
      llvm::SmallDenseSet<Operation *> seen;
      for (Value v : {attn.getQ(), attn.getK(), attn.getV()}) {
        auto lin = v.getDefiningOp<LinearOp>();
        if (!seen.insert(lin).second)
          continue;
        if (replicate && v != attn.getQ()) {
          if (failed(replicateKV(lin, kvHeads)))
            return failure();
        } else if (failed(columnParallel(lin, 1))) {
          return failure();
        }
      }
    }
    attn.setHeadsAttr(
        IntegerAttr::get(attn.getHeadsAttr().getType(), heads / tp));
    setResultType(attn.getResult(), shrink(tensorTy(attn.getResult()), -1, tp));
    return rowParallel(proj);
  }

  /// Walks back from `down`'s input through an elementwise chain to the
  /// column-parallel linears of an MLP. Returns false (no MLP) without
  /// diagnostics when the pattern does not match.
  bool matchMLP(LinearOp down, SmallVectorImpl<Operation *> &chain,
                SmallVectorImpl<LinearOp> &ups) {
    if (!paramOf(down.getW()))
      return false;
    SmallVector<Value> work{down.getX()};
    llvm::SmallDenseSet<Operation *> seen;
    while (!work.empty()) {
      Value v = work.pop_back_val();
      Operation *def = v.getDefiningOp();
      if (!def || !v.hasOneUse() || !seen.insert(def).second)
        return false;
      if (auto lin = dyn_cast<LinearOp>(def)) {
        if (!paramOf(lin.getW()))
          return false;
        ups.push_back(lin);
        continue;
      }
      if (!isa<GeluOp, SiluOp, MulOp, DropoutOp>(def))
        return false;
      chain.push_back(def);
      for (Value operand : def->getOperands()) {
        if (operand.getType() != v.getType())
          return false; // a broadcast operand cannot be sharded along N
        work.push_back(operand);
      }
    }
    if (ups.empty() || down.getX().getDefiningOp() == nullptr)
      return false;
    // Only the chain from linears: `down` directly after a linear is not an
    // MLP of this shape (it would be two stacked linears).
    if (chain.empty())
      return false;
    Value input = ups.front().getX();
    return llvm::all_of(ups, [&](LinearOp l) { return l.getX() == input; });
  }

  LogicalResult shardMLP(LinearOp down, ArrayRef<Operation *> chain,
                         ArrayRef<LinearOp> ups) {
    int64_t ffn = tensorTy(down.getX()).getShape().back();
    if (failed(divides(down, ffn, "ffn_hidden_size")))
      return failure();
    for (LinearOp up : ups)
      if (failed(columnParallel(up, 1)))
        return failure();
    for (Operation *op : chain)
      setResultType(op->getResult(0),
                    shrink(tensorTy(op->getResult(0)), -1, tp));
    return rowParallel(down);
  }

  /// LM head + cross-entropy → vocab-parallel logits and loss.
  LogicalResult shardHead(CrossEntropyOp ce) {
    // Gemma 2 caps the logits (softcap, elementwise: it runs on each rank's
    // vocabulary slice as well).
    auto cap = ce.getLogits().getDefiningOp<SoftcapOp>();
    if (cap && !cap->hasOneUse())
      return success();
    Value headOut = cap ? cap.getX() : ce.getLogits();
    auto head = headOut.getDefiningOp<LinearOp>();
    if (!head || !paramOf(head.getW()) || head.getBias() ||
        !head->hasOneUse())
      return success(); // not an LM head we know: stays replicated
    int64_t vocab = tensorTy(head.getResult()).getShape().back();
    if (failed(divides(head, vocab, "vocab_size")) ||
        failed(columnParallel(head, 1)))
      return failure();
    if (cap)
      setResultType(cap.getResult(), tensorTy(head.getResult()));
    // loss = mean(log Σ_r Σ_v exp(l − max) − (l_t − max)) with the two sums
    // and the max reduced over tp (Megatron's vocab-parallel cross-entropy).
    OpBuilder b(ce);
    Location loc = ce.getLoc();
    Value logits = ce.getLogits();
    auto rowsTy = RankedTensorType::get(tensorTy(ce.getTargets()).getShape(),
                                        tensorTy(logits).getElementType());
    int64_t last = tensorTy(logits).getRank() - 1;
    auto localMax = b.create<ReduceMaxOp>(loc, rowsTy, logits,
                                          b.getDenseI64ArrayAttr({last}));
    auto max = b.create<AllReduceOp>(loc, rowsTy, localMax,
                                     b.getStringAttr("tp"), DenseI64ArrayAttr(),
                                     b.getStringAttr("max"));
    SmallVector<int64_t> pshape(rowsTy.getShape());
    pshape.push_back(2);
    auto pTy = RankedTensorType::get(pshape, rowsTy.getElementType());
    auto partials = b.create<VocabCEPartialsOp>(
        loc, pTy, logits, ce.getTargets(), max, b.getStringAttr("tp"));
    auto sums = b.create<AllReduceOp>(loc, pTy, partials, b.getStringAttr("tp"),
                                      DenseI64ArrayAttr(),
                                      b.getStringAttr("sum"));
    auto loss = b.create<CEFromPartialsOp>(loc, ce.getType(), sums,
                                           ce.getTargets(),
                                           ce.getIgnoreIndexAttr());
    if (auto name = ce->getAttr("mapp.name"))
      loss->setAttr("mapp.name", name);
    ce.replaceAllUsesWith(loss.getResult());
    ce.erase();
    return success();
  }

  /// Vocab-parallel embedding: each rank looks up its vocabulary slice
  /// (zero rows elsewhere) and the partial rows are summed over tp.
  LogicalResult shardEmbedding(EmbeddingOp emb) {
    if (!paramOf(emb.getTable()))
      return success();
    int64_t vocab = tensorTy(emb.getTable()).getShape()[0];
    if (failed(divides(emb, vocab, "vocab_size")) ||
        failed(require(emb.getTable(), 0, 1, emb)))
      return failure();
    emb.setGroupAttr(StringAttr::get(&getContext(), "tp"));
    OpBuilder b(emb->getContext());
    b.setInsertionPointAfter(emb);
    auto sum = b.create<AllReduceOp>(emb.getLoc(), emb.getType(), emb,
                                     b.getStringAttr("tp"), DenseI64ArrayAttr(),
                                     b.getStringAttr("sum"));
    emb.getResult().replaceAllUsesExcept(sum, sum);
    reductions.push_back(sum);
    return success();
  }

  //===--------------------------------------------------------------------===//
  // Sequence parallelism
  //===--------------------------------------------------------------------===//

  /// Turns the replicated regions between the tp-sharded blocks into
  /// sequence-sharded ones: every all_reduce after a row-parallel linear or
  /// the embedding becomes a reduce_scatter along the sequence (dim 1 of
  /// [B, T, H]); norms, residual adds and dropouts then run on [B, T/tp, H];
  /// each copy_to_group entering a column-parallel linear becomes an
  /// all_gather along the sequence. Parameters used inside the region
  /// (norm gains, biases) get a copy_to_group so their partial gradients
  /// (one sequence slice per rank) are summed; a position embedding [T, H]
  /// is cut with scatter_to_group.
  LogicalResult applySequenceParallel(func::FuncOp fn) {
    llvm::DenseSet<Value> sharded;
    OpBuilder b(&getContext());
    constexpr int64_t seqDim = 1;
    for (AllReduceOp r : reductions) {
      auto t = tensorTy(r.getResult());
      if (t.getRank() != 3)
        return fail(r, "sequence parallel expects [batch, seq, hidden] "
                       "activations");
      if (failed(divides(r, t.getShape()[seqDim], "seq_length")))
        return failure();
      b.setInsertionPoint(r);
      auto rs = b.create<ReduceScatterOp>(r.getLoc(), shrink(t, seqDim, tp),
                                          r.getX(), b.getStringAttr("tp"),
                                          DenseI64ArrayAttr(),
                                          b.getI64IntegerAttr(seqDim));
      r.replaceAllUsesWith(rs.getResult());
      r.erase();
      sharded.insert(rs);
    }
    reductions.clear();

    auto isParamLike = [](Value v) {
      Operation *d = v.getDefiningOp();
      return d && isa<ParamRefOp, FillOp>(d);
    };
    // Program order is a topological order: when an op is visited, whether
    // each operand is sequence-sharded is final.
    for (Operation &op : llvm::make_early_inc_range(fn.getBody().front())) {
      Operation *user = &op;
      auto it = llvm::find_if(user->getOperands(),
                              [&](Value v) { return sharded.contains(v); });
      if (it == user->getOperands().end())
        continue;
      RankedTensorType shardTy = tensorTy(*it);
      if (auto copy = dyn_cast<CopyToGroupOp>(user)) {
        // Column-parallel entry: gather the sequence instead of f.
        b.setInsertionPoint(copy);
        auto gather = b.create<AllGatherOp>(
            copy.getLoc(), copy.getType(), copy.getX(), b.getStringAttr("tp"),
            DenseI64ArrayAttr(), b.getI64IntegerAttr(seqDim));
        copy.replaceAllUsesWith(gather.getResult());
        copy.erase();
        continue;
      }
      if (!isa<AddOp, MulOp, DropoutOp, LayerNormOp, RMSNormOp, GeluOp, SiluOp,
               ScaleOp>(user))
        return fail(user, "op is not supported inside a sequence-parallel "
                          "region (only norms, residual adds, dropout and "
                          "elementwise ops)");
      SmallVector<int64_t> full(shardTy.getShape());
      full[seqDim] *= tp;
      auto fullTy = RankedTensorType::get(full, shardTy.getElementType());
      // Bring every other operand onto this rank's sequence slice.
      for (OpOperand &other : user->getOpOperands()) {
        Value o = other.get();
        if (sharded.contains(o))
          continue;
        auto ot = tensorTy(o);
        b.setInsertionPoint(user);
        if (ot == fullTy) {
          other.set(b.create<ScatterToGroupOp>(user->getLoc(), shardTy, o,
                                               b.getStringAttr("tp"),
                                               b.getI64IntegerAttr(seqDim)));
        } else if (ot.getRank() == 2 && ot.getShape()[0] == full[seqDim]) {
          // A [T, H] broadcast (position embedding): cut the sequence.
          other.set(b.create<ScatterToGroupOp>(user->getLoc(), shrink(ot, 0, tp),
                                               o, b.getStringAttr("tp"),
                                               b.getI64IntegerAttr(0)));
        } else if (ot.getRank() <= 1 && isParamLike(o)) {
          // [H] gain/bias: each rank's gradient covers its sequence slice,
          // so the gradients are summed over tp (f).
          other.set(b.create<CopyToGroupOp>(user->getLoc(), ot, o,
                                            b.getStringAttr("tp")));
        } else {
          return fail(user, "cannot bring operand #")
                 << other.getOperandNumber()
                 << " into the sequence-parallel region";
        }
      }
      for (Value r : user->getResults())
        if (r.getType() == fullTy) {
          r.setType(shardTy);
          sharded.insert(r);
        }
    }
    // A sharded value leaving the region any other way would be wrong.
    for (Value v : sharded)
      for (Operation *u : v.getUsers())
        if (isa<func::ReturnOp>(u))
          return fail(u, "a sequence-sharded value reaches the return");
    return success();
  }

  //===--------------------------------------------------------------------===//

  void runOnOperation() override {
    module = getOperation();
    if (tp < 1) {
      module.emitError("mapp-tensor-parallel: tp must be >= 1");
      return signalPassFailure();
    }
    if (failed(checkAtMost(module, "mapp-tensor-parallel", "tp", tp, kMaxDegree,
                           kMaxDegreeWhy)))
      return signalPassFailure();
    setParallelInt(module, "tp", tp);
    if (tp == 1)
      return; // nothing to shard
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    if (!fn) {
      module.emitError("mapp-tensor-parallel: no function @forward (run the "
                       "pass on the forward graph, before autodiff)");
      return signalPassFailure();
    }
    if (failed(shard(fn)) || (sequenceParallel && failed(applySequenceParallel(fn))) ||
        failed(finalize()))
      return signalPassFailure();
  }

  LogicalResult shard(func::FuncOp fn) {
    SmallVector<AttentionOp> attns;
    SmallVector<CrossEntropyOp> ces;
    SmallVector<EmbeddingOp> embs;
    SmallVector<LinearOp> linears;
    fn.walk([&](Operation *op) {
      if (auto a = dyn_cast<AttentionOp>(op))
        attns.push_back(a);
      else if (auto c = dyn_cast<CrossEntropyOp>(op))
        ces.push_back(c);
      else if (auto e = dyn_cast<EmbeddingOp>(op))
        embs.push_back(e);
      else if (auto l = dyn_cast<LinearOp>(op))
        linears.push_back(l);
    });
    // Match the MLPs before any rewrite (attention replaces projections).
    struct MLP {
      LinearOp down;
      SmallVector<Operation *> chain;
      SmallVector<LinearOp> ups;
    };
    SmallVector<MLP> mlps;
    for (LinearOp down : linears) {
      MLP m{down, {}, {}};
      if (matchMLP(down, m.chain, m.ups))
        mlps.push_back(std::move(m));
    }
    // Check every degree before rewriting anything, heads first.
    for (AttentionOp a : attns)
      if (failed(divides(a, a.getHeadsAttr().getInt(), "num_attention_heads")) ||
          failed(divides(a, tensorTy(a.getQ()).getShape().back(),
                         "hidden_size")))
        return failure();
    for (MLP &m : mlps)
      if (failed(divides(m.down, tensorTy(m.down.getX()).getShape().back(),
                         "ffn_hidden_size")))
        return failure();
    for (EmbeddingOp e : embs)
      if (paramOf(e.getTable()) &&
          failed(divides(e, tensorTy(e.getTable()).getShape()[0],
                         "vocab_size")))
        return failure();
    for (MLP &m : mlps)
      if (failed(shardMLP(m.down, m.chain, m.ups)))
        return failure();
    for (AttentionOp a : attns)
      if (failed(shardAttention(a)))
        return failure();
    for (CrossEntropyOp c : ces)
      if (failed(shardHead(c)))
        return failure();
    for (EmbeddingOp e : embs)
      if (failed(shardEmbedding(e)))
        return failure();
    return success();
  }

  /// Gives each sharded parameter its shard type and slicing attributes,
  /// after checking every read of it was rewritten for the shard.
  LogicalResult finalize() {
    MLIRContext *ctx = &getContext();
    for (auto &[name, spec] : specs) {
      auto param = module.lookupSymbol<ParamOp>(name);
      if (!param)
        return module.emitError("mapp-tensor-parallel: unknown parameter @")
               << name.getValue();
      auto full = cast<RankedTensorType>(param.getType());
      int64_t size = full.getShape()[spec.dim];
      if (size % (tp * spec.blocks) != 0)
        return fail(param, "tp=")
               << tp.getValue() << " does not divide dim " << spec.dim
               << " (" << size << ") of @" << name.getValue();
      auto shardTy = shrink(full, spec.dim, tp);
      SmallVector<ParamRefOp> refs;
      module.walk([&](ParamRefOp ref) {
        if (ref.getParamAttr().getAttr() == name)
          refs.push_back(ref);
      });
      for (ParamRefOp ref : refs)
        for (Operation *user : ref->getUsers())
          if (!shardedUsers.contains(user)) {
            auto d = fail(user, "parameter @")
                     << name.getValue()
                     << " is tensor-parallel sharded, but this op reads it "
                        "in a way the pass cannot shard";
            d.attachNote(spec.user->getLoc()) << "sharded for this op";
            return failure();
          }
      param.setTypeAttr(TypeAttr::get(shardTy));
      param.setShardDimAttr(IntegerAttr::get(IntegerType::get(ctx, 64), spec.dim));
      param.setShardGroupAttr(StringAttr::get(ctx, "tp"));
      if (spec.blocks != 1)
        param.setShardBlocksAttr(
            IntegerAttr::get(IntegerType::get(ctx, 64), spec.blocks));
      for (ParamRefOp ref : refs)
        ref.getResult().setType(shardTy);
    }
    return success();
  }
};

} // namespace
