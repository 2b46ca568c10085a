//===- HfNames.cpp - checkpoints in Hugging Face naming -------------------===//
//
// One rule per mapp parameter (name -> HF names and the layout change), used
// in both directions. The tables mirror docs/models.md, "Checkpoints in
// Hugging Face naming".
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/HfNames.h"

#include "mapp/rt/Error.h"
#include "mapp/rt/Shard.h"

#include <cstring>
#include <set>

using namespace mapp::rt;

bool mapp::rt::parseWeightsFormat(const std::string &s, WeightsFormat &out) {
  if (s == "auto")
    out = WeightsFormat::Auto;
  else if (s == "mapp")
    out = WeightsFormat::Mapp;
  else if (s == "hf")
    out = WeightsFormat::Hf;
  else
    return false;
  return true;
}

const char *mapp::rt::hfStyleName(HfStyle s) {
  return s == HfStyle::Gpt2 ? "GPT-2" : "LLaMA";
}

std::optional<HfStyle> mapp::rt::detectHfCheckpoint(const Safetensors &st) {
  if (st.tensors.count("transformer.wte.weight"))
    return HfStyle::Gpt2;
  if (st.tensors.count("model.embed_tokens.weight"))
    return HfStyle::Llama;
  return std::nullopt;
}

std::map<std::string, Shape> mapp::rt::planParamShapes(const Plan &plan) {
  std::map<std::string, Shape> out;
  for (const Program &p : plan.programs)
    for (const Value &v : p.values) {
      if (v.kind != ValueKind::Param || out.count(v.name))
        continue;
      int n = shardGroupSize(plan, p, v);
      out[v.name] = fullShapeOf(v, n);
    }
  return out;
}

