//===- GPTConfig.cpp - GPT config parsing and validation ------------------===//
//
// The same rules as python/mapp/config.py (docs/models.md): HF aliases, keys
// starting with '_' are comments, unknown keys and wrong types are errors,
// defaults depend on the variant, vocab is padded. Messages name the key in
// the same words as the Python side.
//
//===----------------------------------------------------------------------===//

#include "mapp/Frontend/GPT/GPTImporter.h"
#include "mapp/rt/PlanLimits.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>
#include <map>
#include <optional>
#include <sstream>

using namespace mapp;
namespace json = llvm::json;

namespace {

enum class Kind { Int, Float, Bool, String, IntOrList };

struct KeyInfo {
  const char *name;
  Kind kind;
  bool required;
};

// Every canonical key, in python/mapp/config.py's KEY_ORDER.
const KeyInfo kKeys[] = {
    {"variant", Kind::String, false},
    {"num_layers", Kind::Int, true},
    {"hidden_size", Kind::Int, true},
    {"num_attention_heads", Kind::Int, true},
    {"num_query_groups", Kind::Int, false},
    {"ffn_hidden_size", Kind::Int, false},
    {"seq_length", Kind::Int, true},
    {"vocab_size", Kind::Int, true},
    {"micro_batch_size", Kind::Int, false},
    {"tie_embeddings", Kind::Bool, false},
    {"dtype", Kind::String, false},
    {"layernorm_epsilon", Kind::Float, false},
    {"gelu_approximate", Kind::String, false},
    {"rotary_base", Kind::Float, false},
    {"hidden_dropout", Kind::Float, false},
    {"attention_dropout", Kind::Float, false},
    {"make_vocab_size_divisible_by", Kind::Int, false},
    {"seed", Kind::Int, false},
    // Mixture of experts, only with num_moe_experts (python/mapp/config.py MOE).
    {"num_moe_experts", Kind::Int, false},
    {"moe_router_topk", Kind::Int, false},
    {"moe_ffn_hidden_size", Kind::Int, false},
    {"moe_aux_loss_coeff", Kind::Float, false},
    {"moe_z_loss_coeff", Kind::Float, false},
    {"moe_capacity_factor", Kind::Float, false},
    {"moe_layer_freq", Kind::IntOrList, false},
    // Family options (C++ importer only: docs/models.md, "Model families";
    // the Hugging Face translations in ConfigFormats.cpp set them).
    {"norm_type", Kind::String, false},
    {"position_type", Kind::String, false},
    {"mlp_type", Kind::String, false},
    {"qkv_bias", Kind::Bool, false},
    {"linear_bias", Kind::Bool, false},
    {"head_dim", Kind::Int, false},
    {"rotary_percent", Kind::Float, false},
    {"parallel_residual", Kind::Bool, false},
    {"norm_weight_offset", Kind::Float, false},
    {"post_norms", Kind::Bool, false},
    {"embedding_multiplier", Kind::Float, false},
    {"attention_softcap", Kind::Float, false},
    {"logit_softcap", Kind::Float, false},
    {"sliding_window", Kind::Int, false},
    {"sliding_window_layers", Kind::String, false},
    {"attention_scale", Kind::Float, false},
};

const std::pair<const char *, const char *> kAliases[] = {
    {"n_layer", "num_layers"},
    {"num_hidden_layers", "num_layers"},
    {"n_embd", "hidden_size"},
    {"n_head", "num_attention_heads"},
    {"num_key_value_heads", "num_query_groups"},
    {"n_inner", "ffn_hidden_size"},
    {"intermediate_size", "ffn_hidden_size"},
    {"n_positions", "seq_length"},
    {"max_position_embeddings", "seq_length"},
    {"tie_word_embeddings", "tie_embeddings"},
    {"layer_norm_epsilon", "layernorm_epsilon"},
    {"rms_norm_eps", "layernorm_epsilon"},
    {"rope_theta", "rotary_base"},
};

const char *kindName(Kind k) {
  switch (k) {
  case Kind::Int: return "int";
  case Kind::Float: return "float";
  case Kind::Bool: return "bool";
  case Kind::String: return "str";
  case Kind::IntOrList: return "int or list";
  }
  return "?";
}

struct Parser {
  GPTConfigError &err;
  // canonical key -> (key as written, value)
  std::map<std::string, std::pair<std::string, const json::Value *>> given;

