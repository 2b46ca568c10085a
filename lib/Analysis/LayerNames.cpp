//===- LayerNames.cpp - how a model names its repeated blocks -------------===//

#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include <set>

using namespace mlir;
using namespace mapp;

std::string mapp::inferLayerPrefix(ArrayRef<StringRef> names) {
  struct Count {
    size_t names = 0;
    std::set<unsigned> indices;
  };
  llvm::StringMap<Count> counts;
  for (StringRef name : names) {
    // Every "<digits>." component (after at least one other) ends a prefix.
    std::set<StringRef> seen; // a name counts once per prefix
    for (size_t at = name.find('.'); at != StringRef::npos;
         at = name.find('.', at + 1)) {
      StringRef tail = name.drop_front(at + 1);
      size_t digits = tail.find_if_not(llvm::isDigit);
      if (digits == 0 || (digits != StringRef::npos && tail[digits] != '.'))
        continue;
      unsigned index;
      if (tail.take_front(digits).getAsInteger(10, index))
        continue;
      StringRef prefix = name.take_front(at + 1);
      if (!seen.insert(prefix).second)
        continue;
      Count &c = counts[prefix];
      ++c.names;
      c.indices.insert(index);
    }
  }
  std::string best = "layers.";
  const Count *bestCount = nullptr;
  for (auto &kv : counts) {
    const Count &c = kv.second;
    bool better =
        !bestCount || c.names > bestCount->names ||
        (c.names == bestCount->names &&
         (c.indices.size() > bestCount->indices.size() ||
          (c.indices.size() == bestCount->indices.size() &&
           (kv.first().size() < best.size() ||
            (kv.first().size() == best.size() && kv.first() < best)))));
    if (better) {
      best = kv.first().str();
      bestCount = &c;
    }
  }
  return best;
}

LayerNames LayerNames::of(ModuleOp module) {
  if (auto p = module->getAttrOfType<StringAttr>("mapp.layer_prefix"))
    return LayerNames(p.str());
  std::vector<StringRef> names;
  module.walk([&](Operation *op) {
    if (auto n = op->getAttrOfType<StringAttr>("mapp.name"))
      names.push_back(n.getValue());
    if (auto p = dyn_cast<ParamOp>(op))
      names.push_back(p.getSymName());
  });
  return LayerNames(inferLayerPrefix(names));
}

std::optional<unsigned> LayerNames::layerOf(StringRef name) const {
  if (!name.consume_front(prefix_))
    return std::nullopt;
  unsigned layer;
  if (name.consumeInteger(10, layer) || !(name.empty() || name.front() == '.'))
    return std::nullopt;
  return layer;
}

std::optional<unsigned> LayerNames::layerOf(Operation *op) const {
  auto n = op->getAttrOfType<StringAttr>("mapp.name");
  return n ? layerOf(n.getValue()) : std::nullopt;
}

StringRef LayerNames::rest(StringRef name) const {
  if (!layerOf(name))
    return "";
  name = name.drop_front(prefix_.size()).drop_while(llvm::isDigit);
  return name.drop_front(std::min<size_t>(1, name.size()));
}

std::string LayerNames::key(unsigned layer) const {
  return prefix_ + std::to_string(layer);
}
