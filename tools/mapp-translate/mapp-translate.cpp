// mapp-translate: conversions into and out of the mapp dialect.
//   --import-gpt-config   GPT config JSON -> forward graph (lib/Frontend/GPT)
//   --mapp-to-plan        training module -> runtime plan (lib/Target/Plan)
#include "mapp/Frontend/GPT/GPTImporter.h"
#include "mapp/Support/InputChecks.h"
#include "mapp/Target/Plan/PlanBuilder.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  mapp::registerGPTImportTranslation();
  mapp::registerToPlanTranslation();
  // mlirTranslateMain opens its input before a translation runs: a FIFO
  // named as the input would block it there. (Each translation checks the
  // nesting of what it reads.)
  if (!mapp::checkInputArguments(argc, argv))
    return 1;
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "mapp translation driver\n"));
}