  bool fail(llvm::StringRef key, const llvm::Twine &what) {
    err.key = key.str();
    err.message = ("config key '" + key + "': " + what).str();
    return false;
  }

  const KeyInfo *info(llvm::StringRef canon) {
    for (const KeyInfo &k : kKeys)
      if (canon == k.name)
        return &k;
    return nullptr;
  }

  static std::string show(const json::Value &v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << v;
    return os.str();
  }

  bool getInt(llvm::StringRef canon, int64_t &out) {
    auto it = given.find(canon.str());
    if (it == given.end())
      return true;
    const json::Value &v = *it->second.second;
    if (v.kind() == json::Value::Boolean || !v.getAsInteger())
      return fail(it->second.first, "expected int, got " + show(v));
    out = *v.getAsInteger();
    return true;
  }
  bool getFloat(llvm::StringRef canon, double &out) {
    auto it = given.find(canon.str());
    if (it == given.end())
      return true;
    const json::Value &v = *it->second.second;
    if (v.kind() == json::Value::Boolean || !v.getAsNumber())
      return fail(it->second.first, "expected float, got " + show(v));
    out = *v.getAsNumber();
    return true;
  }
  bool getBool(llvm::StringRef canon, bool &out) {
    auto it = given.find(canon.str());
    if (it == given.end())
      return true;
    const json::Value &v = *it->second.second;
    if (!v.getAsBoolean())
      return fail(it->second.first, "expected bool, got " + show(v));
    out = *v.getAsBoolean();
    return true;
  }
  bool getString(llvm::StringRef canon, std::string &out) {
    auto it = given.find(canon.str());
    if (it == given.end())
      return true;
    const json::Value &v = *it->second.second;
    if (!v.getAsString())
      return fail(it->second.first, "expected str, got " + show(v));
    out = v.getAsString()->str();
    return true;
  }
  bool has(llvm::StringRef canon) { return given.count(canon.str()); }
  /// A float as people write it (0.1, as Python prints it).
  static std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }

  bool parseMoe(GPTConfig &c);
  bool parseFamily(GPTConfig &c);
  bool layerFreq(GPTConfig &c);
};

