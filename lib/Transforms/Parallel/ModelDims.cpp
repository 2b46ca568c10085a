//===- ModelDims.cpp - the dimensions the auto-parallel search prices -----===//
//
// The cost model prices a GPT-shaped model by its dimensions. The importers
// record them (`mapp.model`); a generic export (python -m mapp.export
// --module yours:Model) has only its graph, so they are read from it: the
// blocks (LayerNames), the token embedding's table (vocabulary, hidden),
// the tokens' shape (micro-batch, sequence), block 0's attention (heads,
// KV heads) and projections by a parameter (the MLP's width; 3·hidden·width
// parameters: gated); an MoE's experts, top-k and expert width from its
// first MoE block's ops (docs/moe.md).
//
//===----------------------------------------------------------------------===//
#include "ModelDims.h"
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallSet.h"

#include <set>

using namespace mlir;
using namespace mapp;

namespace {

int64_t intKey(DictionaryAttr d, StringRef k, int64_t dflt = 0) {
  auto a = d.getAs<IntegerAttr>(k);
  return a ? a.getInt() : dflt;
}

ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// The parameter a value reads, through nothing: "" for an activation.
StringRef paramOf(Value v) {
  auto ref = v.getDefiningOp<ParamRefOp>();
  return ref ? ref.getParam() : StringRef();
}

/// The MoE of the first block with one (the cost model prices MoE in every
/// layer, as for an importer's moe_layer_freq): experts (moe_assign), top-k
/// (moe_router), the experts' width (what the grouped product back to the
/// hidden size reads) and gating (3·hidden·width parameters an expert).
/// Success without experts when there is no MoE.
LogicalResult readExperts(func::FuncOp fwd, const LayerNames &names,
                          cost::ModelDims &m) {
  std::optional<unsigned> block;
  fwd.walk([&](MoeAssignOp a) {
    std::optional<unsigned> l = names.layerOf(a);
    if (l && (!block || *l < *block)) {
      block = l;
      m.experts = a.getNumExperts();
    }
  });
  if (!block)
    return success();
  auto inBlock = [&](Operation *op) { return names.layerOf(op) == block; };
  fwd.walk([&](MoeRouterOp r) {
    if (inBlock(r))
      m.topk = r.getTopk();
  });
  double params = 0;
  bool bad = false;
  fwd.walk([&](MoeGroupedMatmulOp g) {
    if (!inBlock(g))
      return;
    ArrayRef<int64_t> w = shapeOf(g.getW());
    if (w.size() != 3) {
      bad = true;
      return;
    }
    int64_t in = g.getTransposeB() ? w[2] : w[1];
    int64_t out = g.getTransposeB() ? w[1] : w[2];
    params += double(in) * out;
    if (out == m.hidden)
      m.moeFfn = std::max(m.moeFfn, in);
  });
  if (bad || m.moeFfn == 0)
    return failure();
  m.llama = params >= 2.5 * m.hidden * m.moeFfn;
  return success();
}

FailureOr<cost::ModelDims> fromGraph(ModuleOp module, func::FuncOp fwd,
                                     const LayerNames &names,
                                     int64_t &graphMicroBatch) {
  cost::ModelDims m;
  auto fail = [&](const Twine &what) -> FailureOr<cost::ModelDims> {
    module.emitError("mapp-auto-parallel: the module has no mapp.model and ")
        << what << " (a generic export's graph is read for the model's "
        << "dimensions; docs/auto-parallel.md \"Generic exports\")";
    return failure();
  };
  std::set<unsigned> layers;
  module.walk([&](ParamOp p) {
    if (std::optional<unsigned> l = names.layerOf(p.getSymName()))
      layers.insert(*l);
  });
  m.layers = layers.size();
  if (m.layers == 0)
    return fail("no parameter lies in a block named " + names.prefix() + "N");

  EmbeddingOp emb;
  fwd.walk([&](EmbeddingOp e) {
    if (!emb && !paramOf(e.getTable()).empty())
      emb = e;
  });
  if (!emb)
    return fail("@forward has no embedding of a parameter table");
  ArrayRef<int64_t> table = shapeOf(emb.getTable()), ids = shapeOf(emb.getIds());
  if (table.size() != 2 || ids.size() != 2)
    return fail("the token embedding is not a [vocab, hidden] table read "
                "with [batch, sequence] ids");
  m.vocab = table[0];
  m.hidden = table[1];
  graphMicroBatch = ids[0];
  m.seq = ids[1];

  AttentionOp att;
  fwd.walk([&](AttentionOp a) {
    if (!att && names.layerOf(a) == 0u)
      att = a;
  });
  if (!att)
    return fail("block 0 (" + names.key(0) + ") has no mapp.attention");
  m.heads = att.getHeads();
  int64_t qCols = shapeOf(att.getQ()).back(), kCols = shapeOf(att.getK()).back();
  if (m.heads <= 0 || qCols % m.heads || kCols % (qCols / m.heads))
    return fail("block 0's attention has q/k widths that are no multiple of "
                "its heads");
  m.kvHeads = kCols / (qCols / m.heads);

  // Block 0's MLP: the linears reading or writing a width other than the
  // hidden size and the attention's (q, k, v, their fusion). Its width is
  // what the projection back to the hidden size reads ([hidden, F]); it is
  // gated when its matrices hold 3·hidden·F (gate, up, down; a fused
  // gate-up [2F, hidden] included), plain at 2·hidden·F.
  llvm::SmallSet<int64_t, 4> attnWidths;
  for (int64_t w : {qCols, kCols, qCols + 2 * kCols, 3 * qCols})
    attnWidths.insert(w);
  double mlpParams = 0;
  bool tied = false;
  // A projection by a parameter: nn.Linear's [out, in] weight, or a
  // matmul's (HF GPT-2's Conv1D: [in, out] unless transposed).
  fwd.walk([&](Operation *op) {
    Value weight;
    bool outFirst = true;
    if (auto lin = dyn_cast<LinearOp>(op))
      weight = lin.getW();
    else if (auto mm = dyn_cast<MatmulOp>(op))
      std::tie(weight, outFirst) = std::pair(mm.getB(), mm.getTransposeB());
    StringRef w = weight ? paramOf(weight) : StringRef();
    if (w.empty())
      return;
    if (w == paramOf(emb.getTable()))
      tied = true;
    ArrayRef<int64_t> ws = shapeOf(weight);
    if (names.layerOf(w) != 0u || ws.size() != 2 ||
        llvm::all_of(ws, [&](int64_t d) {
          return d == m.hidden || attnWidths.contains(d);
        }))
      return;
    int64_t out = outFirst ? ws[0] : ws[1], in = outFirst ? ws[1] : ws[0];
    mlpParams += double(out) * in;
    if (out == m.hidden)
      m.ffn = std::max(m.ffn, in);
  });
  if (failed(readExperts(fwd, names, m)))
    return fail("its MoE block's expert products are not [experts, in, out] "
                "weights back to the hidden size");
  if (m.ffn == 0 && m.experts == 0)
    return fail("block 0 has no MLP linear back to the hidden size from "
                "another width");
  // An MoE block 0 has no dense MLP (its router's [experts, hidden] is no
  // MLP): the dense width is the experts'; gating is read from them.
  if (m.ffn == 0)
    m.ffn = m.moeFfn;
  else
    m.llama = mlpParams >= 2.5 * m.hidden * m.ffn;
  m.tiedEmbeddings = tied;
  return m;
}

} // namespace

