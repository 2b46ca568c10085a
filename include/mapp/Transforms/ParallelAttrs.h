//===- ParallelAttrs.h - the module's mapp.parallel layout ------*- C++ -*-===//
//
// The parallel layout of a training module lives in one dictionary,
// `mapp.parallel = {tp, ep, pp, dp, chunks, microbatches, schedule}`, which the
// parallelism passes fill in and the plan lowering reads (absent keys: 1).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRANSFORMS_PARALLELATTRS_H
#define MAPP_TRANSFORMS_PARALLELATTRS_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"

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

} // namespace mapp

#endif // MAPP_TRANSFORMS_PARALLELATTRS_H
