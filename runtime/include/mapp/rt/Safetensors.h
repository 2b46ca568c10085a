//===- Safetensors.h - the safetensors checkpoint format --------*- C++ -*-===//
//
// File = u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
//  "__metadata__": {"k": "v"}}, then the data region. Offsets are relative to
// the data region. Supported dtypes: F32, BF16, F16, I32, I64.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_SAFETENSORS_H
#define MAPP_RT_SAFETENSORS_H

#include "mapp/rt/DType.h"

#include <map>
#include <string>
#include <vector>

namespace mapp::rt {

struct StTensor {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<uint8_t> data; // little-endian, row-major

  static StTensor fromF32(const Shape &shape, const float *values);
  static StTensor fromI32(const Shape &shape, const int32_t *values);
  /// Values converted to float (F32/BF16/F16/I32/I64); `what` names the
  /// tensor in errors.
  std::vector<float> toF32(const std::string &what) const;
  std::vector<int32_t> toI32(const std::string &what) const;
};

struct Safetensors {
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Parses a safetensors image; `where` (file name) prefixes errors.
Safetensors parseSafetensors(const std::vector<uint8_t> &bytes,
                             const std::string &where);
Safetensors readSafetensors(const std::string &path);
std::vector<uint8_t> serializeSafetensors(const Safetensors &st);
/// Throws Error naming the first float tensor (and element) that holds a NaN
/// or an infinity; `where` (file name) prefixes it.
void checkFinite(const Safetensors &st, const std::string &where);
void writeSafetensors(const std::string &path, const Safetensors &st);

/// "F32" etc. <-> DType.
const char *safetensorsDTypeName(DType t);
bool parseSafetensorsDType(const std::string &s, DType &out);

} // namespace mapp::rt

#endif
