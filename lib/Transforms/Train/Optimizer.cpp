// --mapp-optimizer: @optimizer_step applying AdamW or SGD to every parameter.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cmath>
#include <sstream>

namespace mapp {
#define GEN_PASS_DEF_MAPPOPTIMIZER
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct OptimizerPass : mapp::impl::MappOptimizerBase<OptimizerPass> {
  using Base::Base;

  LogicalResult checkOptions(ModuleOp module) {
    auto fail = [&](const Twine &msg) {
      return module.emitError("mapp-optimizer: ") << msg;
    };
    if (optimizer != "adamw" && optimizer != "sgd")
      return fail("optimizer must be adamw or sgd, got '" + optimizer + "'");
    // Every number finite and in its range (lr=inf was accepted and trained
    // to NaN); negated comparisons so that NaN fails too.
    auto number = [](double v) { // "inf", "0.001"
      std::ostringstream os;
      os << v;
      return os.str();
    };
    auto notIn = [&](StringRef name, double v, StringRef range) {
      return fail(name + " must be " + range + ", got " + number(v));
    };
    for (auto [name, v] : {std::pair{"lr", lr.getValue()},
                           std::pair{"weight-decay", weightDecay.getValue()},
                           std::pair{"momentum", momentum.getValue()},
                           std::pair{"max-grad-norm", maxGradNorm.getValue()}})
      if (!(v >= 0) || !std::isfinite(v))
        return notIn(name, v, "finite and >= 0");
    for (auto [name, v] : {std::pair{"beta1", beta1.getValue()},
                           std::pair{"beta2", beta2.getValue()}})
      if (!(v >= 0 && v < 1))
        return notIn(name, v, "in [0, 1)");
    if (!(eps > 0) || !std::isfinite(eps))
      return notIn("eps", eps, "finite and > 0");
    if (!(minLr >= 0 && minLr <= lr))
      return notIn("min-lr", minLr, "within [0, lr]");
    if (schedule != "constant" && schedule != "cosine")
      return fail("lr-schedule must be constant or cosine, got '" +
                  schedule + "'");
    if (schedule == "cosine" && totalSteps <= warmup)
      return fail("cosine schedule needs total-steps > warmup");
    if (warmup < 0 || totalSteps < 0)
      return fail("warmup and total-steps must be >= 0");
    if (module.lookupSymbol("optimizer_step"))
      return fail("module already has an @optimizer_step");
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkOptions(module)))
      return signalPassFailure();

    // Only parameters that receive a gradient are updated.
    llvm::DenseSet<StringAttr> trained;
    module.walk([&](GradAccumulateOp op) {
      trained.insert(op.getParamAttr().getAttr());
    });
    SmallVector<ParamOp> params;
    for (auto p : module.getOps<ParamOp>())
      if (trained.contains(p.getSymNameAttr()))
        params.push_back(p);
    if (params.empty()) {
      module.emitError("mapp-optimizer: no parameter has a gradient; run "
                       "--mapp-autodiff first");
      return signalPassFailure();
    }

    MLIRContext *ctx = &getContext();
    OpBuilder b(module.getBody(), module.getBody()->end());
    Location loc = module.getLoc();
    auto fn = b.create<func::FuncOp>(loc, "optimizer_step",
                                     FunctionType::get(ctx, {}, {}));
    fn->setAttr("mapp.phase", StringAttr::get(ctx, "optimizer"));
    b.setInsertionPointToStart(fn.addEntryBlock());

    SmallVector<Value> grads;
    for (ParamOp p : params)
      grads.push_back(b.create<GradRefOp>(
          loc, p.getType(), FlatSymbolRefAttr::get(p.getSymNameAttr())));
    Value norm;
    if (maxGradNorm > 0)
      norm = b.create<GlobalNormOp>(
          loc, RankedTensorType::get({}, b.getF32Type()), grads);

    for (auto [p, g] : llvm::zip(params, grads)) {
      auto ref = FlatSymbolRefAttr::get(p.getSymNameAttr());
      bool oneD = cast<RankedTensorType>(p.getType()).getRank() <= 1;
      double wd = skipDecay1d && oneD ? 0.0 : weightDecay.getValue();
      if (optimizer == "adamw")
        b.create<AdamWOp>(
            loc, ref, g, norm, b.getF64FloatAttr(lr), b.getF64FloatAttr(beta1),
            b.getF64FloatAttr(beta2), b.getF64FloatAttr(eps),
            b.getF64FloatAttr(wd), b.getF64FloatAttr(maxGradNorm),
            b.getStringAttr(schedule), b.getI64IntegerAttr(warmup),
            b.getI64IntegerAttr(totalSteps), b.getF64FloatAttr(minLr));
      else
        b.create<SGDOp>(
            loc, ref, g, norm, b.getF64FloatAttr(lr),
            b.getF64FloatAttr(momentum), b.getF64FloatAttr(wd),
            b.getF64FloatAttr(maxGradNorm), b.getStringAttr(schedule),
            b.getI64IntegerAttr(warmup), b.getI64IntegerAttr(totalSteps),
            b.getF64FloatAttr(minLr));
    }
    b.create<func::ReturnOp>(loc);
  }
};

} // namespace
