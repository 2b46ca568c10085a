//===- AlgebraKernelSpecs.cpp - operand rules of the tensor algebra -------===//
//
// Like KernelSpecs.cpp: each check proves the kernel stays inside its
// operands for the given shapes; messages name the operand and the shapes.
//
//===----------------------------------------------------------------------===//
#include "AlgebraKernelChecks.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/FusedProgram.h"

#include <algorithm>

using namespace mapp::rt;
using TTs = std::vector<TensorType>;

namespace {

std::string desc(const TensorType &t) {
  return std::string(dtypeName(t.dtype)) + shapeStr(t.shape);
}

bool isFloat(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

} // namespace

// Elementwise kernels of the algebra: every operand and the result f32 of
// one shape (the IR broadcasts explicitly).
void algebra::checkElementwise(const Attrs &, const TTs &in, const TTs &out) {
  const TensorType &y = out[0];
  if (y.dtype != DType::F32)
    fail("result must be f32, got ", desc(y));
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].dtype != DType::F32)
      fail("operand ", i, " must be f32, got ", desc(in[i]));
    if (in[i].shape != y.shape)
      fail("operand ", i, " ", desc(in[i]), " and result ", desc(y),
           " must have the same shape (broadcast explicitly)");
  }
}

void algebra::checkBroadcastTo(const Attrs &, const TTs &in, const TTs &out) {
  const TensorType &x = in[0], &y = out[0];
  if (x.dtype != DType::F32 || y.dtype != DType::F32)
    fail("operand and result must be f32, got ", desc(x), " and ", desc(y));
  if (x.rank() > y.rank())
    fail("operand ", desc(x), " has more dims than the result ", desc(y));
  size_t lead = y.shape.size() - x.shape.size();
  for (size_t i = 0; i < x.shape.size(); ++i)
    if (x.shape[i] != 1 && x.shape[i] != y.shape[lead + i])
      fail("operand ", desc(x), " does not broadcast to ", desc(y), ": dim ", i,
           " is neither 1 nor ", y.shape[lead + i]);
}

const std::vector<double> &algebra::constantValues(const Attrs &a) {
  static const std::vector<double> none;
  auto it = a.all().find("value");
  return it == a.all().end() || it->second.kind != AttrValue::Floats ? none
                                                                     : it->second.floats;
}

void algebra::checkConstant(const Attrs &a, const TTs &, const TTs &out) {
  if (out[0].dtype != DType::F32)
    fail("result must be f32, got ", desc(out[0]));
  auto it = a.all().find("value");
  if (it == a.all().end() || it->second.kind != AttrValue::Floats)
    fail("needs a `value` attribute holding the elements (floats)");
  if (static_cast<int64_t>(it->second.floats.size()) != out[0].numel())
    fail("`value` holds ", it->second.floats.size(), " elements, the result ",
         desc(out[0]), " has ", out[0].numel());
}

void algebra::checkCast(const Attrs &, const TTs &in, const TTs &out) {
  const TensorType &x = in[0], &y = out[0];
  if (!isFloat(y.dtype))
    fail("result must be a float type, got ", desc(y));
  if (!isFloat(x.dtype) && x.dtype != DType::I32 && x.dtype != DType::I64)
    fail("operand must be a float or integer type, got ", desc(x));
  if (x.shape != y.shape)
    fail("operand ", desc(x), " and result ", desc(y), " must have the same shape");
}

// A fused program (mapp/rt/FusedProgram.h): it parses, float types, and
// fused::checkShapes (operands broadcast to the domain, every result has
// its statement's shape).
void algebra::checkFused(const Attrs &a, const TTs &in, const TTs &out) {
  fused::Program prog;
  std::string err = fused::parse(a.getStr("program", ""), static_cast<int>(in.size()), prog);
  if (!err.empty())
    fail("program: ", err);
  Shape domain = a.getInts("domain");
  for (int64_t d : domain)
    if (d < 0)
      fail("domain ", shapeStr(domain), " has a negative dim");
  std::vector<Shape> ins, outs;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!isFloat(in[i].dtype))
      fail("operand ", i, " must be a float type, got ", desc(in[i]));
    ins.push_back(in[i].shape);
  }
  std::vector<int64_t> outputs = a.getInts("outputs");
  if (outputs.size() != out.size())
    fail("`outputs` names ", outputs.size(), " statements for ", out.size(), " results");
  for (size_t k = 0; k < out.size(); ++k) {
    if (!isFloat(out[k].dtype))
      fail("result ", k, " must be a float type, got ", desc(out[k]));
    outs.push_back(out[k].shape);
  }
  err = fused::checkShapes(prog, domain, ins, outs, outputs);
  if (!err.empty())
    fail(err);
}
