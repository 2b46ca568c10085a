// mapp-opt: the mapp dialect, every mapp pass, and the upstream passes users
// combine with them (canonicalize, cse, inline, symbol-dce).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Support/InputChecks.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
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
  auto [inputFile, outputFile] = mlir::registerAndParseCLIOptions(
      argc, argv, "mapp optimizer driver\n", registry);
  mlir::MlirOptMainConfig config =
      mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects())
    return mlir::asMainReturnCode(
        mlir::MlirOptMain(argc, argv, inputFile, outputFile, registry));
  // The input is read here rather than by MlirOptMain: it must be a regular
  // file (or stdin) and nest within what the parser's recursion survives.
  std::unique_ptr<llvm::MemoryBuffer> input = mapp::openCheckedInput(inputFile);
  if (!input)
    return 1;
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << error << "\n";
    return 1;
  }
  if (mlir::failed(
          mlir::MlirOptMain(output->os(), std::move(input), registry, config)))
    return 1;
  output->keep();
  return 0;
}
