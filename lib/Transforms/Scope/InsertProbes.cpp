// --mapp-insert-probes: MegaScope probes and perturbations from a spec.
//
// Names are resolved against what the module actually computes: forward
// values by `mapp.name`, module paths (the last value under the path is the
// module's output, as a PyTorch forward hook sees it), aliases (`logits`,
// `layers.N.resid`, `layers.N.attn.probs`), gradients (`grad:` + a value
// or parameter name, from autodiff's `mapp.grad_of` tags) and parameters.
#include "ProbeSpec.h"
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"

#include <deque>
#include <map>

namespace mapp {
#define GEN_PASS_DEF_MAPPINSERTPROBES
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;
using namespace mapp::scope;

namespace {

enum class TargetKind { Value, Param, AttnProbs };

/// Dotted-name globs: `*` matches within one path component (`layers.*` is
/// every layer's output), `**` across components, `?` one character.
bool globMatch(StringRef pat, StringRef s) {
  if (pat.empty())
    return s.empty();
  if (pat.starts_with("**")) {
    for (size_t i = 0; i <= s.size(); ++i)
      if (globMatch(pat.drop_front(2), s.drop_front(i)))
        return true;
    return false;
  }
  if (pat.front() == '*') {
    for (size_t i = 0; i <= s.size(); ++i) {
      if (globMatch(pat.drop_front(), s.drop_front(i)))
        return true;
      if (i < s.size() && s[i] == '.')
        break;
    }
    return false;
  }
  if (s.empty())
    return false;
  if (pat.front() != '?' && pat.front() != s.front())
    return false;
  return globMatch(pat.drop_front(), s.drop_front());
}

/// One resolvable name: the values it stands for (a parameter read in
/// several places stands for several values).
struct Target {
  TargetKind kind = TargetKind::Value;
  SmallVector<Value, 1> values;
  AttentionOp attention; // AttnProbs
  bool layerOutput = false;
};

/// Names in insertion order with O(1) lookup; entries are never removed, so
/// references stay valid (std::deque).
class TargetMap {
public:
  Target &operator[](StringRef k) {
    auto it = index.find(k);
    if (it != index.end())
      return items[it->second].second;
    index[k] = items.size();
    items.emplace_back(k.str(), Target());
    return items.back().second;
  }
  Target *find(StringRef k) {
    auto it = index.find(k);
    return it == index.end() ? nullptr : &items[it->second].second;
  }
  bool count(StringRef k) const { return index.count(k); }
  auto begin() { return items.begin(); }
  auto end() { return items.end(); }

private:
  std::deque<std::pair<std::string, Target>> items;
  llvm::StringMap<size_t> index;
};

class NameTable {
public:
  void build(ModuleOp module) {
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto phase = fn->getAttrOfType<StringAttr>("mapp.phase");
      bool forward = phase ? phase.getValue() == "forward"
                           : fn.getSymName() == "forward";
      bool backward = phase && phase.getValue().starts_with("backward");
      if (forward)
        addForward(fn);
      else if (backward)
        addBackward(fn);
    }
    addModules(LayerNames::of(module));
  }