/// The family options; defaults are the variant's (docs/models.md).
bool Parser::parseFamily(GPTConfig &c) {
  bool gpt = !c.isLlama();
  c.normType = gpt ? "layernorm" : "rmsnorm";
  c.positionType = gpt ? "learned" : "rope";
  c.mlpType = gpt ? "gelu" : "swiglu";
  c.qkvBias = c.linearBias = gpt;
  if (!getString("norm_type", c.normType) ||
      !getString("position_type", c.positionType) ||
      !getString("mlp_type", c.mlpType) || !getBool("qkv_bias", c.qkvBias) ||
      !getBool("linear_bias", c.linearBias) ||
      !getInt("head_dim", c.headDimension) ||
      !getFloat("rotary_percent", c.rotaryPercent) ||
      !getBool("parallel_residual", c.parallelResidual) ||
      !getFloat("norm_weight_offset", c.normWeightOffset) ||
      !getBool("post_norms", c.postNorms) ||
      !getFloat("embedding_multiplier", c.embeddingMultiplier) ||
      !getFloat("attention_softcap", c.attentionSoftcap) ||
      !getFloat("logit_softcap", c.logitSoftcap) ||
      !getInt("sliding_window", c.slidingWindow) ||
      !getString("sliding_window_layers", c.slidingWindowLayers) ||
      !getFloat("attention_scale", c.attentionScale))
    return false;
  auto oneOf = [&](const char *key, const std::string &v,
                   std::initializer_list<const char *> ok) {
    for (const char *o : ok)
      if (v == o)
        return true;
    std::string list;
    for (const char *o : ok)
      list += (list.empty() ? "\"" : ", \"") + std::string(o) + "\"";
    return fail(key, "must be one of " + list + ", got \"" + v + "\"");
  };
  if (!oneOf("norm_type", c.normType, {"layernorm", "rmsnorm"}) ||
      !oneOf("position_type", c.positionType, {"learned", "rope"}) ||
      !oneOf("mlp_type", c.mlpType, {"gelu", "swiglu", "geglu"}) ||
      !oneOf("sliding_window_layers", c.slidingWindowLayers, {"all", "even"}))
    return false;
  if (has("head_dim") && (c.headDimension <= 0 ||
                          c.headDimension > rt::kMaxHiddenSize))
    return fail("head_dim", "must be in [1, " + llvm::Twine(rt::kMaxHiddenSize) +
                                "], got " + llvm::Twine(c.headDimension));
  if (!(c.rotaryPercent > 0 && c.rotaryPercent <= 1))
    return fail("rotary_percent", "must be in (0, 1], got " + number(c.rotaryPercent));
  if (c.rotaryPercent != 1.0 && !c.rope())
    return fail("rotary_percent", "needs position_type \"rope\"");
  if (c.normWeightOffset != 0 && !c.rmsNorm())
    return fail("norm_weight_offset", "needs norm_type \"rmsnorm\"");
  for (auto [key, v] : {std::pair{"embedding_multiplier", c.embeddingMultiplier},
                        std::pair{"attention_scale", c.attentionScale},
                        std::pair{"attention_softcap", c.attentionSoftcap},
                        std::pair{"logit_softcap", c.logitSoftcap}})
    if (has(key) && !(v > 0))
      return fail(key, "must be positive, got " + number(v));
  if (has("sliding_window") && c.slidingWindow <= 0)
    return fail("sliding_window",
                "must be positive, got " + llvm::Twine(c.slidingWindow));
  if (c.parallelResidual && c.postNorms)
    return fail("post_norms", "is not supported with parallel_residual");
  return true;
}

bool Parser::parseMoe(GPTConfig &c) {
  const char *moeKeys[] = {"moe_router_topk", "moe_ffn_hidden_size",
                           "moe_aux_loss_coeff", "moe_z_loss_coeff",
                           "moe_capacity_factor", "moe_layer_freq"};
  if (!has("num_moe_experts")) {
    for (const char *k : moeKeys)
      if (has(k))
        return fail(given[k].first, "needs num_moe_experts");
    return true;
  }
  c.moeFfnHiddenSize = c.ffnHiddenSize;
  double capacity = 0;
  if (!getInt("num_moe_experts", c.numMoeExperts) ||
      !getInt("moe_router_topk", c.moeRouterTopk) ||
      !getInt("moe_ffn_hidden_size", c.moeFfnHiddenSize) ||
      !getFloat("moe_aux_loss_coeff", c.moeAuxLossCoeff) ||
      !getFloat("moe_z_loss_coeff", c.moeZLossCoeff) ||
      !getFloat("moe_capacity_factor", capacity))
    return false;
  if (c.numMoeExperts <= 0)
    return fail("num_moe_experts",
                "must be positive, got " + llvm::Twine(c.numMoeExperts));
  if (c.numMoeExperts > rt::kMaxExperts)
    return fail("num_moe_experts", "must be at most " +
                                       llvm::Twine(rt::kMaxExperts) + ", got " +
                                       llvm::Twine(c.numMoeExperts));
  if (c.moeRouterTopk < 1 || c.moeRouterTopk > c.numMoeExperts)
    return fail("moe_router_topk", llvm::Twine(c.moeRouterTopk) +
                                       " is not in [1, num_moe_experts = " +
                                       llvm::Twine(c.numMoeExperts) + "]");
  if (c.moeFfnHiddenSize <= 0)
    return fail("moe_ffn_hidden_size",
                "must be positive, got " + llvm::Twine(c.moeFfnHiddenSize));
  if (c.moeFfnHiddenSize > rt::kMaxFfnHiddenSize)
    return fail("moe_ffn_hidden_size",
                "must be at most " + llvm::Twine(rt::kMaxFfnHiddenSize) +
                    ", got " + llvm::Twine(c.moeFfnHiddenSize));
  for (auto [key, value] : {std::pair{"moe_aux_loss_coeff", c.moeAuxLossCoeff},
                            std::pair{"moe_z_loss_coeff", c.moeZLossCoeff}})
    if (!(value >= 0))
      return fail(key, "must be >= 0, got " + number(value));
  if (has("moe_capacity_factor")) {
    if (!(capacity > 0))
      return fail("moe_capacity_factor",
                  "must be positive (absent = dropless), got " +
                      number(capacity));
    c.moeCapacityFactor = capacity;
  }
  return layerFreq(c);
}

