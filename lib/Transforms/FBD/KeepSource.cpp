// --mapp-fbd-keep-source: the forward graph as text in `mapp.fbd_source`, so
// --mapp-split-fwd-bwd can tensor-parallelize the forward side at its own
// degree after the rest of the pipeline rewrote the module. Text, not a
// nested module: the passes in between walk nested modules too.
#include "mapp/Dialect/Mapp/IR/MappDialect.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OperationSupport.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPFBDKEEPSOURCE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;

namespace {

struct FbdKeepSourcePass
    : mapp::impl::MappFbdKeepSourceBase<FbdKeepSourcePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module->hasAttr("mapp.fbd_source")) {
      module.emitError("mapp-fbd-keep-source: the module already carries "
                       "mapp.fbd_source");
      return signalPassFailure();
    }
    if (!module.lookupSymbol<func::FuncOp>("forward") ||
        module->hasAttr("mapp.parallel")) {
      module.emitError("mapp-fbd-keep-source: run it on the forward graph "
                       "(a function @forward), before any parallelizing pass");
      return signalPassFailure();
    }
    std::string text;
    llvm::raw_string_ostream os(text);
    // Locations travel with the text: diagnostics of the forward side
    // (e.g. a fwd-tp that does not divide the heads) point at the input.
    module->print(os, OpPrintingFlags().enableDebugInfo(true, false));
    module->setAttr("mapp.fbd_source", StringAttr::get(&getContext(), text));
  }
};

} // namespace
