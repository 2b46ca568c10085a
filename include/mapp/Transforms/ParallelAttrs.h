//===- ParallelAttrs.h - the module's mapp.parallel layout ------*- C++ -*-===//
//
// The parallel layout of a training module lives in one dictionary,
// `mapp.parallel = {tp, ep, pp, dp, chunks, microbatches, schedule}`, which the
// parallelism passes fill in and the plan lowering reads (absent keys: 1).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRANSFORMS_PARALLELATTRS_H
#define MAPP_TRANSFORMS_PARALLELATTRS_H

#include "mapp/rt/PlanLimits.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/MathExtras.h"

#include <algorithm>

namespace mapp {

inline constexpr llvm::StringLiteral kParallelAttr = "mapp.parallel";

/// Sets `key` in the module's mapp.parallel dictionary.
inline void setParallelAttr(mlir::ModuleOp module, llvm::StringRef key,
                            mlir::Attribute value) {
  mlir::NamedAttrList attrs;
  if (auto dict = module->getAttrOfType<mlir::DictionaryAttr>(kParallelAttr))
    attrs.append(dict.getValue());
  attrs.set(key, value);
  module->setAttr(kParallelAttr, attrs.getDictionary(module.getContext()));
}

inline void setParallelInt(mlir::ModuleOp module, llvm::StringRef key,
                           int64_t value) {
  setParallelAttr(module, key,
                  mlir::IntegerAttr::get(
                      mlir::IntegerType::get(module.getContext(), 64), value));
}

/// `key` of mapp.parallel, or `fallback` when absent.
inline int64_t getParallelInt(mlir::ModuleOp module, llvm::StringRef key,
                              int64_t fallback) {
  if (auto dict = module->getAttrOfType<mlir::DictionaryAttr>(kParallelAttr))
    if (auto a = dict.getAs<mlir::IntegerAttr>(key))
      return a.getInt();
  return fallback;
}

inline bool hasParallelKey(mlir::ModuleOp module, llvm::StringRef key) {
  auto dict = module->getAttrOfType<mlir::DictionaryAttr>(kParallelAttr);
  return dict && dict.get(key);
}

/// An upper bound of mapp/rt/PlanLimits.h on a pass option, checked before
/// the pass builds anything sized by it (microbatches=10^9 ran the schedule
/// generator out of memory): a located error at the module when exceeded.
inline mlir::LogicalResult checkAtMost(mlir::ModuleOp module,
                                       llvm::StringRef pass,
                                       llvm::StringRef option, int64_t value,
                                       int64_t limit, llvm::StringRef what) {
  if (value <= limit)
    return mlir::success();
  return module.emitError(pass)
         << ": " << option << "=" << value << " is more than " << limit << " ("
         << what << ")";
}

/// Parallel degrees (tp, pp, dp, ep) and their product, the world size.
inline constexpr int64_t kMaxDegree = rt::kMaxWorldSize;
inline constexpr llvm::StringLiteral kMaxDegreeWhy =
    "the most ranks a plan may have";

/// tp x pp x dp, saturating at INT64_MAX (degrees read from hand-written IR
/// may be anything).
inline int64_t worldSize(int64_t tp, int64_t pp, int64_t dp) {
  bool overflow = false;
  uint64_t w = llvm::SaturatingMultiply<uint64_t>(
      llvm::SaturatingMultiply<uint64_t>(std::max<int64_t>(tp, 0),
                                         std::max<int64_t>(pp, 0), &overflow),
      std::max<int64_t>(dp, 0), &overflow);
  return w > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(w);
}

} // namespace mapp

#endif // MAPP_TRANSFORMS_PARALLELATTRS_H