/// Megatron's moe_layer_freq: N (layers 0, N, 2N, ... are MoE) or a list of
/// 0/1 per layer.
bool Parser::layerFreq(GPTConfig &c) {
  c.moeLayerFreq.assign(c.numLayers, 0);
  auto it = given.find("moe_layer_freq");
  if (it == given.end()) {
    c.moeLayerFreq.assign(c.numLayers, 1);
    return true;
  }
  const json::Value &v = *it->second.second;
  const std::string &key = it->second.first;
  if (v.kind() != json::Value::Boolean && v.getAsInteger()) {
    int64_t n = *v.getAsInteger();
    if (n <= 0)
      return fail(key, "must be positive, got " + llvm::Twine(n));
    for (int64_t l = 0; l < c.numLayers; ++l)
      c.moeLayerFreq[l] = l % n == 0;
    return true;
  }
  const json::Array *list = v.getAsArray();
  bool ok = list != nullptr;
  for (size_t i = 0; ok && i < list->size(); ++i) {
    const json::Value &e = (*list)[i];
    std::optional<int64_t> bit =
        e.kind() == json::Value::Boolean ? std::nullopt : e.getAsInteger();
    ok = bit && (*bit == 0 || *bit == 1);
  }
  if (!ok)
    return fail(key, "expected an int or a list of 0/1, got " + show(v));
  if ((int64_t)list->size() != c.numLayers)
    return fail(key, llvm::Twine(list->size()) + " entries for num_layers = " +
                         llvm::Twine(c.numLayers));
  for (int64_t l = 0; l < c.numLayers; ++l)
    c.moeLayerFreq[l] = *(*list)[l].getAsInteger();
  return true;
}

} // namespace

