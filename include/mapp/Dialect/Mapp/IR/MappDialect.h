#ifndef MAPP_DIALECT_MAPP_IR_MAPPDIALECT_H
#define MAPP_DIALECT_MAPP_IR_MAPPDIALECT_H

#include "mlir/IR/Dialect.h"

#include "mapp/Dialect/Mapp/IR/MappDialect.h.inc"

#endif
