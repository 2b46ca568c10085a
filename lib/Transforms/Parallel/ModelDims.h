//===- ModelDims.h - the dimensions the auto-parallel search prices -*- C++ -*-===//
#ifndef MAPP_TRANSFORMS_PARALLEL_MODELDIMS_H
#define MAPP_TRANSFORMS_PARALLEL_MODELDIMS_H

#include "mapp/cost/Search.h"
#include "mlir/IR/BuiltinOps.h"

namespace mapp {

/// The model's dimensions: from the importer's `mapp.model`, else read from
/// the forward graph of a generic export (its blocks by LayerNames, the
/// embedding table, the attention ops, block 0's linears). `graphMicroBatch`
/// is set to the micro-batch the graph's shapes fix (0 when a `mapp.model`
/// lets the importer rebuild it at any size). A located error names what
/// could not be read.
mlir::FailureOr<cost::ModelDims> modelDimsOf(mlir::ModuleOp module,
                                             int64_t &graphMicroBatch);

} // namespace mapp

#endif