namespace {

//===----------------------------------------------------------------------===//
// Layout moves on raw elements (any dtype, bytes unchanged)
//===----------------------------------------------------------------------===//

size_t rowBytes(const StTensor &t) {
  size_t n = dtypeSize(t.dtype);
  for (size_t i = 1; i < t.shape.size(); ++i)
    n *= static_cast<size_t>(t.shape[i]);
  return n;
}

StTensor transpose2d(const StTensor &t, const std::string &name) {
  if (t.shape.size() != 2)
    fail("'", name, "' has shape ", shapeStr(t.shape),
         ", a matrix was expected (Conv1D weight)");
  const int64_t r = t.shape[0], c = t.shape[1];
  const size_t e = dtypeSize(t.dtype);
  StTensor out;
  out.dtype = t.dtype;
  out.shape = {c, r};
  out.data.resize(t.data.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(&out.data[(j * r + i) * e], &t.data[(i * c + j) * e], e);
  return out;
}

/// Rows [begin, end) of `t`.
StTensor rows(const StTensor &t, int64_t begin, int64_t end) {
  StTensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.shape[0] = end - begin;
  const size_t rb = rowBytes(t);
  out.data.assign(t.data.begin() + begin * rb, t.data.begin() + end * rb);
  return out;
}

/// `parts` stacked along dim 0 (one dtype, one row shape).
StTensor catRows(const std::vector<const StTensor *> &parts,
                 const std::vector<std::string> &names) {
  StTensor out = *parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const StTensor &p = *parts[i];
    Shape a(out.shape.begin() + 1, out.shape.end()),
        b(p.shape.begin() + 1, p.shape.end());
    if (p.dtype != out.dtype || a != b || p.shape.empty())
      fail("'", names[i], "' (", dtypeName(p.dtype), " ", shapeStr(p.shape),
           ") cannot be stacked under '", names[0], "' (",
           dtypeName(parts[0]->dtype), " ", shapeStr(parts[0]->shape), ")");
    out.shape[0] += p.shape[0];
    out.data.insert(out.data.end(), p.data.begin(), p.data.end());
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The rules
//===----------------------------------------------------------------------===//

enum class Move {
  Same,      ///< the tensor as it is
  Transpose, ///< GPT-2's Conv1D [in, out] <-> mapp's linear [out, in]
  CatRows,   ///< LLaMA's q_proj, k_proj, v_proj stacked as mapp's fused qkv
  Vocab,     ///< HF's vocabulary rows, zero-padded to mapp's padded vocab
  Positions, ///< GPT-2's n_positions rows, the first seq_length in mapp
};

struct Rule {
  std::vector<std::string> hf;
  Move move = Move::Same;
};

struct LayerRule {
  const char *mapp;
  std::vector<const char *> hf;
  Move move;
};

// Per-layer rules; the HF names follow transformer.h.L. / model.layers.L.
const std::vector<LayerRule> &gpt2Layer() {
  static const std::vector<LayerRule> t = {
      {"ln1.weight", {"ln_1.weight"}, Move::Same},
      {"ln1.bias", {"ln_1.bias"}, Move::Same},
      {"attn.qkv.weight", {"attn.c_attn.weight"}, Move::Transpose},
      {"attn.qkv.bias", {"attn.c_attn.bias"}, Move::Same},
      {"attn.proj.weight", {"attn.c_proj.weight"}, Move::Transpose},
      {"attn.proj.bias", {"attn.c_proj.bias"}, Move::Same},
      {"ln2.weight", {"ln_2.weight"}, Move::Same},
      {"ln2.bias", {"ln_2.bias"}, Move::Same},
      {"mlp.fc1.weight", {"mlp.c_fc.weight"}, Move::Transpose},
      {"mlp.fc1.bias", {"mlp.c_fc.bias"}, Move::Same},
      {"mlp.fc2.weight", {"mlp.c_proj.weight"}, Move::Transpose},
      {"mlp.fc2.bias", {"mlp.c_proj.bias"}, Move::Same},
  };
  return t;
}

const std::vector<LayerRule> &llamaLayer() {
  static const std::vector<LayerRule> t = {
      {"ln1.weight", {"input_layernorm.weight"}, Move::Same},
      {"attn.qkv.weight",
       {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight"},
       Move::CatRows},
      {"attn.q.weight", {"self_attn.q_proj.weight"}, Move::Same},
      {"attn.k.weight", {"self_attn.k_proj.weight"}, Move::Same},
      {"attn.v.weight", {"self_attn.v_proj.weight"}, Move::Same},
      {"attn.proj.weight", {"self_attn.o_proj.weight"}, Move::Same},
      {"ln2.weight", {"post_attention_layernorm.weight"}, Move::Same},
      {"mlp.gate.weight", {"mlp.gate_proj.weight"}, Move::Same},
      {"mlp.up.weight", {"mlp.up_proj.weight"}, Move::Same},
      {"mlp.down.weight", {"mlp.down_proj.weight"}, Move::Same},
  };
  return t;
}

/// Tensors some HF checkpoints carry that are buffers, not parameters.
bool isBuffer(const std::string &n) {
  auto ends = [&](const char *s) {
    size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") ||
         ends("rotary_emb.inv_freq");
}

std::optional<Rule> ruleFor(HfStyle style, const std::string &name) {
  const bool gpt2 = style == HfStyle::Gpt2;
  if (name.rfind("layers.", 0) == 0) {
    size_t dot = name.find('.', 7);
    if (dot == std::string::npos || dot == 7)
      return std::nullopt;
    std::string layer = name.substr(7, dot - 7), rest = name.substr(dot + 1);
    if (layer.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    std::string prefix =
        gpt2 ? "transformer.h." + layer + "." : "model.layers." + layer + ".";
    for (const LayerRule &r : gpt2 ? gpt2Layer() : llamaLayer())
      if (rest == r.mapp) {
        Rule out;
        out.move = r.move;
        for (const char *h : r.hf)
          out.hf.push_back(prefix + h);
        return out;
      }
    return std::nullopt;
  }
  if (name == "wte.weight")
    return Rule{{gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight"},
                Move::Vocab};
  if (name == "lm_head.weight")
    return Rule{{"lm_head.weight"}, Move::Vocab};
  if (gpt2 && name == "wpe.weight")
    return Rule{{"transformer.wpe.weight"}, Move::Positions};
  if (gpt2 && (name == "ln_f.weight" || name == "ln_f.bias"))
    return Rule{{"transformer." + name}, Move::Same};
  if (!gpt2 && name == "ln_f.weight")
    return Rule{{"model.norm.weight"}, Move::Same};
  return std::nullopt;
}

std::string joinFirst(const std::vector<std::string> &names, size_t most) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i)
    s += (i ? ", " : "") + names[i];
  if (names.size() > most)
    s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

} // namespace

Safetensors mapp::rt::hfToMapp(const Safetensors &hf,
                               const std::map<std::string, Shape> &want,
                               const std::string &where, HfExtras *extras) {
  std::optional<HfStyle> style = detectHfCheckpoint(hf);
  if (!style)
    fail(where, ": not a Hugging Face GPT-2 or LLaMA checkpoint (no "
                "'transformer.wte.weight' or 'model.embed_tokens.weight')");
  const char *styleName = hfStyleName(*style);
  std::set<std::string> used;
  Safetensors out;
  out.metadata = hf.metadata;
  HfExtras seen;
  for (const auto &[name, shape] : want) {
    std::optional<Rule> rule = ruleFor(*style, name);
    if (!rule)
      fail(where, ": mapp parameter '", name, "' ", shapeStr(shape),
           " has no counterpart in a Hugging Face ", styleName,
           " checkpoint (docs/models.md, \"Checkpoints in Hugging Face "
           "naming\")");
    std::vector<const StTensor *> parts;
    for (const std::string &h : rule->hf) {
      auto it = hf.tensors.find(h);
      if (it == hf.tensors.end())
        fail(where, ": Hugging Face checkpoint has no '", h, "' (for mapp's '",
             name, "')");
      used.insert(h);
      parts.push_back(&it->second);
    }
    const StTensor &t = *parts[0];
    const std::string &h = rule->hf[0];
    StTensor got;
    switch (rule->move) {
    case Move::Same:
      got = t;
      break;
    case Move::Transpose:
      got = transpose2d(t, h);
      break;
    case Move::CatRows:
      got = catRows(parts, rule->hf);
      break;
    case Move::Vocab:
      if (t.shape.size() != 2 || shape.size() != 2 || t.shape[1] != shape[1] ||
          t.shape[0] > shape[0])
        fail(where, ": '", h, "' has shape ", shapeStr(t.shape), ", mapp's '",
             name, "' is ", shapeStr(shape),
             " (vocabulary rows may be fewer: padding rows are zeros)");
      got = t;
      got.shape[0] = shape[0];
      got.data.resize(static_cast<size_t>(shape[0]) * rowBytes(t), 0);
      if (seen.vocabRows && seen.vocabRows != t.shape[0])
        fail(where, ": '", h, "' has ", t.shape[0],
             " vocabulary rows, the embedding ", seen.vocabRows);
      seen.vocabRows = t.shape[0];
      break;
    case Move::Positions:
      if (t.shape.size() != 2 || shape.size() != 2 || t.shape[1] != shape[1] ||
          t.shape[0] < shape[0])
        fail(where, ": '", h, "' has shape ", shapeStr(t.shape), ", mapp's '",
             name, "' is ", shapeStr(shape), " (", t.shape[0],
             " positions, fewer than seq_length ", shape.size() == 2 ? shape[0] : 0,
             ", or another width)");
      got = rows(t, 0, shape[0]);
      if (t.shape[0] > shape[0])
        seen.positionsTail = rows(t, shape[0], t.shape[0]);
      break;
    }
    if (got.shape != shape)
      fail(where, ": '", joinFirst(rule->hf, 3), "' give shape ",
           shapeStr(got.shape), " for mapp's '", name, "', the plan needs ",
           shapeStr(shape));
    out.tensors[name] = std::move(got);
  }
  // A tied model has no head of its own: an HF file may still carry one
  // (the same tensor saved twice); a different one would be dropped silently.
  if (!want.count("lm_head.weight")) {
    auto head = hf.tensors.find("lm_head.weight");
    if (head != hf.tensors.end()) {
      const StTensor &emb = hf.tensors.at(
          *style == HfStyle::Gpt2 ? "transformer.wte.weight"
                                  : "model.embed_tokens.weight");
      if (head->second.shape != emb.shape || head->second.dtype != emb.dtype ||
          head->second.data != emb.data)
        fail(where, ": 'lm_head.weight' differs from the token embedding, but "
                    "the plan's model ties them (tie_embeddings): compile it "
                    "untied");
      used.insert("lm_head.weight");
    }
  }
  std::vector<std::string> left;
  for (const auto &[h, t] : hf.tensors)
    if (!used.count(h) && !isBuffer(h))
      left.push_back(h);
  if (!left.empty())
    fail(where, ": Hugging Face tensors mapp's model has no place for: ",
         joinFirst(left, 5));
  if (extras)
    *extras = std::move(seen);
  return out;
}

Safetensors mapp::rt::mappToHf(const Safetensors &st, const HfExtras &extras) {
  Safetensors out;
  out.metadata = st.metadata;
  if (st.tensors.empty())
    return out;
  std::optional<HfStyle> style;
  for (const auto &[name, t] : st.tensors) {
    if (name.find(".mlp.fc1.") != std::string::npos || name == "wpe.weight")
      style = HfStyle::Gpt2;
    else if (name.find(".mlp.gate.") != std::string::npos)
      style = HfStyle::Llama;
    if (style)
      break;
  }
  if (!style)
    fail("--weights-format hf: the parameters are neither GPT-2's (mlp.fc1, "
         "wpe) nor LLaMA's (mlp.gate) shape");
  for (const auto &[name, t] : st.tensors) {
    std::optional<Rule> rule = ruleFor(*style, name);
    if (!rule)
      fail("--weights-format hf: mapp parameter '", name, "' ",
           shapeStr(t.shape), " has no counterpart in a Hugging Face ",
           hfStyleName(*style), " checkpoint");
    const std::string &h = rule->hf[0];
    switch (rule->move) {
    case Move::Same:
      out.tensors[h] = t;
      break;
    case Move::Transpose:
      out.tensors[h] = transpose2d(t, name);
      break;
    case Move::CatRows: {
      // q has hidden rows (as many as its columns); k and v share the rest.
      if (t.shape.size() != 2 || (t.shape[0] - t.shape[1]) % 2 ||
          t.shape[0] <= t.shape[1])
        fail("--weights-format hf: '", name, "' ", shapeStr(t.shape),
             " is not [hidden + 2·kv, hidden]");
      int64_t q = t.shape[1], kv = (t.shape[0] - q) / 2;
      out.tensors[rule->hf[0]] = rows(t, 0, q);
      out.tensors[rule->hf[1]] = rows(t, q, q + kv);
      out.tensors[rule->hf[2]] = rows(t, q + kv, q + 2 * kv);
      break;
    }
    case Move::Vocab:
      if (extras.vocabRows && extras.vocabRows > t.shape[0])
        fail("--weights-format hf: ", extras.vocabRows,
             " vocabulary rows asked, '", name, "' has ", t.shape[0]);
      out.tensors[h] =
          extras.vocabRows ? rows(t, 0, extras.vocabRows) : t;
      break;
    case Move::Positions:
      if (extras.positionsTail) {
        StTensor tail = *extras.positionsTail;
        // mapp saves f32; rows kept from a bf16/f16 file widen exactly.
        if (tail.dtype != t.dtype && t.dtype == DType::F32)
          tail = StTensor::fromF32(tail.shape, tail.toF32(h).data());
        if (tail.dtype != t.dtype || tail.shape.size() != 2 ||
            tail.shape[1] != t.shape[1])
          fail("--weights-format hf: the position rows kept from --weights (",
               dtypeName(tail.dtype), " ", shapeStr(tail.shape),
               ") do not fit '", name, "' (", dtypeName(t.dtype), " ",
               shapeStr(t.shape), ")");
        out.tensors[h] = catRows({&t, &tail}, {name, h + " (rows kept)"});
      } else {
        out.tensors[h] = t;
      }
      break;
    }
  }
  return out;
}

CheckpointNaming::CheckpointNaming(WeightsFormat load, WeightsFormat save,
                                   int64_t hfVocabRows)
    : load_(load), save_(save), hfVocabRows_(hfVocabRows) {
  if (save_ == WeightsFormat::Auto)
    save_ = load_ == WeightsFormat::Hf ? WeightsFormat::Hf : WeightsFormat::Mapp;
}

Safetensors CheckpointNaming::toMapp(Safetensors st, const Plan &plan,
                                     const std::string &where) {
  std::map<std::string, Shape> want = planParamShapes(plan);
  bool hf = load_ == WeightsFormat::Hf;
  if (load_ == WeightsFormat::Auto && detectHfCheckpoint(st)) {
    // A model of its own written with HF-like names (nanoGPT's
    // transformer.wte.weight, ...) whose names are the plan's is mapp's.
    bool planNames = true;
    for (const auto &[name, shape] : want)
      planNames = planNames && st.tensors.count(name);
    hf = !planNames;
  }
  loadedHf_ = hf;
  if (!hf)
    return st;
  return hfToMapp(st, want, where, &extras_);
}

Safetensors CheckpointNaming::forSave(const Safetensors &st) const {
  if (save_ != WeightsFormat::Hf)
    return st;
  HfExtras e = extras_;
  if (hfVocabRows_ > 0)
    e.vocabRows = hfVocabRows_;
  return mappToHf(st, e);
}
