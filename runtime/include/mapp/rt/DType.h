//===- DType.h - element types ----------------------------------*- C++ -*-===//
#ifndef MAPP_RT_DTYPE_H
#define MAPP_RT_DTYPE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt {

/// Same numbering as mapp.plan.DType in schema/plan.fbs.
enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3, I64 = 4 };

size_t dtypeSize(DType t);
const char *dtypeName(DType t); // "f32", "bf16", ...
/// Parses "f32"/"bf16"/"f16"/"i32"/"i64"; returns false on anything else.
bool parseDType(const std::string &s, DType &out);

using Shape = std::vector<int64_t>;
int64_t numel(const Shape &s);
std::string shapeStr(const Shape &s); // "[2,16,64]"

float bf16ToFloat(uint16_t v);
uint16_t floatToBf16(float f); // round to nearest even
float f16ToFloat(uint16_t v);
uint16_t floatToF16(float f);

} // namespace mapp::rt

#endif
