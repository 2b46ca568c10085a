// mapp-translate: into the mapp dialect (GPT configs) and out of it (plans).
#include "mapp/Target/Plan/PlanBuilder.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  mapp::registerToPlanTranslation();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "mapp translation driver\n"));
}
