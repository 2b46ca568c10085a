//===- Shard.h - full tensors <-> a rank's pieces ---------------*- C++ -*-===//
//
// The one slicing rule of sharded parameters (plan.fbs shard_dim /
// shard_blocks): used by the executor (init, --weights, --save) and by the
// checkpoint reshard path, so both cut tensors the same way.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_SHARD_H
#define MAPP_RT_SHARD_H

#include "mapp/rt/Plan.h"

namespace mapp::rt {

/// Copies piece `idx` of `n` between a full tensor and its shard: the full
/// tensor is [outer, blocks, n, len, inner] around shard dim `dim`, the piece
/// [outer, blocks, len, inner] (plan.fbs, shard_dim). toPiece: full -> piece.
void copyPiece(float *full, float *piece, const Shape &pieceShape, int dim,
               int blocks, int n, int idx, bool toPiece);

/// The full shape of a piece of `v` cut `n` ways (v's shape when unsharded).
Shape fullShapeOf(const Value &v, int n);

} // namespace mapp::rt

#endif
