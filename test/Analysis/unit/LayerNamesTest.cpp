// LayerNames: which names are a model's block N (docs/design.md, "Blocks
// by name"), on names written as the importers, PyTorch modules and MoE
// layers write them.
#include "mapp/Analysis/LayerNames.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using mapp::inferLayerPrefix;
using mapp::LayerNames;

namespace {

std::string infer(const std::vector<std::string> &names) {
  std::vector<llvm::StringRef> refs(names.begin(), names.end());
  return inferLayerPrefix(refs);
}

/// `blocks` blocks under `prefix`, each with `inner` indexed sub-modules.
std::vector<std::string> model(const std::string &prefix, int blocks, int inner,
                               const std::string &innerName) {
  std::vector<std::string> n = {"wte.weight", "ln_f.weight", "lm_head"};
  for (int b = 0; b < blocks; ++b) {
    std::string p = prefix + std::to_string(b) + ".";
    n.push_back(p + "attn.qkv.weight");
    n.push_back(p + "attn.attention");
    n.push_back(p + "ln_1");
    for (int i = 0; i < inner; ++i)
      n.push_back(p + innerName + "." + std::to_string(i) + ".weight");
  }
  return n;
}

TEST(LayerNames, InfersTheContainerAsPyTorchCodeNamesIt) {
  EXPECT_EQ(infer(model("layers.", 4, 0, "")), "layers.");
  EXPECT_EQ(infer(model("transformer.h.", 12, 0, "")), "transformer.h.");
  EXPECT_EQ(infer(model("h.", 2, 0, "")), "h.");
  EXPECT_EQ(infer(model("model.layers.", 2, 0, "")), "model.layers.");
}

TEST(LayerNames, AnIndexInsideABlockStartsFewerNames) {
  // 2 blocks of 8 experts: "layers.0.mlp.experts." has 8 indices but starts
  // only block 0's expert names.
  EXPECT_EQ(infer(model("layers.", 2, 8, "mlp.experts")), "layers.");
  // One block whose MLP is an nn.Sequential of 10: still the container.
  EXPECT_EQ(infer(model("backbone.trunk.", 1, 10, "ffn")), "backbone.trunk.");
}

TEST(LayerNames, NoIndexKeepsTheImportersPrefix) {
  EXPECT_EQ(infer({"wte.weight", "block.attn", "head"}), "layers.");
  EXPECT_EQ(infer({}), "layers.");
  // An index that is not a whole component is no block index.
  EXPECT_EQ(infer({"h0.attn", "h1.attn", "x.2b.y"}), "layers.");
}

TEST(LayerNames, ReadsAndWritesABlocksNames) {
  LayerNames n("transformer.h.");
  EXPECT_EQ(n.layerOf("transformer.h.12.attn.c_attn"), 12u);
  EXPECT_EQ(n.layerOf("transformer.h.3"), 3u);
  EXPECT_EQ(n.layerOf("transformer.h.3x.attn"), std::nullopt);
  EXPECT_EQ(n.layerOf("transformer.hh.3.attn"), std::nullopt);
  EXPECT_EQ(n.layerOf("h.3.attn"), std::nullopt);
  EXPECT_EQ(n.rest("transformer.h.12.attn.c_attn").str(), "attn.c_attn");
  EXPECT_EQ(n.rest("transformer.h.12").str(), "");
  EXPECT_EQ(n.key(7), "transformer.h.7");
}

} // namespace
