//===- MappScopeOps.cpp - verifiers of mapp.probe and mapp.perturb --------===//
//
// The runtime's loader re-checks these rules on the plan (KernelSpecs.cpp);
// checking them here as well gives located errors at compile time.
//
//===----------------------------------------------------------------------===//
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace mapp;

static bool isKnownReduction(StringRef r) {
  return llvm::StringSwitch<bool>(r)
      .Cases("max", "min", "mean", "std", "absmax", "sparsity", true)
      .Cases("hist", "topk", "sketch", "raw", "attn", true)
      .Case("lens", true)
      .Default(false);
}

LogicalResult ProbeOp::verify() {
  if (getInputs().empty() || getInputs().size() > 4)
    return emitOpError("takes one input (two for 'attn', 3-4 for 'lens'), "
                       "got ")
           << getInputs().size();
  if (getEvery() < 1)
    return emitOpError("every must be >= 1, got ") << getEvery();
  SmallVector<StringRef> parts;
  getReduce().split(parts, ',', -1, /*KeepEmpty=*/false);
  if (parts.empty())
    return emitOpError("needs at least one reduction");
  bool attn = false;
  for (StringRef r : parts) {
    if (!isKnownReduction(r))
      return emitOpError("unknown reduction '")
             << r
             << "' (expected max, min, mean, std, absmax, sparsity, hist, "
                "topk, sketch, raw, attn or lens)";
    attn |= r == "attn";
  }
  if (llvm::is_contained(parts, "lens")) {
    // x, the final norm's gamma (and beta), the unembedding [vocab, H].
    auto x = dyn_cast<RankedTensorType>(getInputs()[0].getType());
    size_t want = getOperation()->getAttrOfType<StringAttr>("norm") &&
                          getOperation()->getAttrOfType<StringAttr>("norm")
                                  .getValue() == "rms_norm"
                      ? 3
                      : 4;
    if (parts.size() != 1 || getInputs().size() != want || !x ||
        x.getRank() != 3)
      return emitOpError("'lens' is the only reduction of a probe on x "
                         "[B,T,H], the final norm's weights and the "
                         "unembedding");
    auto w = dyn_cast<RankedTensorType>(getInputs().back().getType());
    if (!w || w.getRank() != 2 || w.getShape()[1] != x.getShape()[2])
      return emitOpError("'lens' unembedding must be [vocab, H]");
    auto k = (*this)->getAttrOfType<IntegerAttr>("k");
    if (!k || k.getInt() < 1)
      return emitOpError("'lens' needs k >= 1");
    return success();
  }
  if (attn && (parts.size() != 1 || getInputs().size() != 2))
    return emitOpError("'attn' is the only reduction of a probe on q and k");
  if (!attn && getInputs().size() != 1)
    return emitOpError("takes one input unless it records 'attn'");
  auto intAttr = [&](StringRef k) {
    auto a = (*this)->getAttrOfType<IntegerAttr>(k);
    return a ? a.getInt() : int64_t(-1);
  };
  if (llvm::is_contained(parts, "hist")) {
    auto lo = (*this)->getAttrOfType<FloatAttr>("lo");
    auto hi = (*this)->getAttrOfType<FloatAttr>("hi");
    if (intAttr("bins") < 1 || !lo || !hi ||
        !(lo.getValueAsDouble() < hi.getValueAsDouble()))
      return emitOpError("'hist' needs bins >= 1 and lo < hi");
  }
  if (llvm::is_contained(parts, "topk") && intAttr("k") < 1)
    return emitOpError("'topk' needs k >= 1");
  if (llvm::is_contained(parts, "sketch") && intAttr("dim") < 1)
    return emitOpError("'sketch' needs dim >= 1");
  if (llvm::is_contained(parts, "raw") && intAttr("cap") < 1)
    return emitOpError("'raw' needs cap >= 1");
  if (attn) {
    auto q = cast<RankedTensorType>(getInputs()[0].getType());
    if (q.getRank() != 3 || q != getInputs()[1].getType())
      return emitOpError("'attn' needs q and k of one [B,T,H] type");
    int64_t heads = intAttr("heads");
    if (heads < 1 || q.getShape()[2] % heads)
      return emitOpError("'attn' needs heads dividing H");
  }
  return success();
}

LogicalResult PerturbOp::verify() {
  StringRef k = getKind();
  bool known = llvm::StringSwitch<bool>(k)
                   .Cases("gaussian", "uniform", "offset", "mask", true)
                   .Cases("bitflip", "int8", "fp8", true)
                   .Default(false);
  if (!known)
    return emitOpError("unknown perturbation kind '")
           << k
           << "' (expected gaussian, uniform, offset, mask, bitflip, int8 or "
              "fp8)";
  StringRef t = getTarget();
  if (t != "compute" && t != "storage" && t != "system")
    return emitOpError("target must be compute, storage or system, got '")
           << t << "'";
  double p = getP().convertToDouble();
  if (!(p >= 0 && p <= 1))
    return emitOpError("p must be in [0, 1], got ") << p;
  if (k == "mask") {
    auto ty = cast<RankedTensorType>(getX().getType());
    std::optional<ArrayRef<int64_t>> channels = getChannels();
    if (!channels || channels->empty())
      return emitOpError("'mask' needs channels");
    for (int64_t c : *channels)
      if (ty.getRank() == 0 || c < 0 || c >= ty.getShape().back())
        return emitOpError("mask channel ")
               << c << " outside the last dim of " << ty;
  }
  if (!cast<RankedTensorType>(getX().getType()).getElementType().isF32())
    return emitOpError("perturbs f32 tensors only");
  return success();
}

// Straight-through: the perturbation is treated as a fixed additive or
// multiplicative fault, not as part of the model, so dL/dx = dL/dy.
LogicalResult PerturbOp::buildGradient(OpBuilder &, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(dys[0]);
  return success();
}
