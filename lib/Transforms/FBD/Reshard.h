//===- Reshard.h - MegaFBD activation transfer between tp degrees -*- C++ -*-===//
//
// Private to --mapp-split-fwd-bwd: transfer=activations when the forward
// side's tensor-parallel degree differs from the backward side's. The
// forward side (degree T1) and the backward side's forward block (degree
// T2) were both built from one forward graph, so a value of one side is
// the same source value as a value of the other when its op has the same
// location, op name and result number (unique in each function). Such a
// value travels: forward rank j sends the part of its local piece that
// backward rank t holds (a slice, the whole piece, or one of several
// pieces that t concatenates). Whatever else the backward reads (values
// TP rewrote differently on the two sides, e.g. vocab-parallel
// cross-entropy partials) is recomputed on the backward side from the
// transferred values. docs/megafbd.md, "Resharding".
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_LIB_TRANSFORMS_FBD_RESHARD_H
#define MAPP_LIB_TRANSFORMS_FBD_RESHARD_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

#include <tuple>

namespace mapp::fbd {

/// (location, op name, result number) of a value: the same on both sides
/// for the same source value.
using ValueKey = std::tuple<const void *, const void *, unsigned>;

/// The unsharded type of every keyed value of the forward graph.
using GlobalTypes = llvm::DenseMap<ValueKey, mlir::Type>;

/// Records the keyed values of `source` (the forward graph before TP).
void collectGlobalTypes(mlir::ModuleOp source, GlobalTypes &out);

struct ReshardOptions {
  int64_t fwdTp = 1, bwdTp = 1, stage = 0, tagBase = 1000;
};

/// Rewrites `fwd` (the forward side's stage, degree fwdTp) to send every
/// transferred value's pieces (sends and slices carry fbd_cross = "bwd",
/// fbd_from = the forward tp index that runs them, fbd_to = the backward
/// tp index) and `bwdFwd` (the backward side's forward block, degree
/// bwdTp) to receive them (recvs carry fbd_cross = "fwd" and fbd_src = the
/// forward tp index per backward tp index) and recompute the rest. `fwd`'s
/// return is left alone. Fails with a located error when a value the
/// backward needs can neither travel nor be recomputed.
mlir::LogicalResult reshardActivations(mlir::func::FuncOp fwd,
                                       mlir::func::FuncOp bwdFwd,
                                       const GlobalTypes &global,
                                       const ReshardOptions &opts,
                                       int64_t &numTransfers);

} // namespace mapp::fbd

#endif
