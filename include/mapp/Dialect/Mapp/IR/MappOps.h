#ifndef MAPP_DIALECT_MAPP_IR_MAPPOPS_H
#define MAPP_DIALECT_MAPP_IR_MAPPOPS_H

#include "mapp/Dialect/Mapp/IR/MappDialect.h"
#include "mapp/Dialect/Mapp/IR/MappOpInterfaces.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "mapp/Dialect/Mapp/IR/MappEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "mapp/Dialect/Mapp/IR/MappAttrs.h.inc"

#define GET_OP_CLASSES
#include "mapp/Dialect/Mapp/IR/MappOps.h.inc"

#endif
