//===- GPTImporter.h - GPT config JSON -> mapp forward graph ----*- C++ -*-===//
//
// Builds the forward graph of the reference GPT (python/mapp/reference.py)
// straight from its config, op for op what the PyTorch exporter emits for the
// same config. docs/models.md specifies both: config keys and defaults,
// parameter names and order, the op sequence and its mapp.name values.
//
//===----------------------------------------------------------------------===//

#ifndef MAPP_FRONTEND_GPT_GPTIMPORTER_H
#define MAPP_FRONTEND_GPT_GPTIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <optional>
#include <vector>

#include <cstdint>
#include <string>

namespace mapp {

/// A normalized GPT config: every key present, defaults filled in, vocab
/// padded. Same rules as python/mapp/config.py.
struct GPTConfig {
  std::string variant = "gpt"; // "gpt" | "llama"
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t numHeads = 0;
  int64_t numQueryGroups = 0; // key/value heads; == numHeads without GQA
  int64_t ffnHiddenSize = 0;
  int64_t seqLength = 0;
  int64_t vocabSize = 0; // padded
  int64_t microBatchSize = 1;
  bool tieEmbeddings = true;
  std::string dtype = "float32";
  double layernormEpsilon = 1e-5;
  std::string geluApproximate = "tanh";
  double rotaryBase = 10000.0;
  double hiddenDropout = 0.0;
  double attentionDropout = 0.0;
  int64_t vocabDivisor = 1; // make_vocab_size_divisible_by
  int64_t seed = 0;

  // Mixture of experts (Megatron's names; 0 experts = a dense model).
  int64_t numMoeExperts = 0;
  int64_t moeRouterTopk = 2;
  int64_t moeFfnHiddenSize = 0;
  double moeAuxLossCoeff = 0.0;
  double moeZLossCoeff = 0.0;
  std::optional<double> moeCapacityFactor; // absent: dropless
  std::vector<int64_t> moeLayerFreq;       // 0/1 per layer

  // The families people bring (docs/models.md, "Model families"): each a
  // choice the two variants fix; the defaults are the variant's.
  std::string normType;        // "layernorm" (gpt) | "rmsnorm" (llama)
  std::string positionType;    // "learned" (gpt) | "rope" (llama)
  std::string mlpType;         // "gelu" (gpt) | "swiglu" (llama) | "geglu"
  bool qkvBias = false;        // biases of the q/k/v projections (gpt, Qwen2)
  bool linearBias = false;     // biases of the output projection and MLP (gpt)
  int64_t headDimension = 0;   // 0: hidden_size / num_attention_heads
  double rotaryPercent = 1.0;  // rotated fraction of each head (GPT-NeoX)
  bool parallelResidual = false; // x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)
  double normWeightOffset = 0; // RMSNorm gain = offset + weight (Gemma: 1)
  bool postNorms = false;      // norms after attention and MLP (Gemma 2)
  double embeddingMultiplier = 1.0; // Gemma: sqrt(hidden_size)
  double attentionSoftcap = 0; // 0: off (Gemma 2: attn_logit_softcapping)
  double logitSoftcap = 0;     // 0: off (Gemma 2: final_logit_softcapping)
  int64_t slidingWindow = 0;   // 0: off
  std::string slidingWindowLayers = "all"; // "all" | "even" (Gemma 2)
  double attentionScale = 0;   // 0: 1/sqrt(head_dim)

  bool isLlama() const { return variant == "llama"; }
  bool isGQA() const { return numQueryGroups != numHeads; }
  int64_t headDim() const {
    return headDimension ? headDimension : hiddenSize / numHeads;
  }
  bool rmsNorm() const { return normType == "rmsnorm"; }
  bool rope() const { return positionType == "rope"; }
  int64_t rotaryDim() const {
    return static_cast<int64_t>(headDim() * rotaryPercent);
  }
  bool windowed(int64_t layer) const {
    return slidingWindow > 0 &&
           (slidingWindowLayers == "all" || layer % 2 == 0);
  }
  bool isMoeLayer(int64_t layer) const {
    return numMoeExperts > 0 && moeLayerFreq[layer] != 0;
  }
  /// Rows an expert keeps per micro-batch (Megatron's get_capacity).
  std::optional<int64_t> moeCapacity() const;
};

/// An error in a config, naming the offending key (empty for JSON syntax).
struct GPTConfigError {
  std::string key;
  std::string message; // "config key 'k': ..."
};

/// Training-shape settings a model config does not hold
/// (mapp-translate --seq-length, --micro-batch-size,
/// --make-vocab-size-divisible-by, --no-dropout).
struct GPTImportOptions {
  std::optional<int64_t> seqLength;
  std::optional<int64_t> microBatchSize;
  std::optional<int64_t> vocabDivisor; // pad vocab like Megatron for tp
  bool noDropout = false;
};

/// A config rewritten into mapp's canonical keys (ConfigFormats.cpp).
struct ConfigTranslation {
  std::string format; // "mapp", "Megatron-LM" or the HF model_type
  llvm::json::Object canonical;
  std::vector<std::string> ignored; // keys that change nothing, sorted
};

/// Recognizes a Hugging Face config (by model_type) or Megatron-LM
/// arguments and rewrites it; a mapp config passes through unchanged.
bool translateConfigFormat(const llvm::json::Object &raw, ConfigTranslation &out,
                           GPTConfigError &err, const GPTImportOptions &opts);

/// Parses and validates a config in any format translateConfigFormat knows.
/// On failure returns false and fills `err`. `ignored` (optional) receives the
/// keys that were accepted without effect.
bool parseGPTConfig(llvm::StringRef json, GPTConfig &config, GPTConfigError &err,
                    const GPTImportOptions &opts = {},
                    ConfigTranslation *translation = nullptr);

/// Builds the forward-graph module for `config`.
mlir::OwningOpRef<mlir::ModuleOp> buildGPTModule(const GPTConfig &config,
                                                 mlir::MLIRContext *ctx);

/// Parses `json` and builds the module; on a bad config emits an error
/// diagnostic at `loc` (located at the key in `bufferName` when it can be
/// found) and returns null.
mlir::OwningOpRef<mlir::ModuleOp> importGPTConfig(llvm::StringRef json,
                                                  mlir::MLIRContext *ctx,
                                                  llvm::StringRef bufferName = "<config>",
                                                  const GPTImportOptions &opts = {});

/// Registers `--import-gpt-config` with mlir-translate's registry.
void registerGPTImportTranslation();

} // namespace mapp

#endif // MAPP_FRONTEND_GPT_GPTIMPORTER_H