  Target *lookup(StringRef name) {
    return targets.find(name);
  }
  /// Names matched by `pattern` in table order. Parameters match only when
  /// `params` is set (storage perturbations), so `layers.*.**` means values.
  /// Gradients live under `grad:`: only a pattern naming that prefix
  /// matches them (`**` is every forward value, `grad:**` every gradient).
  SmallVector<StringRef> match(StringRef pattern, bool params) {
    SmallVector<StringRef> out;
    bool grads = pattern.starts_with("grad:");
    for (auto &kv : targets)
      if ((kv.second.kind == TargetKind::Param) == params &&
          StringRef(kv.first).starts_with("grad:") == grads &&
          globMatch(pattern, kv.first))
        out.push_back(kv.first);
    return out;
  }
  /// Up to three names closest to `name` by edit distance.
  SmallVector<StringRef> nearest(StringRef name) {
    SmallVector<std::pair<unsigned, StringRef>> scored;
    for (auto &kv : targets)
      scored.push_back({name.edit_distance(kv.first, true, 1000), kv.first});
    llvm::stable_sort(scored, [](auto &a, auto &b) { return a.first < b.first; });
    SmallVector<StringRef> out;
    for (auto &[d, n] : scored)
      if (out.size() < 3)
        out.push_back(n);
    return out;
  }

private:
  void add(StringRef name, Value v, TargetKind k = TargetKind::Value) {
    Target &t = targets[name];
    t.kind = k;
    if (!llvm::is_contained(t.values, v))
      t.values.push_back(v);
  }
  void addForward(func::FuncOp fn) {
    fn.walk([&](Operation *op) {
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        add(ref.getParam(), ref.getResult(), TargetKind::Param);
        return;
      }
      auto name = op->getAttrOfType<StringAttr>("mapp.name");
      if (!name || op->getNumResults() != 1)
        return;
      // A perturbation re-defines its input's name: probes see its output.
      targets[name.getValue()] = Target();
      add(name.getValue(), op->getResult(0));
      forwardOrder.push_back(name.getValue().str());
      if (auto att = dyn_cast<AttentionOp>(op)) {
        StringRef n = name.getValue();
        if (n.consume_back(".attention")) {
          Target &t = targets[(n + ".probs").str()];
          t.kind = TargetKind::AttnProbs;
          t.attention = att;
        }
      }
    });
  }
  void addBackward(func::FuncOp fn) {
    fn.walk([&](Operation *op) {
      if (auto acc = dyn_cast<GradAccumulateOp>(op))
        add(("grad:" + acc.getParam()).str(), acc.getGrad());
      auto names = op->getAttrOfType<ArrayAttr>("mapp.grad_of");
      if (!names)
        return;
      for (auto [i, a] : llvm::enumerate(names))
        if (auto s = dyn_cast<StringAttr>(a); s && !s.empty() &&
                                              i < op->getNumResults())
          add(("grad:" + s.getValue()).str(), op->getResult(i));
    });
  }
  /// Module paths and aliases, resolved to the last forward value under them.
  void addModules(const LayerNames &names) {
    // Sorted, so probe ids do not depend on hash order.
    std::map<std::string, std::string> last;
    for (const std::string &n : forwardOrder) {
      StringRef s = n;
      for (size_t dot = s.find('.'); dot != StringRef::npos;
           dot = s.find('.', dot + 1))
        last[s.substr(0, dot).str()] = n;
    }
    auto alias = [&](StringRef name, StringRef of, bool layer) {
      if (targets.count(name) || !targets.count(of))
        return;
      Target t = targets[of];
      t.layerOutput = layer;
      targets[name] = t;
      if (Target *g = lookup(("grad:" + of).str()))
        targets[("grad:" + name).str()] = *g;
    };
    for (auto &kv : last) {
      StringRef path = kv.first;
      std::optional<unsigned> layer = names.layerOf(path);
      bool isLayer = layer && names.rest(path).empty();
      alias(path, kv.second, isLayer);
      if (!isLayer)
        continue;
      alias((path + ".resid").str(), kv.second, true);
      // A model's own block names ("transformer.h.3") answer to the
      // importers' too, so one probe spec serves every model.
      std::string canonical = "layers." + std::to_string(*layer);
      alias(canonical, kv.second, true);
      alias(canonical + ".resid", kv.second, true);
    }
    if (targets.count("lm_head"))
      alias("logits", "lm_head", false);
  }

  TargetMap targets;
  std::vector<std::string> forwardOrder;
};

bool isGlob(StringRef s) { return s.find_first_of("*?") != StringRef::npos; }

