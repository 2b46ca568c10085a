// mapp-translate: conversions into and out of the mapp dialect.
//   --import-gpt-config   GPT config JSON -> forward graph (lib/Frontend/GPT)
//   --mapp-to-plan        training module -> runtime plan (lib/Target/Plan)
#include "mapp/Frontend/GPT/GPTImporter.h"
#include "mapp/Target/Plan/PlanBuilder.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  mapp::registerGPTImportTranslation();
  mapp::registerToPlanTranslation();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "mapp translation driver\n"));
}
