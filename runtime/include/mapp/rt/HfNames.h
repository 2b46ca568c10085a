//===- HfNames.h - checkpoints in Hugging Face naming -----------*- C++ -*-===//
//
// mapp-run --weights-format hf: parameters named and laid out as Hugging
// Face's GPT2LMHeadModel (Conv1D weights stored [in, out], fused c_attn) or
// LlamaForCausalLM (separate q/k/v/o projections, rotate-half q/k rows),
// mapped to and from mapp's parameter names. The tables are in
// docs/models.md, "Checkpoints in Hugging Face naming"; python/mapp/hf.py is
// the same mapping for Python users.
//
// Tensors keep their dtype and bytes: a transpose or concatenation moves
// elements, never converts them, so mapp -> HF -> mapp is bit-identical.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_HFNAMES_H
#define MAPP_RT_HFNAMES_H

#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"

#include <map>
#include <optional>
#include <string>

namespace mapp::rt {

enum class WeightsFormat { Auto, Mapp, Hf };
/// "auto" | "mapp" | "hf"; false on anything else.
bool parseWeightsFormat(const std::string &s, WeightsFormat &out);

enum class HfStyle { Gpt2, Llama };
const char *hfStyleName(HfStyle s); // "GPT-2" | "LLaMA"

/// The style of a checkpoint under Hugging Face names (GPT-2's
/// "transformer.wte.weight", LLaMA's "model.embed_tokens.weight"), or none.
std::optional<HfStyle> detectHfCheckpoint(const Safetensors &st);

/// What an HF checkpoint had that mapp's parameters do not keep, so that a
/// save in HF naming gives the shapes back: the vocabulary rows before
/// mapp's padding and GPT-2's position rows past mapp's seq_length.
struct HfExtras {
  int64_t vocabRows = 0; ///< 0: keep every row mapp has
  std::optional<StTensor> positionsTail;
};

/// Every Param of every program in `plan`, by name, at its full shape.
std::map<std::string, Shape> planParamShapes(const Plan &plan);

/// An HF checkpoint -> mapp's names for a model whose parameters are
/// `want` (name -> full shape). Missing HF tensors, tensors mapp has no
/// place for, and shape mismatches are errors naming the tensor; `where`
/// (the file) prefixes them. Fills `extras` when given.
Safetensors hfToMapp(const Safetensors &hf,
                     const std::map<std::string, Shape> &want,
                     const std::string &where, HfExtras *extras = nullptr);

/// mapp's parameters -> HF names (style from the names: GPT-2 for LayerNorm
/// with biases and fc1/fc2, LLaMA for gate/up/down). `extras` trims the
/// vocabulary rows and appends position rows. An empty `st` (a rank that
/// gathered nothing) stays empty.
Safetensors mappToHf(const Safetensors &st, const HfExtras &extras = {});

/// mapp-run's --weights-format / --save-format: converts what --weights read
/// into mapp's names (detecting HF names under "auto") and what --save
/// writes into the save format, carrying HfExtras from the load to the save.
class CheckpointNaming {
public:
  /// `load`: Auto | Mapp | Hf; `save`: Mapp | Hf (Auto: as the load was
  /// given, mapp when that was Auto). `hfVocabRows` > 0: a save in HF names
  /// keeps that many vocabulary rows (mapp's padding dropped).
  CheckpointNaming(WeightsFormat load = WeightsFormat::Auto,
                   WeightsFormat save = WeightsFormat::Auto,
                   int64_t hfVocabRows = 0);
  /// `st` in mapp's names for `plan`'s parameters; `where` names the file.
  Safetensors toMapp(Safetensors st, const Plan &plan,
                     const std::string &where);
  /// mapp's parameters (full tensors) in the save format.
  Safetensors forSave(const Safetensors &st) const;
  /// True when the last toMapp found Hugging Face names.
  bool loadedHf() const { return loadedHf_; }

private:
  WeightsFormat load_, save_;
  int64_t hfVocabRows_;
  bool loadedHf_ = false;
  HfExtras extras_;
};

} // namespace mapp::rt

#endif
