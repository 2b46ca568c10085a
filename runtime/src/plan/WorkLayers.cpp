//===- WorkLayers.cpp - The layer each instr's work belongs to ------------===//
//
// The compiler names a layer on the ops it builds by name (the linears:
// `layers.N.attn.qkv`); the norms, attention, activations, residual adds,
// their gradients and the optimizer's updates carry none. Re-partitioning
// needs all of a layer's work (docs/elastic.md), so it is followed through
// the dataflow here rather than recognized per op kind.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Plan.h"

#include <algorithm>
#include <regex>

int mapp::rt::layerOfName(const std::string &name) {
  static const std::regex re(R"(^layers\.([0-9]+)\.)");
  std::smatch m;
  return std::regex_search(name, m, re) ? std::stoi(m[1].str()) : -1;
}

std::vector<std::vector<int>> mapp::rt::workLayers(const Program &p) {
  // A value named for a layer (its parameters, their gradients and
  // optimizer state) is that layer's; a value any other parameter-like
  // kind is nobody's (the embedding, the head); a computed value is its
  // producer's.
  std::vector<int> valueLayer(p.values.size(), -1);
  std::vector<bool> anchored(p.values.size(), false);
  for (size_t v = 0; v < p.values.size(); ++v) {
    const Value &val = p.values[v];
    valueLayer[v] = layerOfName(val.name);
    anchored[v] = valueLayer[v] >= 0 || val.kind == ValueKind::Param ||
                  val.kind == ValueKind::Grad ||
                  val.kind == ValueKind::OptState;
  }
  std::vector<std::vector<int>> out(p.blocks.size());
  // An instr's layer: the plan's own, else that of the layer-named values
  // it reads (the latest, e.g. a residual add of layer N's output), else,
  // when it reads a parameter of no layer, none; else the latest layer of
  // the values it reads. Blocks need not come in dataflow order (a
  // backward block reads the forward's values): two passes settle it.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      out[b].assign(p.blocks[b].instrs.size(), -1);
      for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
        const Instr &in = p.blocks[b].instrs[i];
        int named = -1, flowed = -1;
        bool noLayerParam = false;
        for (int v : in.inputs) {
          if (v < 0 || static_cast<size_t>(v) >= p.values.size())
            continue;
          if (anchored[v]) {
            named = std::max(named, valueLayer[v]);
            noLayerParam |= valueLayer[v] < 0;
          } else {
            flowed = std::max(flowed, valueLayer[v]);
          }
        }
        int layer = in.layer >= 0        ? in.layer
                    : named >= 0         ? named
                    : noLayerParam       ? -1
                                         : flowed;
        out[b][i] = layer;
        for (int v : in.outputs)
          if (v >= 0 && static_cast<size_t>(v) < p.values.size() &&
              !anchored[v])
            valueLayer[v] = layer;
      }
    }
  return out;
}
