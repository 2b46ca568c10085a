//===- Tensor.h - non-owning tensor view ------------------------*- C++ -*-===//
#ifndef MAPP_RT_TENSOR_H
#define MAPP_RT_TENSOR_H

#include "mapp/rt/DType.h"

namespace mapp::rt {

/// A typed shape without storage: what the loader checks kernels against.
struct TensorType {
  DType dtype = DType::F32;
  Shape shape;
  int64_t numel() const { return rt::numel(shape); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int rank() const { return static_cast<int>(shape.size()); }
};

/// A view of storage owned by the executor (arena/pool) or a test.
struct Tensor {
  void *data = nullptr;
  TensorType type;

  int64_t numel() const { return type.numel(); }
  int64_t dim(int i) const { return type.dim(i); }
  int rank() const { return type.rank(); }
  const Shape &shape() const { return type.shape; }
  float *f32() const { return static_cast<float *>(data); }
  int32_t *i32() const { return static_cast<int32_t *>(data); }
};

} // namespace mapp::rt

#endif
