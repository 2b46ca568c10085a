//===- GPTImporter.cpp - GPT config -> mapp forward graph -----------------===//
//
// Emits exactly what python/mapp/export.py emits for python/mapp/reference.py
// with the same config (docs/models.md, "The forward graph"): same params in
// state_dict order, same ops in the same order, one param_ref per use placed
// right before its user, same attributes and mapp.name values.
// test/python/test_reference_importer.py compares the two after mapp-opt.
//
//===----------------------------------------------------------------------===//

#include "mapp/Frontend/GPT/GPTImporter.h"

#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Support/InputChecks.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/SourceMgr.h"

#include <cmath>

using namespace mlir;
using namespace mapp;

namespace {

class GraphBuilder {
public:
  GraphBuilder(const GPTConfig &c, MLIRContext *ctx)
      : c(c), b(ctx), loc(UnknownLoc::get(ctx)), f32(b.getF32Type()) {}

  OwningOpRef<ModuleOp> build();

private:
  using Shape = SmallVector<int64_t, 4>;

  RankedTensorType tensor(ArrayRef<int64_t> shape, Type elem = {}) {
    return RankedTensorType::get(shape, elem ? elem : f32);
  }

  void declare(StringRef name, ArrayRef<int64_t> shape,
               StringRef vectorInit = "");
  void declareNorm(const std::string &prefix);
  Value ref(StringRef name);

  template <typename OpT>
  Value op(StringRef name, ValueRange operands, ArrayRef<int64_t> shape,
           SmallVector<NamedAttribute> attrs = {}) {
    if (!name.empty())
      attrs.push_back(b.getNamedAttr("mapp.name", b.getStringAttr(name)));
    return b.create<OpT>(loc, TypeRange{tensor(shape)}, operands, attrs)
        .getResult();
  }

  NamedAttribute i64(StringRef k, int64_t v) {
    return b.getNamedAttr(k, b.getI64IntegerAttr(v));
  }
  NamedAttribute f64(StringRef k, double v) {
    return b.getNamedAttr(k, b.getF64FloatAttr(v));
  }

  Value norm(Value x, const std::string &prefix);
  Value linear(Value x, const std::string &prefix, int64_t out, bool bias);
  Value maybeDropout(Value x, const std::string &name);
  Value layer(Value x, int64_t l);
  Value moe(Value m, const std::string &p);
  void declareMoe(const std::string &p);
  DictionaryAttr modelAttrs();

