#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mapp;

#include "mapp/Dialect/Mapp/IR/MappDialect.cpp.inc"
#include "mapp/Dialect/Mapp/IR/MappEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "mapp/Dialect/Mapp/IR/MappAttrs.cpp.inc"

void MappDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "mapp/Dialect/Mapp/IR/MappAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "mapp/Dialect/Mapp/IR/MappOps.cpp.inc"
      >();
}

LogicalResult
PlacementAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      int64_t virtualRank, StringAttr device, int64_t index,
                      int64_t tp, int64_t dp, int64_t pp) {
  if (virtualRank < 0 || index < 0)
    return emitError() << "placement rank and device index must be >= 0";
  if (device.getValue() != "cpu" && device.getValue() != "gpu")
    return emitError() << "placement device must be \"cpu\" or \"gpu\", got \""
                       << device.getValue() << "\"";
  if (tp < 1 || dp < 1 || pp < 1)
    return emitError() << "placement parallel degrees must be >= 1";
  return success();
}