bool mapp::parseGPTConfig(llvm::StringRef text, GPTConfig &c,
                          GPTConfigError &err, const GPTImportOptions &opts,
                          ConfigTranslation *translation) {
  llvm::Expected<json::Value> parsed = json::parse(text);
  if (!parsed) {
    err.key.clear();
    err.message = "not valid JSON: " + llvm::toString(parsed.takeError());
    return false;
  }
  const json::Object *raw = parsed->getAsObject();
  if (!raw) {
    err.key.clear();
    err.message = "config must be a JSON object";
    return false;
  }
  ConfigTranslation local;
  ConfigTranslation &tr = translation ? *translation : local;
  if (!translateConfigFormat(*raw, tr, err, opts))
    return false;
  const json::Object *obj = &tr.canonical;
  Parser p{err, {}};
  json::Value seqOverride(opts.seqLength.value_or(0));
  json::Value mbsOverride(opts.microBatchSize.value_or(0));
  json::Value divOverride(opts.vocabDivisor.value_or(0));
  // json::Object is unordered: sort keys so the first error is stable.
  std::vector<std::string> keys;
  for (const auto &kv : *obj)
    keys.push_back(kv.first.str());
  std::sort(keys.begin(), keys.end());
  for (const std::string &key : keys) {
    if (llvm::StringRef(key).starts_with("_"))
      continue;
    std::string canon = key;
    for (auto [alias, target] : kAliases)
      if (key == alias)
        canon = target;
    if (!p.info(canon))
      return p.fail(key, "unknown key");
    if (p.has(canon))
      return p.fail(key, "given twice (as '" + canon + "')");
    p.given[canon] = {key, obj->get(key)};
  }
  // Command-line training shape wins over the config's.
  if (opts.seqLength)
    p.given["seq_length"] = {"--seq-length", &seqOverride};
  if (opts.microBatchSize)
    p.given["micro_batch_size"] = {"--micro-batch-size", &mbsOverride};
  if (opts.vocabDivisor)
    p.given["make_vocab_size_divisible_by"] = {"--make-vocab-size-divisible-by",
                                               &divOverride};
  for (const KeyInfo &k : kKeys)
    if (k.required && !p.has(k.name))
      return p.fail(k.name, "missing");

  if (opts.noDropout) {
    for (const char *k : {"hidden_dropout", "attention_dropout"})
      if (p.given.erase(k))
        tr.ignored.push_back(k);
  }
  if (!p.getString("variant", c.variant) ||
      !p.getInt("num_layers", c.numLayers) ||
      !p.getInt("hidden_size", c.hiddenSize) ||
      !p.getInt("num_attention_heads", c.numHeads) ||
      !p.getInt("seq_length", c.seqLength) ||
      !p.getInt("vocab_size", c.vocabSize) ||
      !p.getInt("micro_batch_size", c.microBatchSize) ||
      !p.getString("dtype", c.dtype) ||
      !p.getString("gelu_approximate", c.geluApproximate) ||
      !p.getFloat("rotary_base", c.rotaryBase) ||
      !p.getFloat("hidden_dropout", c.hiddenDropout) ||
      !p.getFloat("attention_dropout", c.attentionDropout) ||
      !p.getInt("make_vocab_size_divisible_by", c.vocabDivisor) ||
      !p.getInt("seed", c.seed))
    return false;
  c.numQueryGroups = c.numHeads;
  if (!p.getInt("num_query_groups", c.numQueryGroups))
    return false;
  c.ffnHiddenSize = 4 * c.hiddenSize;
  c.tieEmbeddings = c.variant == "gpt";
  c.layernormEpsilon = 1e-5;
  if (!p.getInt("ffn_hidden_size", c.ffnHiddenSize) ||
      !p.getBool("tie_embeddings", c.tieEmbeddings) ||
      !p.getFloat("layernorm_epsilon", c.layernormEpsilon))
    return false;

  if (c.variant != "gpt" && c.variant != "llama")
    return p.fail("variant",
                  "must be \"gpt\" or \"llama\", got \"" + c.variant + "\"");
  if (!p.parseFamily(c))
    return false;
  // Positive and bounded before anything is built from them (num_layers =
  // 10^8 grew the graph past 4 GB): mapp/rt/PlanLimits.h, the same bounds as
  // python/mapp/config.py LIMITS. num_query_groups divides the heads.
  struct Size {
    const char *key;
    int64_t value, limit;
  };
  const Size sizes[] = {
      {"num_layers", c.numLayers, rt::kMaxLayers},
      {"hidden_size", c.hiddenSize, rt::kMaxHiddenSize},
      {"num_attention_heads", c.numHeads, rt::kMaxAttentionHeads},
      {"num_query_groups", c.numQueryGroups, rt::kMaxAttentionHeads},
      {"ffn_hidden_size", c.ffnHiddenSize, rt::kMaxFfnHiddenSize},
      {"seq_length", c.seqLength, rt::kMaxSeqLength},
      {"vocab_size", c.vocabSize, rt::kMaxVocabSize},
      {"micro_batch_size", c.microBatchSize, rt::kMaxMicroBatchSize},
      {"make_vocab_size_divisible_by", c.vocabDivisor, rt::kMaxVocabSize}};
  for (const Size &s : sizes) {
    if (s.value <= 0)
      return p.fail(s.key, "must be positive, got " + llvm::Twine(s.value));
    if (s.value > s.limit)
      return p.fail(s.key, "must be at most " + llvm::Twine(s.limit) +
                               ", got " + llvm::Twine(s.value));
  }
  if (c.microBatchSize * c.seqLength > rt::kMaxTokensPerMicrobatch)
    return p.fail("seq_length",
                  "micro_batch_size x seq_length = " +
                      llvm::Twine(c.microBatchSize * c.seqLength) +
                      " tokens per microbatch, more than " +
                      llvm::Twine(rt::kMaxTokensPerMicrobatch));
  if (!c.headDimension && c.hiddenSize % c.numHeads)
    return p.fail("num_attention_heads",
                  llvm::Twine(c.numHeads) + " does not divide hidden_size " +
                      llvm::Twine(c.hiddenSize));
  if (c.numHeads % c.numQueryGroups)
    return p.fail("num_query_groups",
                  llvm::Twine(c.numQueryGroups) +
                      " key/value heads do not divide num_attention_heads " +
                      llvm::Twine(c.numHeads));
  if (c.rope() && c.rotaryPercent == 1.0 && c.headDim() % 2)
    return p.fail(c.headDimension ? "head_dim" : "num_attention_heads",
                  "rotary embeddings need an even head dim, got " +
                      llvm::Twine(c.headDim()));
  if (c.rope() && (c.rotaryDim() % 2 || c.rotaryDim() <= 0))
    return p.fail("rotary_percent",
                  "rotates " + llvm::Twine(c.rotaryDim()) + " of the " +
                      llvm::Twine(c.headDim()) +
                      " columns of a head; rotary needs a positive even number");
  if (c.dtype != "float32")
    return p.fail("dtype",
                  "only \"float32\" is supported, got \"" + c.dtype + "\"");
  if (c.geluApproximate != "none" && c.geluApproximate != "tanh")
    return p.fail("gelu_approximate", "must be \"none\" or \"tanh\"");
  if (!(c.layernormEpsilon > 0))
    return p.fail("layernorm_epsilon", "must be positive");
  if (!(c.rotaryBase > 0))
    return p.fail("rotary_base", "must be positive");
  if (!(c.hiddenDropout >= 0 && c.hiddenDropout < 1))
    return p.fail("hidden_dropout", "must be in [0, 1)");
  if (!(c.attentionDropout >= 0 && c.attentionDropout < 1))
    return p.fail("attention_dropout", "must be in [0, 1)");
  c.vocabSize = (c.vocabSize + c.vocabDivisor - 1) / c.vocabDivisor * c.vocabDivisor;
  if (c.vocabSize > rt::kMaxVocabSize)
    return p.fail("vocab_size", "padded to a multiple of " +
                                    llvm::Twine(c.vocabDivisor) + " is " +
                                    llvm::Twine(c.vocabSize) + ", more than " +
                                    llvm::Twine(rt::kMaxVocabSize));
  // The largest f32 activations, [micro_batch_size, seq_length, N]: the
  // runtime refuses a plan holding a tensor beyond kMaxTensorBytes. (The
  // bounds above keep these products below 2^56.)
  for (auto [key, width] : {std::pair{"vocab_size", c.vocabSize},
                            std::pair{"ffn_hidden_size", c.ffnHiddenSize}}) {
    uint64_t bytes = uint64_t(c.microBatchSize * c.seqLength) * width * 4;
    if (bytes > rt::kMaxTensorBytes)
      return p.fail(
          key, "the f32 tensor [micro_batch_size, seq_length, " +
                   llvm::Twine(key) + "] = [" + llvm::Twine(c.microBatchSize) +
                   ", " + llvm::Twine(c.seqLength) + ", " + llvm::Twine(width) +
                   "] would take " + llvm::Twine(bytes) + " bytes, more than " +
                   llvm::Twine(rt::kMaxTensorBytes));
  }
  return p.parseMoe(c);
}

std::optional<int64_t> GPTConfig::moeCapacity() const {
  if (!moeCapacityFactor)
    return std::nullopt;
  double perExpert = double(microBatchSize * seqLength * moeRouterTopk) /
                     double(numMoeExperts);
  return std::max<int64_t>(int64_t(std::ceil(perExpert * *moeCapacityFactor)), 1);
}