  const GPTConfig &c;
  OpBuilder b;
  Location loc;
  Type f32;
  llvm::StringMap<Shape> shapes;
  int64_t dropoutSeed = 0;
  SmallVector<Value> auxLosses; // MoE load-balancing and z-losses, in order
};

void GraphBuilder::declare(StringRef name, ArrayRef<int64_t> shape,
                           StringRef vectorInit) {
  shapes[name] = Shape(shape.begin(), shape.end());
  // The reference init rule (docs/models.md): normal(0.02) for matrices,
  // zeros for biases, ones for norm weights.
  SmallVector<NamedAttribute> attrs{
      b.getNamedAttr("sym_name", b.getStringAttr(name)),
      b.getNamedAttr("type", TypeAttr::get(tensor(shape)))};
  if (shape.size() >= 2) {
    attrs.push_back(b.getNamedAttr("init", b.getStringAttr("normal")));
    attrs.push_back(f64("std", 0.02));
  } else {
    if (vectorInit.empty())
      vectorInit = name.ends_with(".bias") ? "zeros" : "ones";
    attrs.push_back(b.getNamedAttr("init", b.getStringAttr(vectorInit)));
  }
  b.create<ParamOp>(loc, TypeRange{}, ValueRange{}, attrs);
}

void GraphBuilder::declareNorm(const std::string &prefix) {
  const int64_t H = c.hiddenSize;
  // A gain stored as 1 + weight (Gemma) starts at weight 0, as HF's does.
  declare(prefix + ".weight", {H}, c.normWeightOffset != 0 ? "zeros" : "");
  if (!c.rmsNorm())
    declare(prefix + ".bias", {H});
}

Value GraphBuilder::ref(StringRef name) {
  auto attr = b.getNamedAttr("param", FlatSymbolRefAttr::get(b.getContext(), name));
  return b.create<ParamRefOp>(loc, TypeRange{tensor(shapes[name])}, ValueRange{},
                              ArrayRef<NamedAttribute>{attr})
      .getResult();
}

Value GraphBuilder::norm(Value x, const std::string &prefix) {
  auto shape = cast<RankedTensorType>(x.getType()).getShape();
  Value gamma = ref(prefix + ".weight");
  if (c.rmsNorm()) {
    SmallVector<NamedAttribute> attrs{f64("eps", c.layernormEpsilon)};
    if (c.normWeightOffset != 0)
      attrs.push_back(f64("weight_offset", c.normWeightOffset));
    return op<RMSNormOp>(prefix, {x, gamma}, shape, attrs);
  }
  Value beta = ref(prefix + ".bias");
  return op<LayerNormOp>(prefix, {x, gamma, beta}, shape,
                         {f64("eps", c.layernormEpsilon)});
}

Value GraphBuilder::linear(Value x, const std::string &prefix, int64_t out,
                           bool bias) {
  Shape shape(cast<RankedTensorType>(x.getType()).getShape());
  shape.back() = out;
  SmallVector<Value> operands{x, ref(prefix + ".weight")};
  if (bias)
    operands.push_back(ref(prefix + ".bias"));
  return op<LinearOp>(prefix, operands, shape);
}

Value GraphBuilder::maybeDropout(Value x, const std::string &name) {
  if (c.hiddenDropout == 0)
    return x;
  auto shape = cast<RankedTensorType>(x.getType()).getShape();
  return op<DropoutOp>(name, {x}, shape,
                       {f64("p", c.hiddenDropout), i64("seed", dropoutSeed++)});
}

Value GraphBuilder::layer(Value x, int64_t l) {
  const std::string p = "layers." + std::to_string(l);
  const int64_t B = c.microBatchSize, T = c.seqLength, H = c.hiddenSize;

  // Attention: fused qkv and three slices; with grouped-query attention
  // three projections (k and v have numQueryGroups heads), which tensor
  // parallelism splits like Megatron's query groups. The query width is
  // heads·head_dim, which is H unless head_dim is decoupled (Gemma).
  const int64_t QW = c.numHeads * c.headDim();
  const int64_t KV = c.numQueryGroups * c.headDim();
  Value qkvs[3];
  Value normed = norm(x, p + ".ln1");
  if (c.isGQA()) {
    qkvs[0] = linear(normed, p + ".attn.q", QW, c.qkvBias);
    qkvs[1] = linear(normed, p + ".attn.k", KV, c.qkvBias);
    qkvs[2] = linear(normed, p + ".attn.v", KV, c.qkvBias);
  } else {
    Value qkv = linear(normed, p + ".attn.qkv", 3 * QW, c.qkvBias);
    const char *sliceNames[3] = {".attn.slice", ".attn.slice_1", ".attn.slice_2"};
    for (int i = 0; i < 3; ++i)
      qkvs[i] = op<SliceOp>(p + sliceNames[i], {qkv}, {B, T, QW},
                            {i64("dim", 2), i64("start", i * QW),
                             i64("end", (i + 1) * QW)});
  }
  int64_t headDim = c.headDim();
  double scale = c.attentionScale ? c.attentionScale
                                  : 1.0 / std::sqrt(double(headDim));
  SmallVector<NamedAttribute> attrs{i64("heads", c.numHeads), f64("scale", scale),
                                    b.getNamedAttr("causal", b.getUnitAttr())};
  if (c.rope()) {
    attrs.push_back(b.getNamedAttr("rotary", b.getUnitAttr()));
    attrs.push_back(f64("rotary_base", c.rotaryBase));
    if (c.rotaryDim() != headDim)
      attrs.push_back(i64("rotary_dim", c.rotaryDim()));
  }
  if (c.attentionSoftcap)
    attrs.push_back(f64("softcap", c.attentionSoftcap));
  if (c.windowed(l))
    attrs.push_back(i64("sliding_window", c.slidingWindow));
  if (c.attentionDropout) {
    attrs.push_back(f64("dropout", c.attentionDropout));
    attrs.push_back(i64("dropout_seed", dropoutSeed++));
  }
  Value attn = op<AttentionOp>(p + ".attn.attention", {qkvs[0], qkvs[1], qkvs[2]},
                               {B, T, QW}, attrs);
  Value proj = linear(attn, p + ".attn.proj", H, c.linearBias);
  if (c.postNorms)
    proj = norm(proj, p + ".ln_post_attn");
  proj = maybeDropout(proj, p + ".dropout");
  // GPT-NeoX's parallel residual: both branches read the layer's input.
  Value residual = x;
  if (!c.parallelResidual)
    x = op<AddOp>(p + ".add", {x, proj}, {B, T, H});

  // MLP.
  Value m = norm(c.parallelResidual ? residual : x, p + ".ln2");
  Value y;
  const int64_t F = c.ffnHiddenSize;
  if (c.isMoeLayer(l)) {
    y = moe(m, p);
  } else if (c.mlpType != "gelu") {
    Value gate = linear(m, p + ".mlp.gate", F, c.linearBias);
    Value act =
        c.mlpType == "swiglu"
            ? op<SiluOp>(p + ".mlp.silu", {gate}, {B, T, F})
            : op<GeluOp>(p + ".mlp.gelu", {gate}, {B, T, F},
                         {b.getNamedAttr("approximate",
                                         b.getStringAttr(c.geluApproximate))});
    Value up = linear(m, p + ".mlp.up", F, c.linearBias);
    Value prod = op<MulOp>(p + ".mlp.mul", {act, up}, {B, T, F});
    y = linear(prod, p + ".mlp.down", H, c.linearBias);
  } else {
    Value h = linear(m, p + ".mlp.fc1", F, c.linearBias);
    Value act = op<GeluOp>(p + ".mlp.gelu", {h}, {B, T, F},
                           {b.getNamedAttr("approximate",
                                           b.getStringAttr(c.geluApproximate))});
    y = linear(act, p + ".mlp.fc2", H, c.linearBias);
  }
  if (c.postNorms)
    y = norm(y, p + ".ln_post_mlp");
  y = maybeDropout(y, p + ".dropout_1");
  if (c.parallelResidual)
    x = op<AddOp>(p + ".add", {x, proj}, {B, T, H});
  return op<AddOp>(p + ".add_1", {x, y}, {B, T, H});
}

/// The MoE MLP of python/mapp/moe.py (docs/moe.md), op for op what the
/// exporter emits for it.
Value GraphBuilder::moe(Value m, const std::string &p) {
  const int64_t B = c.microBatchSize, T = c.seqLength, H = c.hiddenSize,
                N = B * T, E = c.numMoeExperts, K = c.moeRouterTopk,
                F = c.moeFfnHiddenSize, R = N * K;
  const std::string mp = p + ".mlp", ex = mp + ".experts";
  Type i32 = b.getI32Type();
  Value routed = linear(m, mp + ".router", E, false);
  Value logits = op<ReshapeOp>(mp + ".reshape", {routed}, {N, E});
  auto router = b.create<MoeRouterOp>(
      loc, TypeRange{tensor({N, K}), tensor({N, K}, i32)}, ValueRange{logits},
      ArrayRef<NamedAttribute>{b.getNamedAttr("mapp.name",
                                              b.getStringAttr(mp + ".moe_router")),
                               i64("topk", K)});
  Value probs = router.getProbs(), experts = router.getExperts();
  SmallVector<NamedAttribute> assignAttrs{
      b.getNamedAttr("mapp.name", b.getStringAttr(mp + ".moe_assign")),
      i64("num_experts", E)};
  if (std::optional<int64_t> cap = c.moeCapacity())
    assignAttrs.push_back(i64("capacity", *cap));
  auto assign = b.create<MoeAssignOp>(
      loc, TypeRange{tensor({N, K}, i32), tensor({E}, i32)},
      ValueRange{probs, experts}, assignAttrs);
  Value slots = assign.getSlots(), counts = assign.getCounts();
  Value flat = op<ReshapeOp>(mp + ".reshape_1", {m}, {N, H});
  Value xp = op<MoePermuteOp>(mp + ".moe_permute", {flat, slots}, {R, H});
  auto grouped = [&](Value x, const char *name, int64_t out) {
    std::string w = ex + "." + name;
    return op<MoeGroupedMatmulOp>(w, {x, ref(w + ".weight"), counts}, {R, out});
  };
  Value yp;
  if (c.mlpType != "gelu") {
    Value gate = grouped(xp, "gate", F);
    Value act =
        c.mlpType == "swiglu"
            ? op<SiluOp>(mp + ".silu", {gate}, {R, F})
            : op<GeluOp>(mp + ".gelu", {gate}, {R, F},
                         {b.getNamedAttr("approximate",
                                         b.getStringAttr(c.geluApproximate))});
    Value prod = op<MulOp>(mp + ".mul", {act, grouped(xp, "up", F)}, {R, F});
    yp = grouped(prod, "down", H);
  } else {
    Value act = op<GeluOp>(mp + ".gelu", {grouped(xp, "fc1", F)}, {R, F},
                           {b.getNamedAttr("approximate",
                                           b.getStringAttr(c.geluApproximate))});
    yp = grouped(act, "fc2", H);
  }
  Value y = op<MoeUnpermuteOp>(mp + ".moe_unpermute", {yp, probs, slots}, {N, H});
  if (c.moeAuxLossCoeff > 0)
    auxLosses.push_back(op<MoeAuxLossOp>(mp + ".moe_aux_loss", {logits, experts}, {},
                                         {f64("coeff", c.moeAuxLossCoeff)}));
  if (c.moeZLossCoeff > 0)
    auxLosses.push_back(op<MoeZLossOp>(mp + ".moe_z_loss", {logits}, {},
                                       {f64("coeff", c.moeZLossCoeff)}));
  return op<ReshapeOp>(mp + ".reshape_2", {y}, {B, T, H});
}

void GraphBuilder::declareMoe(const std::string &p) {
  const int64_t H = c.hiddenSize, E = c.numMoeExperts, F = c.moeFfnHiddenSize;
  const std::string ex = p + ".mlp.experts.";
  declare(p + ".mlp.router.weight", {E, H});
  if (c.mlpType != "gelu") {
    declare(ex + "gate.weight", {E, H, F});
    declare(ex + "up.weight", {E, H, F});
    declare(ex + "down.weight", {E, F, H});
  } else {
    declare(ex + "fc1.weight", {E, H, F});
    declare(ex + "fc2.weight", {E, F, H});
  }
}

DictionaryAttr GraphBuilder::modelAttrs() {
  SmallVector<NamedAttribute> a{
      b.getNamedAttr("kind", b.getStringAttr(c.variant)),
      i64("num_layers", c.numLayers),
      i64("hidden_size", c.hiddenSize),
      i64("num_attention_heads", c.numHeads),
      i64("ffn_hidden_size", c.ffnHiddenSize),
      i64("seq_length", c.seqLength),
      i64("vocab_size", c.vocabSize),
      i64("micro_batch_size", c.microBatchSize),
      b.getNamedAttr("tie_embeddings", b.getBoolAttr(c.tieEmbeddings)),
      b.getNamedAttr("dtype", b.getStringAttr(c.dtype)),
      f64("layernorm_epsilon", c.layernormEpsilon),
      b.getNamedAttr("gelu_approximate", b.getStringAttr(c.geluApproximate)),
      f64("rotary_base", c.rotaryBase),
      f64("hidden_dropout", c.hiddenDropout),
      f64("attention_dropout", c.attentionDropout),
      i64("make_vocab_size_divisible_by", c.vocabDivisor),
      i64("seed", c.seed)};
  // Only grouped-query models carry it, so MHA graphs stay as exported.
  if (c.isGQA())
    a.push_back(i64("num_query_groups", c.numQueryGroups));
  // Family options only where they differ from the variant's defaults, so
  // the two variants' graphs stay as exported.
  bool gpt = !c.isLlama();
  if (c.normType != (gpt ? "layernorm" : "rmsnorm"))
    a.push_back(b.getNamedAttr("norm_type", b.getStringAttr(c.normType)));
  if (c.positionType != (gpt ? "learned" : "rope"))
    a.push_back(b.getNamedAttr("position_type", b.getStringAttr(c.positionType)));
  if (c.mlpType != (gpt ? "gelu" : "swiglu"))
    a.push_back(b.getNamedAttr("mlp_type", b.getStringAttr(c.mlpType)));
  if (c.qkvBias != gpt)
    a.push_back(b.getNamedAttr("qkv_bias", b.getBoolAttr(c.qkvBias)));
  if (c.linearBias != gpt)
    a.push_back(b.getNamedAttr("linear_bias", b.getBoolAttr(c.linearBias)));
  if (c.headDimension)
    a.push_back(i64("head_dim", c.headDimension));
  if (c.rotaryPercent != 1.0)
    a.push_back(f64("rotary_percent", c.rotaryPercent));
  if (c.parallelResidual)
    a.push_back(b.getNamedAttr("parallel_residual", b.getBoolAttr(true)));
  if (c.normWeightOffset)
    a.push_back(f64("norm_weight_offset", c.normWeightOffset));
  if (c.postNorms)
    a.push_back(b.getNamedAttr("post_norms", b.getBoolAttr(true)));
  if (c.embeddingMultiplier != 1.0)
    a.push_back(f64("embedding_multiplier", c.embeddingMultiplier));
  if (c.attentionSoftcap)
    a.push_back(f64("attention_softcap", c.attentionSoftcap));
  if (c.logitSoftcap)
    a.push_back(f64("logit_softcap", c.logitSoftcap));
  if (c.slidingWindow) {
    a.push_back(i64("sliding_window", c.slidingWindow));
    a.push_back(b.getNamedAttr("sliding_window_layers",
                               b.getStringAttr(c.slidingWindowLayers)));
  }
  if (c.attentionScale)
    a.push_back(f64("attention_scale", c.attentionScale));
  // Only MoE models carry the MoE keys (python/mapp/config.py).
  if (c.numMoeExperts > 0) {
    a.push_back(i64("num_moe_experts", c.numMoeExperts));
    a.push_back(i64("moe_router_topk", c.moeRouterTopk));
    a.push_back(i64("moe_ffn_hidden_size", c.moeFfnHiddenSize));
    a.push_back(f64("moe_aux_loss_coeff", c.moeAuxLossCoeff));
    a.push_back(f64("moe_z_loss_coeff", c.moeZLossCoeff));
    if (c.moeCapacityFactor)
      a.push_back(f64("moe_capacity_factor", *c.moeCapacityFactor));
    a.push_back(b.getNamedAttr("moe_layer_freq",
                               b.getDenseI64ArrayAttr(c.moeLayerFreq)));
  }
  return b.getDictionaryAttr(a);
}

OwningOpRef<ModuleOp> GraphBuilder::build() {
  const int64_t B = c.microBatchSize, T = c.seqLength, H = c.hiddenSize,
                V = c.vocabSize, F = c.ffnHiddenSize;
  const bool learned = !c.rope();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  (*module)->setAttr("mapp.model", modelAttrs());
  b.setInsertionPointToEnd(module->getBody());

  // Parameters in state_dict order (docs/models.md).
  declare("wte.weight", {V, H});
  if (learned)
    declare("wpe.weight", {T, H});
  const int64_t QW = c.numHeads * c.headDim();
  const int64_t KV = c.numQueryGroups * c.headDim();
  for (int64_t l = 0; l < c.numLayers; ++l) {
    std::string p = "layers." + std::to_string(l);
    auto decl = [&](const std::string &n, ArrayRef<int64_t> s, bool hasBias) {
      declare(p + n + ".weight", s);
      if (hasBias)
        declare(p + n + ".bias", {s.front()});
    };
    declareNorm(p + ".ln1");
    if (c.isGQA()) {
      decl(".attn.q", {QW, H}, c.qkvBias);
      decl(".attn.k", {KV, H}, c.qkvBias);
      decl(".attn.v", {KV, H}, c.qkvBias);
    } else {
      decl(".attn.qkv", {3 * QW, H}, c.qkvBias);
    }
    decl(".attn.proj", {H, QW}, c.linearBias);
    if (c.postNorms)
      declareNorm(p + ".ln_post_attn");
    declareNorm(p + ".ln2");
    if (c.isMoeLayer(l)) {
      declareMoe(p);
    } else if (c.mlpType == "gelu") {
      decl(".mlp.fc1", {F, H}, c.linearBias);
      decl(".mlp.fc2", {H, F}, c.linearBias);
    } else {
      decl(".mlp.gate", {F, H}, c.linearBias);
      decl(".mlp.up", {F, H}, c.linearBias);
      decl(".mlp.down", {H, F}, c.linearBias);
    }
    if (c.postNorms)
      declareNorm(p + ".ln_post_mlp");
  }
  declareNorm("ln_f");
  if (!c.tieEmbeddings)
    declare("lm_head.weight", {V, H});

  Type i32 = b.getI32Type();
  auto fnType = b.getFunctionType({tensor({B, T}, i32), tensor({B, T}, i32)},
                                  {tensor({})});
  auto fn = b.create<func::FuncOp>(loc, "forward", fnType);
  Block *body = fn.addEntryBlock();
  b.setInsertionPointToEnd(body);
  Value tokens = body->getArgument(0), targets = body->getArgument(1);

  Value x = op<EmbeddingOp>("wte", {ref("wte.weight"), tokens}, {B, T, H});
  if (learned)
    x = op<AddOp>("add", {x, ref("wpe.weight")}, {B, T, H});
  if (c.embeddingMultiplier != 1.0)
    x = op<ScaleOp>("embed_scale", {x}, {B, T, H},
                    {f64("factor", c.embeddingMultiplier)});
  x = maybeDropout(x, "dropout");
  for (int64_t l = 0; l < c.numLayers; ++l)
    x = layer(x, l);
  x = norm(x, "ln_f");
  Value head = ref(c.tieEmbeddings ? "wte.weight" : "lm_head.weight");
  Value logits = op<LinearOp>("lm_head", {x, head}, {B, T, V});
  if (c.logitSoftcap)
    // Named "logits": generation reads the capped values (Generate.cpp).
    logits = op<SoftcapOp>("logits", {logits}, {B, T, V},
                           {f64("cap", c.logitSoftcap)});
  Value loss = op<CrossEntropyOp>("cross_entropy", {logits, targets}, {},
                                  {i64("ignore_index", -100)});
  // The MoE auxiliary losses, added one by one as the reference does; the
  // root's "add" is taken by the position embedding in gpt models.
  int64_t adds = learned ? 1 : 0;
  for (Value aux : auxLosses) {
    std::string name = adds ? "add_" + std::to_string(adds) : "add";
    ++adds;
    loss = op<AddOp>(name, {loss, aux}, {});
  }
  b.create<func::ReturnOp>(loc, loss);
  return module;
}

/// Where `"key"` first appears in the text, for the diagnostic.
Location keyLocation(MLIRContext *ctx, StringRef text, StringRef bufferName,
                     StringRef key) {
  size_t pos = key.empty() ? StringRef::npos : text.find(("\"" + key + "\"").str());
  if (pos == StringRef::npos)
    return FileLineColLoc::get(ctx, bufferName, 1, 1);
  StringRef before = text.take_front(pos);
  unsigned line = 1 + before.count('\n');
  unsigned col = 1 + pos - (before.rfind('\n') == StringRef::npos
                                ? 0
                                : before.rfind('\n') + 1);
  return FileLineColLoc::get(ctx, bufferName, line, col);
}

} // namespace

