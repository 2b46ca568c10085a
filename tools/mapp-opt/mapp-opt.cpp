// mapp-opt: the mapp dialect, every mapp pass, and the upstream passes users
// combine with them (canonicalize, cse, inline, symbol-dce).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerInlinerPass();
  mlir::registerSymbolDCEPass();
  mlir::registerStripDebugInfoPass();
  mapp::registerMappPasses();
  mapp::registerMappPipelines();

  mlir::DialectRegistry registry;
  registry.insert<mapp::MappDialect, mlir::func::FuncDialect>();
  mlir::func::registerInlinerExtension(registry);
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "mapp optimizer driver\n", registry));
}
