#ifndef MAPP_DIALECT_MAPP_IR_MAPPOPINTERFACES_H
#define MAPP_DIALECT_MAPP_IR_MAPPOPINTERFACES_H

#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/Builders.h"

namespace mapp {
/// Bytes of every ranked tensor in `values` (the default cost of an op).
uint64_t sumTensorBytes(mlir::ValueRange values);
/// Bytes of one ranked tensor type (0 for anything else).
uint64_t tensorBytes(mlir::Type type);
} // namespace mapp

#include "mapp/Dialect/Mapp/IR/MappOpInterfaces.h.inc"

#endif