struct InsertProbesPass
    : mapp::impl::MappInsertProbesBase<InsertProbesPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (spec.empty()) {
      mlir::emitError(module.getLoc(),
                      "mapp-insert-probes: give spec=FILE (JSON or YAML)");
      return signalPassFailure();
    }
    llvm::Expected<ProbeSpec> parsed = loadProbeSpec(spec);
    if (!parsed) {
      mlir::emitError(module.getLoc(), "mapp-insert-probes: ")
          << llvm::toString(parsed.takeError());
      return signalPassFailure();
    }
    if (failed(run(module, *parsed)))
      signalPassFailure();
  }

  LogicalResult run(ModuleOp module, const ProbeSpec &s) {
    NameTable table;
    table.build(module);
    int64_t nextSwitch = 0;
    for (const PerturbEntry &p : s.perturbations)
      if (p.switchId)
        nextSwitch = std::max(nextSwitch, *p.switchId + 1);
    for (const PerturbEntry &p : s.perturbations) {
      SmallVector<Target *> ts;
      if (failed(resolve(module, table, p.name, p.pos, ts,
                         p.target == "storage")))
        return failure();
      int64_t sw = p.switchId ? *p.switchId : nextSwitch++;
      for (Target *t : ts)
        if (failed(insertPerturb(module, *t, p, sw)))
          return failure();
    }
    // Perturbations renamed values; probes resolve against the new graph.
    NameTable after;
    after.build(module);
    int64_t id = 0;
    for (const ProbeEntry &p : s.probes) {
      SmallVector<StringRef> names;
      if (failed(resolveNames(module, after, p.name, p.pos, names)))
        return failure();
      // A glob means "the matches this probe can record": statistics
      // over `**` skip the attention probabilities (reduce attn only)
      // and an attn probe over `layers.*.attn.*` skips the plain values.
      if (isGlob(p.name)) {
        bool wantsAttn = llvm::is_contained(p.reduce, "attn");
        llvm::erase_if(names, [&](StringRef n) {
          return (after.lookup(n)->kind == TargetKind::AttnProbs) != wantsAttn;
        });
        if (names.empty())
          return mlir::emitError(module.getLoc())
                 << p.pos.str() << ": '" << p.name << "' matches no value that "
                 << (wantsAttn ? "reduce \"attn\" can record (the "
                                 "layers.N.attn.probs targets)"
                               : "these reductions can record (only "
                                 "attention probabilities match)");
      }
      for (StringRef n : names)
        if (failed(insertProbe(module, *after.lookup(n), n, p, id)))
          return failure();
    }
    return success();
  }

  LogicalResult resolveNames(ModuleOp module, NameTable &t, StringRef name,
                             const SpecPos &pos,
                             SmallVectorImpl<StringRef> &out,
                             bool params = false) {
    if (isGlob(name))
      out = t.match(name, params);
    else if (t.lookup(name))
      out.push_back(name);
    if (!out.empty())
      return success();
    InFlightDiagnostic d = mlir::emitError(module.getLoc())
                           << pos.str() << ": no value is named '" << name
                           << "'";
    SmallVector<StringRef> near = t.nearest(name);
    if (!near.empty()) {
      d << "; did you mean ";
      llvm::interleave(
          near, d, [&](StringRef n) { d << "'" << n << "'"; }, ", ");
      d << "?";
    }
    return failure();
  }

  LogicalResult resolve(ModuleOp module, NameTable &t, StringRef name,
                        const SpecPos &pos, SmallVectorImpl<Target *> &out,
                        bool params) {
    SmallVector<StringRef> names;
    if (failed(resolveNames(module, t, name, pos, names, params)))
      return failure();
    for (StringRef n : names)
      out.push_back(t.lookup(n));
    return success();
  }

  /// Absolute token positions for a value whose dim 1 is the sequence.
  LogicalResult tokenPositions(ModuleOp module, const ProbeEntry &p,
                               RankedTensorType ty, StringRef name,
                               SmallVectorImpl<int64_t> &out) {
    if (!p.tokens)
      return success();
    if (ty.getRank() < 2)
      return mlir::emitError(module.getLoc())
             << p.pos.str() << ": '" << name
             << "' has no token dimension (type " << ty << ")";
    int64_t T = ty.getShape()[1];
    for (const TokenRange &r : *p.tokens) {
      int64_t b = r.begin < 0 ? r.begin + T : r.begin;
      int64_t e = r.single ? b + 1 : (r.end <= 0 ? r.end + T : r.end);
      if (b < 0 || e > T || b >= e)
        return mlir::emitError(module.getLoc())
               << p.pos.str() << ": token selection "
               << (r.single ? std::to_string(r.begin)
                            : std::to_string(r.begin) + ":" +
                                  std::to_string(r.end))
               << " is outside positions 0.." << T - 1 << " of '" << name
               << "'";
      for (int64_t i = b; i < e; ++i)
        if (!llvm::is_contained(out, i))
          out.push_back(i);
    }
    return success();
  }

  LogicalResult insertProbe(ModuleOp module, Target &t, StringRef name,
                            const ProbeEntry &p, int64_t &id) {
    MLIRContext *ctx = &getContext();
    bool wantsAttn = llvm::is_contained(p.reduce, "attn");
    if (t.kind == TargetKind::AttnProbs && (!wantsAttn || p.reduce.size() != 1))
      return mlir::emitError(module.getLoc()) << p.pos.str() << ": '" << name
                                << "' (attention probabilities) records "
                                   "reduce [\"attn\"] only";
    if (t.kind == TargetKind::AttnProbs) {
      AttentionOp att = t.attention;
      OpBuilder b(att->getNextNode());
      SmallVector<int64_t> toks;
      auto ty = cast<RankedTensorType>(att.getQ().getType());
      if (failed(tokenPositions(module, p, ty, name, toks)))
        return failure();
      auto probe = b.create<ProbeOp>(
          att.getLoc(), ValueRange{att.getQ(), att.getK()}, id++, name, "attn",
          p.every);
      for (NamedAttribute a : att->getAttrs())
        if (!a.getName().getValue().starts_with("mapp."))
          probe->setAttr(a.getName(), a.getValue());
      if (!toks.empty())
        probe->setAttr("tokens", DenseI64ArrayAttr::get(ctx, toks));
      return success();
    }
    if (wantsAttn)
      return mlir::emitError(module.getLoc()) << p.pos.str() << ": 'attn' needs a "
                                   "layers.N.attn.probs target, not '"
                                << name << "'";
    if (llvm::is_contained(p.reduce, "lens"))
      return insertLens(module, t, name, p, id);
    std::string reduce = llvm::join(p.reduce, ",");
    for (Value v : t.values) {
      auto ty = cast<RankedTensorType>(v.getType());
      if (!ty.getElementType().isF32())
        return mlir::emitError(module.getLoc())
               << p.pos.str() << ": '" << name << "' is not an f32 tensor";
      SmallVector<int64_t> toks;
      if (failed(tokenPositions(module, p, ty, name, toks)))
        return failure();
      OpBuilder b(ctx);
      if (Operation *def = v.getDefiningOp())
        b.setInsertionPointAfter(def);
      else
        b.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
      auto probe = b.create<ProbeOp>(v.getLoc(), ValueRange{v}, id++, name,
                                     reduce, p.every);
      auto setI = [&](StringRef k, int64_t x) {
        probe->setAttr(k, b.getI64IntegerAttr(x));
      };
      auto setF = [&](StringRef k, double x) {
        probe->setAttr(k, b.getF64FloatAttr(x));
      };
      if (llvm::is_contained(p.reduce, "hist")) {
        setI("bins", p.bins);
        setF("lo", p.lo);
        setF("hi", p.hi);
      }
      if (llvm::is_contained(p.reduce, "topk"))
        setI("k", p.k);
      if (llvm::is_contained(p.reduce, "sketch")) {
        setI("dim", p.sketchDim);
        setI("seed", p.seed);
      }
      if (llvm::is_contained(p.reduce, "sparsity"))
        setF("eps", p.eps);
      if (llvm::is_contained(p.reduce, "raw"))
        setI("cap", p.rawCap);
      if (!toks.empty())
        probe->setAttr("tokens", DenseI64ArrayAttr::get(ctx, toks));
      if (failed(mlir::verify(probe)))
        return failure();
    }
    return success();
  }

  /// Logit lens: the probe reads the residual stream and the parameters of
  /// the final norm and of the unembedding, as `lm_head` reads them. Fresh
  /// param_refs next to the probe keep the residual's lifetime short.
  LogicalResult insertLens(ModuleOp module, Target &t, StringRef name,
                           const ProbeEntry &p, int64_t &id) {
    auto err = [&]() {
      return mlir::emitError(module.getLoc()) << p.pos.str() << ": ";
    };
    if (p.reduce.size() != 1)
      return err() << "'lens' is the only reduction of its probe";
    LinearOp head;
    module.walk([&](LinearOp op) {
      auto n = op->getAttrOfType<StringAttr>("mapp.name");
      if (!head && n && n.getValue() == "lm_head")
        head = op;
    });
    Operation *norm = head ? head.getX().getDefiningOp() : nullptr;
    SmallVector<Value> weights;
    StringRef normKind;
    double eps = 0;
    if (auto ln = dyn_cast_or_null<LayerNormOp>(norm)) {
      weights = {ln.getGamma(), ln.getBeta()};
      normKind = "layer_norm";
      eps = ln.getEps().convertToDouble();
    } else if (auto rn = dyn_cast_or_null<RMSNormOp>(norm)) {
      weights = {rn.getGamma()};
      normKind = "rms_norm";
      eps = rn.getEps().convertToDouble();
    } else {
      return err() << "'lens' needs an 'lm_head' linear (no bias) fed by the "
                      "final layer_norm or rms_norm";
    }
    if (head.getBias())
      return err() << "'lens' needs an 'lm_head' without bias";
    weights.push_back(head.getW());
    for (Value w : weights)
      if (!w.getDefiningOp<ParamRefOp>())
        return err() << "'lens' reads the final norm and 'lm_head' weights "
                        "as parameters (an unsharded plan)";
    auto hidden = cast<RankedTensorType>(head.getW().getType()).getShape()[1];
    for (Value v : t.values) {
      auto ty = cast<RankedTensorType>(v.getType());
      if (!ty.getElementType().isF32() || ty.getRank() != 3 ||
          ty.getShape()[2] != hidden)
        return err() << "'lens' needs a residual stream [B,T," << hidden
                     << "] f32, '" << name << "' is " << ty;
      SmallVector<int64_t> toks;
      if (failed(tokenPositions(module, p, ty, name, toks)))
        return failure();
      OpBuilder b(&getContext());
      if (Operation *def = v.getDefiningOp())
        b.setInsertionPointAfter(def);
      else
        b.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
      SmallVector<Value> ins{v};
      for (Value w : weights)
        ins.push_back(b.clone(*w.getDefiningOp())->getResult(0));
      auto probe = b.create<ProbeOp>(v.getLoc(), ins, id++, name, "lens",
                                     p.every);
      probe->setAttr("k", b.getI64IntegerAttr(p.k));
      probe->setAttr("norm", b.getStringAttr(normKind));
      probe->setAttr("eps", b.getF64FloatAttr(eps));
      if (!toks.empty())
        probe->setAttr("tokens", DenseI64ArrayAttr::get(&getContext(), toks));
      if (failed(mlir::verify(probe)))
        return failure();
    }
    return success();
  }

  LogicalResult insertPerturb(ModuleOp module, Target &t, const PerturbEntry &p,
                              int64_t sw) {
    MLIRContext *ctx = &getContext();
    if (p.target == "storage" && t.kind != TargetKind::Param)
      return mlir::emitError(module.getLoc())
             << p.pos.str() << ": a storage perturbation needs a parameter "
             << "name (e.g. layers.0.mlp.fc1.weight), '" << p.name
             << "' is a computed value";
    if (p.target != "storage" && t.kind == TargetKind::Param)
      return mlir::emitError(module.getLoc())
             << p.pos.str() << ": '" << p.name
             << "' is a parameter; use \"target\": \"storage\"";
    if (p.target == "system" && !t.layerOutput)
      return mlir::emitError(module.getLoc())
             << p.pos.str() << ": a system perturbation sits between layers; "
             << "name a layer output (layers.N or layers.N.resid), not '"
             << p.name << "'";
    if (t.kind == TargetKind::AttnProbs)
      return mlir::emitError(module.getLoc()) << p.pos.str()
                                << ": attention probabilities are not "
                                   "materialized and cannot be perturbed";
    for (Value v : t.values) {
      auto ty = cast<RankedTensorType>(v.getType());
      SmallVector<int64_t> channels(p.channels.begin(), p.channels.end());
      if (!p.heads.empty()) {
        auto model = module->getAttrOfType<DictionaryAttr>("mapp.model");
        auto heads = model ? model.getAs<IntegerAttr>("num_attention_heads")
                           : IntegerAttr();
        int64_t h = ty.getRank() ? ty.getShape().back() : 0;
        if (!heads || heads.getInt() <= 0 || h % heads.getInt())
          return mlir::emitError(module.getLoc())
                 << p.pos.str() << ": head masks need mapp.model's "
                 << "num_attention_heads dividing the last dim of " << ty;
        int64_t d = h / heads.getInt();
        for (int64_t hd : p.heads) {
          if (hd >= heads.getInt())
            return mlir::emitError(module.getLoc()) << p.pos.str() << ": head " << hd
                                      << " >= num_attention_heads "
                                      << heads.getInt();
          for (int64_t c = hd * d; c < hd * d + d; ++c)
            channels.push_back(c);
        }
      }
      Operation *def = v.getDefiningOp();
      OpBuilder b(ctx);
      if (def)
        b.setInsertionPointAfter(def);
      else
        b.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
      auto op = b.create<PerturbOp>(
          v.getLoc(), ty, v, b.getI64IntegerAttr(sw),
          b.getStringAttr(p.kind), b.getStringAttr(p.name),
          b.getStringAttr(p.target), b.getF64FloatAttr(p.magnitude),
          b.getF64FloatAttr(p.p), b.getI64IntegerAttr(p.seed),
          b.getBoolAttr(p.enabled),
          channels.empty() ? DenseI64ArrayAttr()
                           : DenseI64ArrayAttr::get(ctx, channels));
      if (def)
        if (auto n = def->getAttrOfType<StringAttr>("mapp.name"))
          op->setAttr("mapp.name", n);
      v.replaceAllUsesExcept(op.getResult(), op);
      if (failed(mlir::verify(op)))
        return failure();
    }
    return success();
  }
};

} // namespace
