// mapp-translate: conversions into and out of the mapp dialect.
//   --import-gpt-config   GPT config JSON -> forward graph (lib/Frontend/GPT)
#include "mapp/Frontend/GPT/GPTImporter.h"

#include "mlir/Support/LogicalResult.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  mapp::registerGPTImportTranslation();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "mapp translation driver\n"));
}
