"""Hugging Face checkpoint names <-> mapp parameter names.

    PYTHONPATH=python /usr/bin/python3 -m mapp.hf to-mapp --config cfg.json \\
        hf.safetensors mapp.safetensors
    PYTHONPATH=python /usr/bin/python3 -m mapp.hf to-hf --config cfg.json \\
        mapp.safetensors hf.safetensors

`--config` is the mapp (or HF/Megatron) config the mapp side was built from
(python/mapp/config.py rules). docs/models.md, "Checkpoints in Hugging Face
naming", has the tables. GPT-2 (GPT2LMHeadModel): Conv1D weights are stored
[in, out] and transposed here; c_attn is the fused [q | k | v], as mapp's
attn.qkv. LLaMA (LlamaForCausalLM): separate q/k/v projections, concatenated
into attn.qkv (or kept as attn.q/k/v for grouped-query models); HF's q_proj and
k_proj rows are already in the rotate-half order mapp uses (HF's conversion
script permuted Meta's interleaved pairs), so no permutation. mapp's padded
vocab rows are zeros on the way in and dropped on the way out; mapp's wpe has
seq_length rows (HF n_positions rows: the first seq_length are taken).
"""

import argparse
import sys

import torch

from . import safetensors
from .config import ConfigError, normalize_config


class MappingError(ValueError):
    pass


def _gpt2_layer(l):
    h, m = f"transformer.h.{l}.", f"layers.{l}."
    # (hf name, mapp name, transpose)
    return [(h + "ln_1.weight", m + "ln1.weight", False), (h + "ln_1.bias", m + "ln1.bias", False),
            (h + "attn.c_attn.weight", m + "attn.qkv.weight", True),
            (h + "attn.c_attn.bias", m + "attn.qkv.bias", False),
            (h + "attn.c_proj.weight", m + "attn.proj.weight", True),
            (h + "attn.c_proj.bias", m + "attn.proj.bias", False),
            (h + "ln_2.weight", m + "ln2.weight", False), (h + "ln_2.bias", m + "ln2.bias", False),
            (h + "mlp.c_fc.weight", m + "mlp.fc1.weight", True),
            (h + "mlp.c_fc.bias", m + "mlp.fc1.bias", False),
            (h + "mlp.c_proj.weight", m + "mlp.fc2.weight", True),
            (h + "mlp.c_proj.bias", m + "mlp.fc2.bias", False)]


def _llama_layer(l):
    h, m = f"model.layers.{l}.", f"layers.{l}."
    return [(h + "input_layernorm.weight", m + "ln1.weight", False),
            (h + "self_attn.o_proj.weight", m + "attn.proj.weight", False),
            (h + "post_attention_layernorm.weight", m + "ln2.weight", False),
            (h + "mlp.gate_proj.weight", m + "mlp.gate.weight", False),
            (h + "mlp.up_proj.weight", m + "mlp.up.weight", False),
            (h + "mlp.down_proj.weight", m + "mlp.down.weight", False)]


# Buffers some HF checkpoints carry that are not parameters.
_BUFFERS = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def _take(hf, name):
    if name not in hf:
        raise MappingError(f"Hugging Face checkpoint has no '{name}'")
    return hf.pop(name)


