//===- ConfigFormats.cpp - HF and Megatron configs -> mapp's keys ---------===//
//
// Users bring a Hugging Face config.json (recognized by model_type: gpt2,
// llama, mistral) or Megatron-LM's arguments; this rewrites either into the
// canonical keys GPTConfig.cpp validates (docs/models.md, "Configs people
// have"). Each key is handled one of three ways: mapped, ignored because it
// changes nothing in a training graph (token ids, generation settings,
// dropout that is off, checkpoint dtype), or an error naming the key because
// it changes the model in a way mapp does not build.
//
//===----------------------------------------------------------------------===//

#include "mapp/Frontend/GPT/GPTImporter.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <set>
#include <sstream>

using namespace mapp;
namespace json = llvm::json;

namespace {

std::string show(const json::Value &v) {
  // Numbers as people write them (0.1, not 0.10000000000000001).
  if (v.kind() == json::Value::Number && !v.getAsInteger()) {
    std::ostringstream os;
    os << *v.getAsNumber();
    return os.str();
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << v;
  return os.str();
}

/// One pass over the input object: every key must be consumed by `take`,
/// listed as ignorable, or it is an error.
class Translator {
public:
  Translator(const json::Object &in, ConfigTranslation &out, GPTConfigError &err,
             const GPTImportOptions &opts)
      : in(in), out(out), err(err), opts(opts) {}

  const json::Value *take(llvm::StringRef key) {
    const json::Value *v = in.get(key);
    if (v)
      used.insert(key.str());
    return v;
  }
  bool fail(llvm::StringRef key, const llvm::Twine &what) {
    err.key = key.str();
    err.message = ("config key '" + key + "': " + what).str();
    return false;
  }
  /// Copies `from` to canonical `to` if present.
  void map(llvm::StringRef from, llvm::StringRef to) {
    if (const json::Value *v = take(from))
      out.canonical[to] = *v;
  }
  std::optional<double> number(llvm::StringRef key) {
    const json::Value *v = in.get(key);
    return v ? v->getAsNumber() : std::nullopt;
  }
  bool isNull(llvm::StringRef key) {
    const json::Value *v = in.get(key);
    return !v || v->kind() == json::Value::Null;
  }
  /// `key` must be absent, null or equal to `ok`; otherwise `why`.
  bool require(llvm::StringRef key, const json::Value &ok, const llvm::Twine &why) {
    const json::Value *v = take(key);
    if (!v || v->kind() == json::Value::Null || *v == ok)
      return true;
    return fail(key, show(*v) + " is not supported (" + why + ")");
  }
  /// A dropout probability: 0 (or --no-dropout) is ignored, otherwise mapped
  /// to `to`.
  bool dropout(llvm::StringRef key, llvm::StringRef to) {
    const json::Value *v = take(key);
    if (!v)
      return true;
    std::optional<double> p = v->getAsNumber();
    if (!p)
      return fail(key, "expected float, got " + show(*v));
    if (*p == 0 || opts.noDropout) {
      out.ignored.push_back(key.str());
      return true;
    }
    if (const json::Value *prev = out.canonical.get(to))
      if (prev->getAsNumber() != p)
        return fail(key, show(*v) + " differs from the other " + to + " " +
                             show(*prev) + "; mapp has one rate");
    out.canonical[to] = *p;
    return true;
  }
  /// The training sequence: --seq-length, else `seqKey` (Megatron's
  /// seq_length), else the model's maximum positions `maxKey`; never longer
  /// than the maximum.
  bool positions(llvm::StringRef maxKey, const char *seqKey) {
    const json::Value *maxV = take(maxKey);
    const json::Value *seqV = seqKey ? take(seqKey) : nullptr;
    std::optional<int64_t> max = maxV ? maxV->getAsInteger() : std::nullopt;
    if (maxV && !max)
      return fail(maxKey, "expected int, got " + show(*maxV));
    if (seqV && !seqV->getAsInteger())
      return fail(seqKey, "expected int, got " + show(*seqV));
    std::optional<int64_t> seq = opts.seqLength;
    if (!seq && seqV)
      seq = seqV->getAsInteger();
    if (!seq)
      seq = max;
    if (!seq)
      return fail(maxKey, "missing (or pass --seq-length)");
    if (max && *seq > *max)
      return fail(maxKey, llvm::formatv("the sequence length {0} exceeds the "
                                        "model's {1} positions", *seq, *max));
    out.canonical["seq_length"] = *seq;
    return true;
  }
  /// Every key not taken must be in `ignorable` (reported) or it is unknown.
  bool finish(const std::set<std::string> &ignorable) {
    std::vector<std::string> keys;
    for (const auto &kv : in)
      keys.push_back(kv.first.str());
    std::sort(keys.begin(), keys.end());
    for (const std::string &k : keys) {
      if (used.count(k) || llvm::StringRef(k).starts_with("_"))
        continue;
      if (!ignorable.count(k))
        return fail(k, "unknown key for a " + out.format + " config");
      out.ignored.push_back(k);
    }
    std::sort(out.ignored.begin(), out.ignored.end());
    return true;
  }

  const json::Object &in;
  ConfigTranslation &out;
  GPTConfigError &err;
  const GPTImportOptions &opts;
  std::set<std::string> used;
};

// Keys of every Hugging Face config that hold no model structure.
const char *const kHFIgnorable[] = {
    "architectures", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "transformers_version", "torch_dtype", "use_cache", "task_specific_params",
    "pretraining_tp", "max_length", "min_length", "do_sample", "num_beams",
    "temperature", "top_k", "top_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "early_stopping", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "id2label",
    "label2id", "problem_type", "tokenizer_class", "prefix",
    "return_dict_in_generate", "num_return_sequences", "name_or_path",
    "_name_or_path", "is_decoder", "gradient_checkpointing"};

std::set<std::string> ignorable(std::initializer_list<const char *> extra) {
  std::set<std::string> s(std::begin(kHFIgnorable), std::end(kHFIgnorable));
  s.insert(extra.begin(), extra.end());
  return s;
}

bool translateGPT2(Translator &t) {
  auto &c = t.out.canonical;
  c["variant"] = "gpt";
  t.map("n_layer", "num_layers");
  t.map("n_embd", "hidden_size");
  t.map("n_head", "num_attention_heads");
  t.map("vocab_size", "vocab_size");
  if (!t.positions("n_positions", nullptr))
    return false;
  t.map("layer_norm_epsilon", "layernorm_epsilon");
  t.map("tie_word_embeddings", "tie_embeddings");
  if (!t.isNull("n_inner"))
    t.map("n_inner", "ffn_hidden_size");
  t.take("n_inner");
  // n_ctx is the older spelling of n_positions.
  if (auto ctx = t.number("n_ctx"); ctx && t.number("n_positions") &&
                                    *ctx != *t.number("n_positions"))
    return t.fail("n_ctx", "differs from n_positions");
  if (t.take("n_ctx"))
    t.out.ignored.push_back("n_ctx");
  if (const json::Value *act = t.take("activation_function")) {
    std::optional<llvm::StringRef> s = act->getAsString();
    if (s && (*s == "gelu_new" || *s == "gelu_pytorch_tanh" || *s == "gelu_fast"))
      c["gelu_approximate"] = "tanh";
    else if (s && *s == "gelu")
      c["gelu_approximate"] = "none";
    else
      return t.fail("activation_function",
                    show(*act) + " is not supported (gelu, gelu_new, "
                                 "gelu_pytorch_tanh)");
  }
  if (!t.dropout("resid_pdrop", "hidden_dropout") ||
      !t.dropout("embd_pdrop", "hidden_dropout") ||
      !t.dropout("attn_pdrop", "attention_dropout") ||
      !t.require("scale_attn_weights", true, "mapp always scales by 1/sqrt(D)") ||
      !t.require("scale_attn_by_inverse_layer_idx", false, "layer-index scaling") ||
      !t.require("add_cross_attention", false, "cross-attention") ||
      !t.require("initializer_range", 0.02, "mapp initializes with std 0.02"))
    return false;
  // The sequence-summary head of GPT2DoubleHeadsModel is not in an LM graph;
  // reorder_and_upcast_attn only changes float rounding.
  return t.finish(ignorable(
      {"summary_type", "summary_use_proj", "summary_activation",
       "summary_proj_to_labels", "summary_first_dropout", "n_special",
       "predict_special_tokens", "reorder_and_upcast_attn"}));
}

/// rope_theta, rope_scaling and transformers 5's rope_parameters (a dict
/// of rope_type, rope_theta and partial_rotary_factor): plain rotary only.
bool ropeKeys(Translator &t, const char *thetaKey) {
  auto &c = t.out.canonical;
  t.map(thetaKey, "rotary_base");
  auto kindOf = [](const json::Object &o) {
    for (const char *k : {"rope_type", "type"})
      if (auto s = o.getString(k))
        return s->str();
    return std::string("?");
  };
  if (const json::Value *rs = t.take("rope_scaling");
      rs && rs->kind() != json::Value::Null) {
    const json::Object *o = rs->getAsObject();
    std::string kind = o ? kindOf(*o) : show(*rs);
    if (kind != "default")
      return t.fail("rope_scaling", "rope scaling of type \"" + kind +
                                        "\" is not supported (plain rotary only)");
  }
  if (const json::Value *rp = t.take("rope_parameters");
      rp && rp->kind() != json::Value::Null) {
    const json::Object *o = rp->getAsObject();
    if (!o)
      return t.fail("rope_parameters", "expected an object, got " + show(*rp));
    std::string kind = kindOf(*o);
    if (kind != "default")
      return t.fail("rope_parameters", "rope of type \"" + kind +
                                           "\" is not supported (plain rotary only)");
    for (const auto &kv : *o) {
      llvm::StringRef k = kv.first;
      if (k == "rope_type" || k == "type")
        continue;
      if (k == "rope_theta" && kv.second.getAsNumber())
        c["rotary_base"] = *kv.second.getAsNumber();
      else if (k == "partial_rotary_factor" && kv.second.getAsNumber())
        c["rotary_percent"] = *kv.second.getAsNumber();
      else
        return t.fail("rope_parameters", "key \"" + k.str() + "\" = " +
                                             show(kv.second) +
                                             " is not supported");
    }
  }
  return true;
}

/// A window that masks something: a sliding_window shorter than the
/// training sequence becomes the attention option; null or one at least as
/// long changes nothing and is reported as ignored.
bool slidingWindow(Translator &t, const char *key) {
  const json::Value *sw = t.take(key);
  if (!sw || sw->kind() == json::Value::Null)
    return true;
  std::optional<int64_t> w = sw->getAsInteger();
  if (!w || *w <= 0)
    return t.fail(key, "expected a positive int or null, got " + show(*sw));
  const json::Value *seq = t.out.canonical.get("seq_length");
  if (seq && seq->getAsInteger() && *w >= *seq->getAsInteger()) {
    t.out.ignored.push_back(key);
    return true;
  }
  t.out.canonical["sliding_window"] = *w;
  return true;
}

/// Hugging Face's decoder families built on LLaMA's layout (model_type
/// llama, mistral, qwen2, mixtral, phi3, gemma, gemma2): RMSNorm, rotary,
/// gated MLP, each family's differences as options (docs/models.md, "Model
/// families").
bool translateLlama(Translator &t, llvm::StringRef family) {
  auto &c = t.out.canonical;
  const bool gemma = family == "gemma" || family == "gemma2";
  c["variant"] = "llama";
  c["tie_embeddings"] = gemma; // HF's default per family
  t.map("num_hidden_layers", "num_layers");
  t.map("hidden_size", "hidden_size");
  t.map("num_attention_heads", "num_attention_heads");
  if (!t.isNull("num_key_value_heads"))
    t.map("num_key_value_heads", "num_query_groups");
  t.take("num_key_value_heads");
  t.map("intermediate_size", "ffn_hidden_size");
  t.map("vocab_size", "vocab_size");
  if (!t.positions("max_position_embeddings", nullptr))
    return false;
  t.map("rms_norm_eps", "layernorm_epsilon");
  t.map("tie_word_embeddings", "tie_embeddings");
  if (!ropeKeys(t, "rope_theta"))
    return false;
  if (!t.isNull("head_dim"))
    t.map("head_dim", "head_dim");
  t.take("head_dim");
  // Phi-3's partial rotary (transformers 5 also writes it for others).
  if (!t.isNull("partial_rotary_factor"))
    t.map("partial_rotary_factor", "rotary_percent");
  t.take("partial_rotary_factor");

  // The activation of the gated MLP.
  if (gemma) {
    // Gemma's MLP reads hidden_activation (GeGLU, tanh GELU by default);
    // hidden_act is what older configs wrote and HF ignores it for Gemma.
    std::string act = "gelu_pytorch_tanh";
    if (const json::Value *ha = t.take("hidden_activation");
        ha && ha->kind() != json::Value::Null) {
      if (!ha->getAsString())
        return t.fail("hidden_activation", "expected str, got " + show(*ha));
      act = ha->getAsString()->str();
    }
    c["mlp_type"] = "geglu";
    if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast")
      c["gelu_approximate"] = "tanh";
    else if (act == "gelu")
      c["gelu_approximate"] = "none";
    else
      return t.fail("hidden_activation",
                    "\"" + act + "\" is not supported (gelu_pytorch_tanh, gelu)");
    if (t.take("hidden_act"))
      t.out.ignored.push_back("hidden_act");
    c["norm_weight_offset"] = 1.0;
    // normalizer = hidden_size ** 0.5, in the model's dtype.
    if (auto h = t.number("hidden_size"))
      c["embedding_multiplier"] = std::sqrt(*h);
  } else if (!t.require("hidden_act", "silu", "SwiGLU with silu only")) {
    return false;
  }

  if (family == "gemma2") {
    c["post_norms"] = true;
    for (auto [from, to] : {std::pair{"attn_logit_softcapping", "attention_softcap"},
                            std::pair{"final_logit_softcapping", "logit_softcap"}})
      if (!t.isNull(from))
        t.map(from, to);
      else
        t.take(from);
    if (const json::Value *q = t.take("query_pre_attn_scalar");
        q && q->kind() != json::Value::Null) {
      std::optional<double> v = q->getAsNumber();
      if (!v || *v <= 0)
        return t.fail("query_pre_attn_scalar",
                      "expected a positive number, got " + show(*q));
      c["attention_scale"] = 1.0 / std::sqrt(*v);
    }
    // Gemma 2 alternates: even layers slide, odd layers see everything.
    if (const json::Value *lt = t.take("layer_types")) {
      const json::Array *a = lt->getAsArray();
      bool alternating = a != nullptr;
      for (size_t i = 0; a && i < a->size(); ++i)
        alternating &= (*a)[i].getAsString() ==
                       std::optional<llvm::StringRef>(i % 2 ? "full_attention"
                                                            : "sliding_attention");
      if (!alternating)
        return t.fail("layer_types", "only Gemma 2's alternation (sliding on "
                                     "even layers, full on odd) is supported");
    }
    if (auto a = t.number("sliding_window"), b = t.number("sliding_window_size");
        a && b && *a != *b)
      return t.fail("sliding_window_size", "differs from sliding_window");
    if (t.take("sliding_window_size"))
      t.out.ignored.push_back("sliding_window_size");
    if (!slidingWindow(t, "sliding_window"))
      return false;
    if (c.get("sliding_window"))
      c["sliding_window_layers"] = "even";
  } else if (family == "qwen2") {
    // Qwen2's q/k/v projections always have biases (o_proj and MLP none).
    c["qkv_bias"] = true;
    if (!t.require("use_sliding_window", false,
                   "Qwen2's per-layer sliding window (max_window_layers)"))
      return false;
    // Without use_sliding_window they change nothing.
    for (const char *k : {"sliding_window", "max_window_layers"})
      if (t.take(k))
        t.out.ignored.push_back(k);
  } else if (family == "mixtral") {
    if (!t.isNull("num_local_experts"))
      t.map("num_local_experts", "num_moe_experts");
    t.take("num_local_experts");
    t.map("num_experts_per_tok", "moe_router_topk");
    // HF adds router_aux_loss_coef·(its load-balancing loss) only with
    // output_router_logits; Megatron's per-layer loss is not that sum.
    if (!t.require("output_router_logits", false,
                   "HF's load-balancing loss in the training loss") ||
        !t.require("router_jitter_noise", 0, "router jitter"))
      return false;
    if (t.take("router_aux_loss_coef"))
      t.out.ignored.push_back("router_aux_loss_coef");
    if (!slidingWindow(t, "sliding_window"))
      return false;
  } else if (family == "phi3") {
    // original_max_position_embeddings only matters to longrope scaling.
    if (t.take("original_max_position_embeddings"))
      t.out.ignored.push_back("original_max_position_embeddings");
    if (!t.dropout("resid_pdrop", "hidden_dropout") ||
        !t.dropout("embd_pdrop", "hidden_dropout") ||
        !slidingWindow(t, "sliding_window"))
      return false;
  } else {
    // llama, mistral, gemma.
    if (!slidingWindow(t, "sliding_window"))
      return false;
  }
  if (!t.require("attention_bias", false, "attention biases") ||
      !t.require("mlp_bias", false, "MLP biases") ||
      (family != "qwen2" &&
       !t.require("use_sliding_window", false, "sliding-window attention")) ||
      !t.require("initializer_range", 0.02, "mapp initializes with std 0.02") ||
      !t.dropout("attention_dropout", "attention_dropout"))
    return false;
  // cache_implementation is Gemma 2's generation cache.
  return t.finish(ignorable({"cache_implementation"}));
}

/// GPT-NeoX / Pythia (GPTNeoXForCausalLM): LayerNorm, GELU MLP, biases,
/// partial rotary, usually a parallel residual.
bool translateGPTNeoX(Translator &t) {
  auto &c = t.out.canonical;
  c["variant"] = "gpt";
  c["position_type"] = "rope";
  c["tie_embeddings"] = false;
  c["gelu_approximate"] = "none";
  c["parallel_residual"] = true; // HF's default
  t.map("num_hidden_layers", "num_layers");
  t.map("hidden_size", "hidden_size");
  t.map("num_attention_heads", "num_attention_heads");
  t.map("intermediate_size", "ffn_hidden_size");
  t.map("vocab_size", "vocab_size");
  if (!t.positions("max_position_embeddings", nullptr))
    return false;
  t.map("layer_norm_eps", "layernorm_epsilon");
  t.map("tie_word_embeddings", "tie_embeddings");
  t.map("use_parallel_residual", "parallel_residual");
  t.map("rotary_pct", "rotary_percent");
  t.map("rotary_emb_base", "rotary_base");
  if (!ropeKeys(t, "rope_theta"))
    return false;
  if (!t.isNull("partial_rotary_factor"))
    t.map("partial_rotary_factor", "rotary_percent");
  t.take("partial_rotary_factor");
  if (const json::Value *act = t.take("hidden_act")) {
    std::optional<llvm::StringRef> s = act->getAsString();
    if (s && (*s == "gelu_new" || *s == "gelu_pytorch_tanh" || *s == "gelu_fast"))
      c["gelu_approximate"] = "tanh";
    else if (!s || *s != "gelu")
      return t.fail("hidden_act", show(*act) + " is not supported (gelu, "
                                               "gelu_new, gelu_pytorch_tanh)");
  }
  if (!t.require("attention_bias", true, "GPT-NeoX without attention biases") ||
      !t.require("initializer_range", 0.02, "mapp initializes with std 0.02") ||
      !t.dropout("hidden_dropout", "hidden_dropout") ||
      !t.dropout("attention_dropout", "attention_dropout"))
    return false;
  // classifier_dropout belongs to the sequence-classification head.
  return t.finish(ignorable({"classifier_dropout"}));
}

/// Megatron-LM arguments (args namespace names; "--num-layers" spellings are
/// accepted too).
bool translateMegatron(Translator &t) {
  auto &c = t.out.canonical;
  if (!t.positions("max_position_embeddings", "seq_length"))
    return false;
  for (const char *k :
       {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
        "micro_batch_size",
        "make_vocab_size_divisible_by", "rotary_base", "seed"})
    t.map(k, k);
  t.map("padded_vocab_size", "vocab_size");
  if (!c.get("vocab_size"))
    t.map("vocab_size", "vocab_size");
  t.take("vocab_size");
  t.map("norm_epsilon", "layernorm_epsilon");
  t.map("layernorm_epsilon", "layernorm_epsilon");
  bool gqa = false;
  if (const json::Value *g = t.take("group_query_attention"))
    gqa = g->getAsBoolean().value_or(false);
  if (gqa)
    t.map("num_query_groups", "num_query_groups");
  else if (t.take("num_query_groups"))
    t.out.ignored.push_back("num_query_groups"); // Megatron ignores it too
  if (const json::Value *u = t.take("untie_embeddings_and_output_weights"))
    c["tie_embeddings"] = !u->getAsBoolean().value_or(false);

  // The variant is the combination of four switches.
  auto str = [&](const char *k, const char *dflt) {
    const json::Value *v = t.take(k);
    return v && v->getAsString() ? v->getAsString()->str() : std::string(dflt);
  };
  auto flag = [&](const char *k, bool dflt) {
    const json::Value *v = t.take(k);
    return v && v->getAsBoolean() ? *v->getAsBoolean() : dflt;
  };
  std::string norm = str("normalization", "LayerNorm");
  std::string pos = str("position_embedding_type", "learned_absolute");
  bool swiglu = flag("swiglu", false);
  bool bias = flag("add_bias_linear", !flag("disable_bias_linear", false));
  bool llama = norm == "RMSNorm";
  if (norm != "RMSNorm" && norm != "LayerNorm")
    return t.fail("normalization", "\"" + norm + "\" is not supported");
  if (swiglu != llama)
    return t.fail("swiglu", "mapp builds LayerNorm+GELU (gpt) or RMSNorm+SwiGLU "
                            "(llama), not a mix");
  if ((pos == "rope") != llama || (pos != "rope" && pos != "learned_absolute"))
    return t.fail("position_embedding_type",
                  "\"" + pos + "\" with " + norm +
                      " is not supported (gpt: learned_absolute, llama: rope)");
  if (bias == llama)
    return t.fail("add_bias_linear", llama ? "llama-style models have no biases"
                                           : "gpt-style models have biases");
  c["variant"] = llama ? "llama" : "gpt";
  if (!llama)
    c["gelu_approximate"] = flag("openai_gelu", false) ? "tanh" : "none";
  if (const json::Value *kv = t.take("kv_channels"); kv && kv->getAsInteger()) {
    auto h = t.number("hidden_size"), n = t.number("num_attention_heads");
    if (h && n && *n != 0 && *kv->getAsInteger() * *n != *h)
      return t.fail("kv_channels",
                    "must be hidden_size / num_attention_heads (mapp derives it)");
  }
  for (const char *k : {"num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                        "moe_aux_loss_coeff", "moe_z_loss_coeff",
                        "moe_capacity_factor", "moe_layer_freq"})
    if (!t.isNull(k))
      t.map(k, k);
    else
      t.take(k); // Megatron writes None for "not set"
  // Expert parallelism is mapp-opt's, but experts must split evenly over it.
  if (const json::Value *ep = t.take("expert_model_parallel_size")) {
    std::optional<int64_t> n = ep->getAsInteger();
    std::optional<double> experts = t.number("num_moe_experts");
    if (!n || *n <= 0)
      return t.fail("expert_model_parallel_size",
                    "expected a positive int, got " + show(*ep));
    if (experts && std::fmod(*experts, double(*n)) != 0)
      return t.fail("expert_model_parallel_size",
                    llvm::formatv("{0} experts cannot be split evenly over {1} "
                                  "expert-parallel ranks (num_moe_experts must be "
                                  "divisible by expert_model_parallel_size)",
                                  show(*t.take("num_moe_experts")), *n));
    t.out.ignored.push_back("expert_model_parallel_size");
  }
  if (!t.dropout("hidden_dropout", "hidden_dropout") ||
      !t.dropout("attention_dropout", "attention_dropout") ||
      !t.require("add_qkv_bias", bias, "qkv bias without the other biases") ||
      !t.require("init_method_std", 0.02, "mapp initializes with std 0.02") ||
      !t.require("rotary_percent", 1.0, "partial rotary"))
    return false;
  // Training, precision and parallelism arguments: mapp-opt's pipeline flags
  // and mapp-run's flags set those.
  return t.finish(
      {"global_batch_size", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters",
       "lr_decay_iters", "train_iters", "weight_decay", "clip_grad",
       "adam_beta1", "adam_beta2", "adam_eps", "bf16", "fp16", "params_dtype",
       "tensor_model_parallel_size", "pipeline_model_parallel_size",
       "sequence_parallel", "num_layers_per_virtual_pipeline_stage",
       "use_distributed_optimizer", "tokenizer_type", "vocab_file",
       "merge_file", "data_path", "split", "log_interval", "save_interval",
       "eval_interval", "eval_iters", "save", "load", "use_flash_attn",
       "apply_query_key_layer_scaling", "attention_softmax_in_fp32",
       "masked_softmax_fusion", "bias_gelu_fusion", "bias_dropout_fusion",
       "use_mcore_models", "transformer_impl", "distributed_backend",
       "recompute_activations", "recompute_granularity", "no_masked_softmax_fusion",
       "no_bias_gelu_fusion", "no_bias_dropout_fusion", "kv_channels"});
}

const char *const kMegatronOnly[] = {
    "group_query_attention", "normalization", "swiglu",
    "position_embedding_type", "untie_embeddings_and_output_weights",
    "add_bias_linear", "add_qkv_bias", "norm_epsilon", "padded_vocab_size",
    "kv_channels", "init_method_std", "openai_gelu", "global_batch_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "expert_model_parallel_size"};

} // namespace

bool mapp::translateConfigFormat(const json::Object &raw, ConfigTranslation &out,
                                 GPTConfigError &err,
                                 const GPTImportOptions &opts) {
  // Megatron's argparse names also come as "--num-layers".
  json::Object in;
  for (const auto &kv : raw) {
    std::string k = kv.first.str();
    if (llvm::StringRef(k).starts_with("--")) {
      k = k.substr(2);
      std::replace(k.begin(), k.end(), '-', '_');
    }
    in[k] = kv.second;
  }
  Translator t(in, out, err, opts);
  if (const json::Value *mt = t.take("model_type")) {
    std::optional<llvm::StringRef> s = mt->getAsString();
    out.format = s ? s->str() : show(*mt);
    if (s && *s == "gpt2")
      return translateGPT2(t);
    if (s && (*s == "llama" || *s == "mistral" || *s == "qwen2" ||
              *s == "mixtral" || *s == "phi3" || *s == "gemma" ||
              *s == "gemma2"))
      return translateLlama(t, *s);
    if (s && *s == "gpt_neox")
      return translateGPTNeoX(t);
    return t.fail("model_type",
                  show(*mt) + " is not supported (gpt2, llama, mistral, qwen2, "
                              "mixtral, phi3, gemma, gemma2, gpt_neox; or "
                              "Megatron-LM arguments)");
  }
  for (const char *k : kMegatronOnly)
    if (in.get(k) && !in.get("variant")) {
      out.format = "Megatron-LM";
      return translateMegatron(t);
    }
  out.format = "mapp";
  out.canonical = std::move(in);
  return true;
}
