// --mapp-mixed-precision: the precision policy and loss scaling as IR.
//
// The loss-gradient seed (the mapp.fill --mapp-autodiff marks with
// mapp.loss_seed) gets loss_scale = MODE: the runtime multiplies its value
// by the current scale. Every optimizer update gets loss_scale = MODE and
// the scaling parameters: it divides the gradients (and its clip norm) by
// the scale, and the executor skips a dynamic step whose scaled gradient
// norm overflowed, then backs the scale off (docs/checkpoints.md,
// "Loss scaling"). The module records the policy in mapp.precision.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

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
      return fail("compute=fp8 is not supported yet (E4M3/E5M2 with delayed "
                  "scaling is planned separately)");
    else
      return fail("compute must be f32, bf16 or fp16, got '" + compute + "'");
    if (master != "f32")
      return fail("master must be f32 (optimizer state and master weights "
                  "are fp32), got '" + master + "'");
    std::string mode;
    double init = 0;
    if (failed(parseLossScale(module, mode, init)))
      return signalPassFailure();
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
