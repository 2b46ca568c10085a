//===- LayerNames.h - how a model names its repeated blocks -----*- C++ -*-===//
//
// Passes that work per transformer block (pipeline partition, traces at
// layer granularity, probes, fp8, the cost report, the auto-parallel
// search, the plan's layer field) find a block's ops and parameters by
// name. The importers name them "layers.N.", but a model exported from
// PyTorch keeps its own module paths: nanoGPT "transformer.h.N.", a
// Hugging Face model "model.layers.N.", timm "blocks.N.". The block
// container is the one prefix followed by an index that names the most of
// the module's ops and parameters (an MoE's "layers.N.mlp.experts.E." names
// fewer than its "layers."); the module attribute `mapp.layer_prefix`
// overrides it. docs/design.md ("Blocks by name").
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_ANALYSIS_LAYERNAMES_H
#define MAPP_ANALYSIS_LAYERNAMES_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include <optional>
#include <string>

namespace mapp {

/// The block container's prefix among `names` ("transformer.h."): of the
/// prefixes "P" with "P<digits>." starting a name, the one starting the
/// most names, then the one with the most distinct indices, then the
/// shortest; "layers." when no name has an index.
std::string inferLayerPrefix(llvm::ArrayRef<llvm::StringRef> names);

class LayerNames {
public:
  explicit LayerNames(std::string prefix) : prefix_(std::move(prefix)) {}
  /// `mapp.layer_prefix` of the module, else inferLayerPrefix over every
  /// op's `mapp.name` and every `mapp.param`'s symbol.
  static LayerNames of(mlir::ModuleOp module);

  /// N of a name "<prefix>N" or "<prefix>N.<rest>"; nullopt otherwise.
  std::optional<unsigned> layerOf(llvm::StringRef name) const;
  /// The block of an op, by its `mapp.name`; nullopt without one.
  std::optional<unsigned> layerOf(mlir::Operation *op) const;
  /// The rest after "<prefix>N." ("attn.qkv"), "" for "<prefix>N".
  llvm::StringRef rest(llvm::StringRef name) const;
  /// "<prefix>N" without the trailing dot ("transformer.h.3").
  std::string key(unsigned layer) const;
  const std::string &prefix() const { return prefix_; }

private:
  std::string prefix_;
};

} // namespace mapp

#endif
