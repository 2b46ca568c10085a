//===- MappCommOps.cpp - verifiers of comm, structure and trace ops -------===//
//
// The ops of MappCommOps.td: collectives and point to point, the
// tensor-parallel copies and gradient sync, stages, subgraphs and the
// pipeline schedule, MegaScan's trace markers. (MappOps.cpp instantiates
// every op class.)
//
//===----------------------------------------------------------------------===//
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mapp;

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

//===----------------------------------------------------------------------===//
// Communication
//===----------------------------------------------------------------------===//

template <typename OpT>
static LogicalResult verifyGroup(OpT op) {
  bool hasGroup = !!op.getGroup(), hasRanks = !!op.getRanks();
  if (hasGroup == hasRanks)
    return op.emitOpError("needs exactly one of `group` or `ranks`");
  if (hasGroup) {
    StringRef g = *op.getGroup();
    if (g != "tp" && g != "dp" && g != "pp" && g != "ep" &&
      g != "edp")
      return op.emitOpError("group must be tp, dp, pp, ep or edp, got \"")
             << g << "\"";
    return success();
  }
  ArrayRef<int64_t> ranks = *op.getRanks();
  llvm::SmallDenseSet<int64_t> seen;
  if (ranks.empty())
    return op.emitOpError("ranks must not be empty");
  for (int64_t r : ranks)
    if (r < 0 || !seen.insert(r).second)
      return op.emitOpError("ranks must be distinct and >= 0");
  return success();
}

/// all_gather grows `dim` by the group size; reduce_scatter shrinks it.
static LogicalResult verifyGatherShape(Operation *op, Value small, Value big,
                                       int64_t dim,
                                       std::optional<ArrayRef<int64_t>> ranks) {
  ArrayRef<int64_t> s = shapeOf(small), b = shapeOf(big);
  if (dim < 0 || dim >= (int64_t)s.size() || s.size() != b.size())
    return op->emitOpError("dim ") << dim << " out of range or ranks differ";
  for (size_t i = 0; i < s.size(); ++i)
    if ((int64_t)i != dim && s[i] != b[i])
      return op->emitOpError("shapes may differ only along dim ") << dim;
  if (s[dim] <= 0 || b[dim] % s[dim] != 0)
    return op->emitOpError("gathered dim ")
           << b[dim] << " must be a multiple of the shard dim " << s[dim];
  if (ranks && b[dim] / s[dim] != (int64_t)ranks->size())
    return op->emitOpError("gathered dim must be shard dim × number of ranks");
  return success();
}

LogicalResult AllReduceOp::verify() {
  StringRef r = getReduction();
  if (r != "sum" && r != "max" && r != "avg")
    return emitOpError("reduction must be sum, max or avg, got \"") << r << "\"";
  return verifyGroup(*this);
}
LogicalResult AllGatherOp::verify() {
  if (failed(verifyGroup(*this)))
    return failure();
  return verifyGatherShape(*this, getX(), getResult(), getDimAttr().getInt(),
                           getRanks());
}
LogicalResult ReduceScatterOp::verify() {
  if (failed(verifyGroup(*this)))
    return failure();
  return verifyGatherShape(*this, getResult(), getX(), getDimAttr().getInt(),
                           getRanks());
}
LogicalResult AllToAllOp::verify() {
  if (failed(verifyGroup(*this)))
    return failure();
  int64_t rank = shapeOf(getX()).size();
  int64_t sd = getSplitDimAttr().getInt(), cd = getConcatDimAttr().getInt();
  if (sd < 0 || sd >= rank || cd < 0 || cd >= rank)
    return emitOpError("split_dim and concat_dim must be in [0, ") << rank << ")";
  if (tensorBytes(getX().getType()) != tensorBytes(getType()))
    return emitOpError("all_to_all must keep the element count");
  return success();
}

LogicalResult SendOp::verify() {
  if (getPeerAttr().getInt() < 0 || getTagAttr().getInt() < 0)
    return emitOpError("peer and tag must be >= 0");
  return success();
}
LogicalResult RecvOp::verify() {
  if (getPeerAttr().getInt() < 0 || getTagAttr().getInt() < 0)
    return emitOpError("peer and tag must be >= 0");
  return success();
}

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

LogicalResult StageOp::verify() {
  if (getStageAttr().getInt() < 0 || getChunkAttr().getInt() < 0)
    return emitOpError("stage and chunk must be >= 0");
  auto yield = cast<YieldOp>(getBody().front().getTerminator());
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("yielded types must match the stage's result types");
  return success();
}

LogicalResult SubgraphOp::verify() {
  if (getPhase() != "forward" && getPhase() != "backward")
    return emitOpError("phase must be \"forward\" or \"backward\", got \"")
           << getPhase() << "\"";
  if (getStageAttr().getInt() < 0)
    return emitOpError("stage must be >= 0");
  return success();
}

LogicalResult ScheduleOp::verify() {
  int64_t mbs = getMicrobatchesAttr().getInt(), chunks = getChunksAttr().getInt();
  if (mbs <= 0 || chunks <= 0)
    return emitOpError("microbatches and chunks must be > 0");
  for (auto [rank, tableAttr] : llvm::enumerate(getTables())) {
    auto table = dyn_cast<ArrayAttr>(tableAttr);
    if (!table)
      return emitOpError("table of rank ") << rank << " is not an array";
    llvm::DenseSet<std::tuple<int, int64_t, int64_t>> seen;
    bool split = false, fused = false;
    for (Attribute a : table) {
      auto task = dyn_cast<TaskAttr>(a);
      if (!task)
        return emitOpError("rank ") << rank << ": entry " << a
                                    << " is not a #mapp.task";
      if (task.getChunk() < 0 || task.getChunk() >= chunks ||
          task.getMicrobatch() < 0 || task.getMicrobatch() >= mbs)
        return emitOpError("rank ") << rank << ": task " << a
                                    << " is outside " << chunks
                                    << " chunk(s) × " << mbs << " microbatch(es)";
      split |= task.getKind() == TaskKind::BackwardInput ||
               task.getKind() == TaskKind::BackwardWeight;
      fused |= task.getKind() == TaskKind::Backward;
      if (!seen.insert({(int)task.getKind(), task.getChunk(),
                        task.getMicrobatch()})
               .second)
        return emitOpError("rank ") << rank << ": task " << a
                                    << " appears more than once";
    }
    if (split && fused)
      return emitOpError("rank ")
             << rank << " mixes fused and split backward tasks";
    size_t perTask = split ? 3 : 2;
    if (table.size() != perTask * mbs * chunks)
      return emitOpError("rank ") << rank << " has " << table.size()
                                  << " tasks, expected " << perTask * mbs * chunks
                                  << " (every chunk × microbatch, forward and "
                                     "backward, exactly once)";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// MegaScan
//===----------------------------------------------------------------------===//

LogicalResult TraceBeginOp::verify() {
  StringRef c = getCategory();
  if (c != "compute" && c != "comm" && c != "memcpy" && c != "data" &&
      c != "optimizer")
    return emitOpError("category must be compute, comm, memcpy, data or "
                       "optimizer, got \"")
           << c << "\"";
  if (getIdAttr().getInt() < 0 || getBytesAttr().getInt() < 0)
    return emitOpError("id and bytes must be >= 0");
  return success();
}
