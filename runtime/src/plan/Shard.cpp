//===- Shard.cpp ----------------------------------------------------------===//
#include "mapp/rt/Shard.h"

#include <cstring>

using namespace mapp::rt;

void mapp::rt::copyPiece(float *full, float *piece, const Shape &pieceShape,
                         int dim, int blocks, int n, int idx, bool toPiece) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i)
    outer *= pieceShape[i];
  for (size_t i = dim + 1; i < pieceShape.size(); ++i)
    inner *= pieceShape[i];
  int64_t len = pieceShape[dim] / blocks, run = len * inner;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      float *f = full + ((o * blocks + b) * n + idx) * run;
      float *p = piece + (o * blocks + b) * run;
      if (toPiece)
        std::memcpy(p, f, run * sizeof(float));
      else
        std::memcpy(f, p, run * sizeof(float));
    }
}

Shape mapp::rt::fullShapeOf(const Value &v, int n) {
  Shape s = v.type.shape;
  if (v.shardDim >= 0)
    s[v.shardDim] *= n;
  return s;
}