FailureOr<cost::ModelDims> mapp::modelDimsOf(ModuleOp module,
                                             int64_t &graphMicroBatch) {
  graphMicroBatch = 0;
  auto fwd = module.lookupSymbol<func::FuncOp>("forward");
  auto d = module->getAttrOfType<DictionaryAttr>("mapp.model");
  const LayerNames names = LayerNames::of(module);
  FailureOr<cost::ModelDims> dims;
  if (d) {
    cost::ModelDims m;
    auto kind = d.getAs<StringAttr>("kind");
    m.llama = kind && kind.getValue() == "llama";
    m.layers = intKey(d, "num_layers");
    m.hidden = intKey(d, "hidden_size");
    m.heads = intKey(d, "num_attention_heads");
    m.kvHeads = intKey(d, "num_query_groups", m.heads);
    m.ffn = intKey(d, "ffn_hidden_size");
    m.vocab = intKey(d, "vocab_size");
    m.seq = intKey(d, "seq_length");
    auto tiedAttr = d.getAs<BoolAttr>("tie_embeddings");
    m.tiedEmbeddings = !tiedAttr || tiedAttr.getValue();
    m.experts = intKey(d, "num_moe_experts");
    m.topk = intKey(d, "moe_router_topk", 2);
    m.moeFfn = intKey(d, "moe_ffn_hidden_size", m.ffn);
    dims = m;
  } else if (!fwd) {
    module.emitError("mapp-auto-parallel: the module has neither mapp.model "
                     "nor a @forward graph to read the model from");
    return failure();
  } else {
    dims = fromGraph(module, fwd, names, graphMicroBatch);
    if (failed(dims))
      return failure();
  }
  // The plan dispatches one instruction an op: count block 0's.
  if (fwd) {
    double ops = 0;
    fwd.walk([&](Operation *op) {
      if (names.layerOf(op) == 0u)
        ++ops;
    });
    if (ops > 0)
      dims->layerForwardOps = ops;
  }
  return dims;
}