def hf_to_mapp(hf, config):
    """HF state dict -> mapp state dict (names, layouts, padding)."""
    cfg = normalize_config(config)
    hf = dict(hf)
    out = {}
    v, t = cfg["vocab_size"], cfg["seq_length"]

    def pad_vocab(w, name):
        if w.shape[0] > v:
            raise MappingError(f"'{name}' has {w.shape[0]} rows, more than vocab_size {v}")
        return torch.cat([w, w.new_zeros(v - w.shape[0], w.shape[1])]) if w.shape[0] < v else w

    if cfg["variant"] == "gpt":
        if cfg["num_query_groups"] != cfg["num_attention_heads"]:
            raise MappingError("GPT-2 checkpoints have no grouped-query attention")
        out["wte.weight"] = pad_vocab(_take(hf, "transformer.wte.weight"), "transformer.wte.weight")
        wpe = _take(hf, "transformer.wpe.weight")
        if wpe.shape[0] < t:
            raise MappingError(f"'transformer.wpe.weight' has {wpe.shape[0]} positions, "
                               f"fewer than seq_length {t}")
        out["wpe.weight"] = wpe[:t].clone()
        for l in range(cfg["num_layers"]):
            for hn, mn, tr in _gpt2_layer(l):
                w = _take(hf, hn)
                out[mn] = w.t().contiguous() if tr else w
        out["ln_f.weight"] = _take(hf, "transformer.ln_f.weight")
        out["ln_f.bias"] = _take(hf, "transformer.ln_f.bias")
        head = hf.pop("lm_head.weight", None)
        if not cfg["tie_embeddings"]:
            if head is None:
                raise MappingError("untied model but no 'lm_head.weight'")
            out["lm_head.weight"] = pad_vocab(head, "lm_head.weight")
    else:
        out["wte.weight"] = pad_vocab(_take(hf, "model.embed_tokens.weight"),
                                      "model.embed_tokens.weight")
        gqa = cfg["num_query_groups"] != cfg["num_attention_heads"]
        for l in range(cfg["num_layers"]):
            a = f"model.layers.{l}.self_attn."
            q, k, w = (_take(hf, a + f"{p}_proj.weight") for p in "qkv")
            if gqa:
                out.update({f"layers.{l}.attn.q.weight": q, f"layers.{l}.attn.k.weight": k,
                            f"layers.{l}.attn.v.weight": w})
            else:
                out[f"layers.{l}.attn.qkv.weight"] = torch.cat([q, k, w])
            for hn, mn, _ in _llama_layer(l):
                out[mn] = _take(hf, hn)
        out["ln_f.weight"] = _take(hf, "model.norm.weight")
        head = hf.pop("lm_head.weight", None)
        if not cfg["tie_embeddings"]:
            if head is None:
                raise MappingError("untied model but no 'lm_head.weight'")
            out["lm_head.weight"] = pad_vocab(head, "lm_head.weight")
    left = [k for k in hf if not k.endswith(_BUFFERS)]
    if left:
        raise MappingError(f"Hugging Face checkpoint has tensors mapp has no place for: "
                           f"{', '.join(sorted(left)[:5])}")
    return out


def mapp_to_hf(state, config, hf_vocab_size=None):
    """mapp state dict -> HF state dict; padded vocab rows dropped when
    hf_vocab_size (the HF config's vocab_size) is given."""
    cfg = normalize_config(config)
    st = dict(state)
    hv = hf_vocab_size or cfg["vocab_size"]
    out = {}
    take = lambda n: st.pop(n)
    if cfg["variant"] == "gpt":
        out["transformer.wte.weight"] = take("wte.weight")[:hv].contiguous()
        out["transformer.wpe.weight"] = take("wpe.weight")
        for l in range(cfg["num_layers"]):
            for hn, mn, tr in _gpt2_layer(l):
                w = take(mn)
                out[hn] = w.t().contiguous() if tr else w
        out["transformer.ln_f.weight"] = take("ln_f.weight")
        out["transformer.ln_f.bias"] = take("ln_f.bias")
        if not cfg["tie_embeddings"]:
            out["lm_head.weight"] = take("lm_head.weight")[:hv].contiguous()
    else:
        out["model.embed_tokens.weight"] = take("wte.weight")[:hv].contiguous()
        h, kv = cfg["hidden_size"], cfg["num_query_groups"] * (
            cfg["hidden_size"] // cfg["num_attention_heads"])
        for l in range(cfg["num_layers"]):
            a = f"model.layers.{l}.self_attn."
            if f"layers.{l}.attn.qkv.weight" in st:
                q, k, v = take(f"layers.{l}.attn.qkv.weight").split([h, kv, kv])
            else:
                q, k, v = (take(f"layers.{l}.attn.{p}.weight") for p in "qkv")
            for p, w in zip("qkv", (q, k, v)):
                out[a + f"{p}_proj.weight"] = w.contiguous()
            for hn, mn, _ in _llama_layer(l):
                out[hn] = take(mn)
        out["model.norm.weight"] = take("ln_f.weight")
        if not cfg["tie_embeddings"]:
            out["lm_head.weight"] = take("lm_head.weight")[:hv].contiguous()
    if st:
        raise MappingError(f"mapp parameters with no Hugging Face name: {', '.join(sorted(st)[:5])}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="mapp.hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("direction", choices=("to-mapp", "to-hf"))
    ap.add_argument("--config", required=True, help="the mapp model's config JSON")
    ap.add_argument("--hf-vocab-size", type=int, help="to-hf: drop padded vocab rows beyond it")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    try:
        import json
        config = json.load(open(a.config))
        tensors, _ = safetensors.load(a.src)
        if a.direction == "to-mapp":
            out = hf_to_mapp(tensors, config)
        else:
            out = mapp_to_hf(tensors, config, a.hf_vocab_size)
        safetensors.save(out, a.dst)
    except (MappingError, ConfigError, OSError, ValueError, KeyError) as e:
        print(f"mapp.hf: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
