// --mapp-mixed-precision: the precision policy and loss scaling as IR.
//
// The loss-gradient seed (the mapp.fill --mapp-autodiff marks with
// mapp.loss_seed) gets loss_scale = MODE: the runtime multiplies its value
// by the current scale. Every optimizer update gets loss_scale = MODE and
// the scaling parameters: it divides the gradients (and its clip norm) by
// the scale, and the executor skips a dynamic step whose scaled gradient
// norm overflowed, then backs the scale off (docs/checkpoints.md,
// "Loss scaling"). The module records the policy in mapp.precision.
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/ADT/StringMap.h"

#include <cfloat>

namespace mapp {
#define GEN_PASS_DEF_MAPPMIXEDPRECISION
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct MixedPrecisionPass
    : mapp::impl::MappMixedPrecisionBase<MixedPrecisionPass> {
  using Base::Base;

  /// "dynamic" | "static:S" | "none" -> mode and initial scale.
  LogicalResult parseLossScale(ModuleOp module, std::string &mode,
                               double &init) {
    StringRef s = lossScale;
    if (s == "none" || s == "dynamic") {
      mode = s.str();
      init = initialScale;
      return success();
    }
    if (s.consume_front("static:") && !s.getAsDouble(init) && init > 0) {
      mode = "static";
      return success();
    }
    return module.emitError("mapp-mixed-precision: loss-scale must be "
                            "dynamic, static:S (S > 0) or none, got '")
           << lossScale << "'";
  }

  /// compute=fp8: the block linears and their gradient GEMMs in fp8, one
  /// meta parameter each, the delayed-scaling update in @optimizer_step.
  LogicalResult applyFp8(ModuleOp module) {
    MLIRContext *ctx = &getContext();
    OpBuilder b(ctx);
    if (module->hasAttr("mapp.fp8"))
      return module.emitError("mapp-mixed-precision: compute=fp8 was applied "
                              "already (the module has mapp.fp8)");
    const char *gradFmt = fp8Format == "hybrid" ? "e5m2" : "e4m3";
    auto metaType = RankedTensorType::get({3 * (1 + fp8History)},
                                          Float32Type::get(ctx));
    // Rows of the meta: 0 = x, 1 = w, 2 = dy.
    llvm::StringMap<std::string> metaOf; // layer name -> meta symbol
    SmallVector<LinearOp> linears;
    const LayerNames names = LayerNames::of(module);
    module.walk([&](LinearOp op) {
      if (names.layerOf(op))
        linears.push_back(op);
    });
    if (linears.empty())
      return module.emitError(
                 "mapp-mixed-precision: compute=fp8 found no linear layer "
                 "inside a transformer block (mapp.name \"")
             << names.prefix() << "N.*\") to run in fp8";
    auto metaRef = [&](Operation *at, StringRef sym) {
      b.setInsertionPoint(at);
      return b.create<ParamRefOp>(at->getLoc(), metaType,
                                  FlatSymbolRefAttr::get(ctx, sym));
    };
    auto setCommon = [&](Operation *from, Operation *to) {
      for (NamedAttribute na : from->getAttrs())
        if (na.getName().getValue().starts_with("mapp."))
          to->setAttr(na.getName(), na.getValue());
    };
    for (LinearOp op : linears) {
      StringRef name = op->getAttrOfType<StringAttr>("mapp.name").getValue();
      if (!op.getW().getDefiningOp<ParamRefOp>())
        return op.emitError("mapp-mixed-precision: fp8 linear '")
               << name << "' must read its weight through mapp.param_ref";
      std::string sym = (name + ".fp8_meta").str();
      if (!metaOf.count(name)) {
        if (module.lookupSymbol(sym))
          return op.emitError("mapp-mixed-precision: symbol @")
                 << sym << " exists already (compute=fp8 applied twice?)";
        metaOf[name] = sym;
        b.setInsertionPointToStart(module.getBody());
        for (Operation &o : module.getBody()->getOperations())
          if (isa<ParamOp>(o))
            b.setInsertionPointAfter(&o);
        b.create<ParamOp>(
            op.getLoc(), TypeRange{}, ValueRange{},
            ArrayRef<NamedAttribute>{
                b.getNamedAttr("sym_name", b.getStringAttr(sym)),
                b.getNamedAttr("type", TypeAttr::get(metaType)),
                b.getNamedAttr("init", b.getStringAttr("fp8_meta"))});
      }
      ParamRefOp meta = metaRef(op, sym);
      b.setInsertionPoint(op);
      auto f = b.create<Fp8LinearOp>(
          op.getLoc(), op.getType(), op.getX(), op.getW(), op.getBias(), meta,
          b.getStringAttr("e4m3"), b.getStringAttr("e4m3"),
          b.getI64IntegerAttr(0), b.getI64IntegerAttr(1),
          /*fast_accum=*/b.getUnitAttr());
      setCommon(op, f);
      op.replaceAllUsesWith(f.getResult());
      op.erase();
    }
    // The gradient GEMMs autodiff named "<layer>.grad": the input gradient
    // dy·w (b is the weight) and the weight gradient dyᵀ·x (mapp.wgrad).
    SmallVector<MatmulOp> grads;
    module.walk([&](MatmulOp op) {
      auto name = op->getAttrOfType<StringAttr>("mapp.name");
      if (name && name.getValue().ends_with(".grad") &&
          metaOf.count(name.getValue().drop_back(5)))
        grads.push_back(op);
    });
    for (MatmulOp op : grads) {
      StringRef layer =
          op->getAttrOfType<StringAttr>("mapp.name").getValue().drop_back(5);
      bool wgrad = op->hasAttr("mapp.wgrad");
      if (op.getTransposeB() || wgrad != op.getTransposeA() ||
          (!wgrad && !op.getB().getDefiningOp<ParamRefOp>()))
        return op.emitError("mapp-mixed-precision: gradient GEMM of fp8 "
                            "layer '")
               << layer << "' is neither dy·w nor dyᵀ·x";
      ParamRefOp meta = metaRef(op, metaOf[layer]);
      b.setInsertionPoint(op);
      auto f = b.create<Fp8MatmulOp>(
          op.getLoc(), op.getType(), op.getA(), op.getB(), meta,
          wgrad ? b.getUnitAttr() : UnitAttr(), b.getStringAttr(gradFmt),
          b.getStringAttr("e4m3"), b.getI64IntegerAttr(2),
          b.getI64IntegerAttr(wgrad ? 0 : 1), /*fast_accum=*/UnitAttr());
      setCommon(op, f);
      op.replaceAllUsesWith(f.getResult());
      op.erase();
    }
    // The delayed-scaling update, once per step after the last backward.
    int optimizers = 0;
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto phase = fn->getAttrOfType<StringAttr>("mapp.phase");
      if (!phase || phase.getValue() != "optimizer")
        continue;
      ++optimizers;
      b.setInsertionPoint(fn.getBody().front().getTerminator());
      SmallVector<StringRef> names;
      for (auto &e : metaOf)
        names.push_back(e.getKey());
      llvm::sort(names);
      for (StringRef n : names)
        b.create<Fp8UpdateOp>(
            fn.getLoc(), FlatSymbolRefAttr::get(ctx, metaOf[n]),
            b.getStringAttr("e4m3"), b.getStringAttr("e4m3"),
            b.getStringAttr(gradFmt), b.getI64IntegerAttr(fp8History),
            b.getI64IntegerAttr(fp8Margin));
    }
    if (!optimizers)
      return module.emitError("mapp-mixed-precision: compute=fp8 needs "
                              "@optimizer_step for the scale update; run "
                              "--mapp-optimizer first");
    module->setAttr(
        "mapp.fp8",
        DictionaryAttr::get(
            ctx, {NamedAttribute(StringAttr::get(ctx, "format"),
                                 StringAttr::get(ctx, fp8Format)),
                  NamedAttribute(StringAttr::get(ctx, "history"),
                                 b.getI64IntegerAttr(fp8History)),
                  NamedAttribute(StringAttr::get(ctx, "margin"),
                                 b.getI64IntegerAttr(fp8Margin)),
                  NamedAttribute(StringAttr::get(ctx, "layers"),
                                 b.getI64IntegerAttr(metaOf.size()))}));
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fail = [&](const Twine &msg) {
      module.emitError("mapp-mixed-precision: ") << msg;
      signalPassFailure();
    };
    double limit;
    if (compute == "f32" || compute == "bf16")
      limit = FLT_MAX; // bf16 has fp32's exponent range
    else if (compute == "fp16")
      limit = 65504.0;
    else if (compute == "fp8")
      limit = FLT_MAX; // outside the fp8 GEMMs the step runs as for bf16
    else
      return fail("compute must be f32, bf16, fp16 or fp8, got '" + compute +
                  "'");
    if (master != "f32")
      return fail("master must be f32 (optimizer state and master weights "
                  "are fp32), got '" + master + "'");
    std::string mode;
    double init = 0;
    if (failed(parseLossScale(module, mode, init)))
      return signalPassFailure();
    if (compute == "fp8") {
      if (fp8Format != "hybrid" && fp8Format != "e4m3")
        return fail("fp8-format must be hybrid (E4M3 forward, E5M2 "
                    "gradients) or e4m3, got '" + fp8Format + "'");
      if (fp8History < 1)
        return fail("fp8-history must be >= 1 (steps of amax history), got " +
                    Twine(fp8History));
      if (fp8Margin < 0 || fp8Margin > 64)
        return fail("fp8-margin must be in [0, 64], got " + Twine(fp8Margin));
      if (mode != "none")
        return fail("compute=fp8 scales every fp8 tensor itself (delayed "
                    "scaling); loss-scale must be none, got '" + lossScale +
                    "'");
    } else if (fp8Format != "hybrid" || fp8History != 16 || fp8Margin != 0) {
      return fail("fp8-format, fp8-history and fp8-margin need compute=fp8");
    }
    if (mode == "dynamic" &&
        (!(initialScale > 0) || !(growthFactor >= 1) || !(backoffFactor > 0) ||
         !(backoffFactor < 1) || growthInterval < 1 || !(minScale > 0)))
      return fail("dynamic loss scaling needs initial-scale > 0, "
                  "growth-factor >= 1, backoff-factor in (0, 1), "
                  "growth-interval >= 1 and min-scale > 0");

    MLIRContext *ctx = &getContext();
    module->setAttr(
        "mapp.precision",
        DictionaryAttr::get(
            ctx, {NamedAttribute(StringAttr::get(ctx, "compute"),
                                 StringAttr::get(ctx, compute)),
                  NamedAttribute(StringAttr::get(ctx, "master"),
                                 StringAttr::get(ctx, master)),
                  NamedAttribute(StringAttr::get(ctx, "loss_scale"),
                                 StringAttr::get(ctx, lossScale))}));
    if (compute == "fp8" && failed(applyFp8(module)))
      return signalPassFailure();
    if (mode == "none")
      return;

    Builder b(ctx);
    int seeds = 0, updates = 0;
    module.walk([&](FillOp op) {
      if (op->hasAttr("mapp.loss_seed")) {
        op->setAttr("loss_scale", b.getStringAttr(mode));
        ++seeds;
      }
    });
    auto mark = [&](Operation *op) {
      op->setAttr("loss_scale", b.getStringAttr(mode));
      op->setAttr("loss_scale_init", b.getF64FloatAttr(init));
      op->setAttr("loss_scale_limit", b.getF64FloatAttr(limit));
      if (mode == "dynamic") {
        op->setAttr("loss_scale_growth", b.getF64FloatAttr(growthFactor));
        op->setAttr("loss_scale_backoff", b.getF64FloatAttr(backoffFactor));
        op->setAttr("loss_scale_growth_interval",
                    b.getI64IntegerAttr(growthInterval));
        op->setAttr("loss_scale_min", b.getF64FloatAttr(minScale));
      }
      ++updates;
    };
    module.walk([&](AdamWOp op) { mark(op); });
    module.walk([&](SGDOp op) { mark(op); });
    if (!seeds)
      return fail("no loss-gradient seed (mapp.fill with mapp.loss_seed); "
                  "run --mapp-autodiff first");
    if (!updates)
      return fail("no optimizer update to unscale; run --mapp-optimizer first");
  }
};

} // namespace