OwningOpRef<ModuleOp> mapp::buildGPTModule(const GPTConfig &config,
                                           MLIRContext *ctx) {
  ctx->loadDialect<MappDialect, func::FuncDialect>();
  return GraphBuilder(config, ctx).build();
}

OwningOpRef<ModuleOp> mapp::importGPTConfig(StringRef json, MLIRContext *ctx,
                                            StringRef bufferName,
                                            const GPTImportOptions &opts) {
  GPTConfig config;
  GPTConfigError err;
  ConfigTranslation tr;
  if (!parseGPTConfig(json, config, err, opts, &tr)) {
    emitError(keyLocation(ctx, json, bufferName, err.key)) << err.message;
    return nullptr;
  }
  if (!tr.ignored.empty()) {
    std::sort(tr.ignored.begin(), tr.ignored.end());
    tr.ignored.erase(std::unique(tr.ignored.begin(), tr.ignored.end()),
                     tr.ignored.end());
    llvm::errs() << "mapp-translate: " << tr.format
                 << " config: ignored keys (no effect on the training graph): "
                 << llvm::join(tr.ignored, ", ") << "\n";
  }
  OwningOpRef<ModuleOp> module = buildGPTModule(config, ctx);
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

void mapp::registerGPTImportTranslation() {
  // Function statics: registered with the tool that calls this, before
  // mlirTranslateMain parses the command line.
  static llvm::cl::opt<int64_t> seqLength(
      "seq-length",
      llvm::cl::desc("with --import-gpt-config: training sequence length "
                     "(default: the config's seq_length or maximum positions)"),
      llvm::cl::init(0));
  static llvm::cl::opt<int64_t> microBatch(
      "micro-batch-size",
      llvm::cl::desc("with --import-gpt-config: micro-batch size (default: "
                     "the config's micro_batch_size, else 1)"),
      llvm::cl::init(0));
  static llvm::cl::opt<int64_t> vocabDivisor(
      "make-vocab-size-divisible-by",
      llvm::cl::desc("with --import-gpt-config: pad vocab_size to a multiple "
                     "(Megatron pads to 128·tp so the vocab splits over tp)"),
      llvm::cl::init(0));
  static llvm::cl::opt<bool> noDropout(
      "no-dropout",
      llvm::cl::desc("with --import-gpt-config: train without dropout "
                     "(the config's dropout keys are reported as ignored)"),
      llvm::cl::init(false));
  static TranslateToMLIRRegistration reg(
      "import-gpt-config",
      "build the forward graph of the reference GPT from a config JSON",
      [](llvm::SourceMgr &sourceMgr,
         MLIRContext *ctx) -> OwningOpRef<Operation *> {
        if (failed(checkInputNesting(sourceMgr, ctx)))
          return nullptr;
        const llvm::MemoryBuffer *buf =
            sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
        GPTImportOptions opts;
        opts.noDropout = noDropout;
        for (auto [opt, dst, name] :
             {std::tuple{&seqLength, &opts.seqLength, "--seq-length"},
              std::tuple{&microBatch, &opts.microBatchSize, "--micro-batch-size"},
              std::tuple{&vocabDivisor, &opts.vocabDivisor,
                         "--make-vocab-size-divisible-by"}}) {
          if (opt->getNumOccurrences() == 0)
            continue;
          if (*opt <= 0) {
            emitError(UnknownLoc::get(ctx))
                << name << " must be positive, got " << opt->getValue();
            return nullptr;
          }
          *dst = opt->getValue();
        }
        return importGPTConfig(buf->getBuffer(), ctx, buf->getBufferIdentifier(),
                               opts);
      },
      [](DialectRegistry &registry) {
        registry.insert<MappDialect, func::FuncDialect>();
      });
}
