"""Hugging Face checkpoint names <-> mapp parameter names for the model
families `mapp-translate --import-gpt-config` builds from their own
config.json (docs/models.md, "Model families"): qwen2, mistral, mixtral,
gemma, gemma2, phi3, gpt_neox (and llama).

    PYTHONPATH=python /usr/bin/python3 -m mapp.hf_families to-mapp \\
        --config config.json hf.safetensors mapp.safetensors
    PYTHONPATH=python /usr/bin/python3 -m mapp.hf_families to-hf \\
        --config config.json mapp.safetensors hf.safetensors

`--config` is the HF config.json the mapp model was imported from; the
mapp vocabulary may be padded (`--vocab-size`, the padded size; zeros in,
dropped on the way out). Every conversion moves elements only (concatenation,
row permutation, transposes), so mapp -> HF -> mapp is bit-identical.
A missing tensor, a tensor of the wrong shape, or one mapp has no place for is
an error naming the tensor.
"""

import argparse
import json
import sys

import torch

from . import safetensors

FAMILIES = ("llama", "mistral", "qwen2", "mixtral", "phi3", "gemma", "gemma2", "gpt_neox")
# Non-parameter buffers some checkpoints carry.
_BUFFERS = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")


class MappingError(ValueError):
    pass


class Shape:
    """The sizes the mapping needs, from the HF config."""

    def __init__(self, cfg, vocab_size=None):
        mt = cfg.get("model_type")
        if mt not in FAMILIES:
            raise MappingError(f"config key 'model_type': {mt!r} is not one of "
                               f"{', '.join(FAMILIES)}")
        self.family = mt
        self.layers = cfg["num_hidden_layers"]
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.ffn = cfg["intermediate_size"]
        self.hf_vocab = cfg["vocab_size"]
        self.vocab = vocab_size or self.hf_vocab
        if self.vocab < self.hf_vocab:
            raise MappingError(f"--vocab-size {self.vocab} is smaller than the "
                               f"config's vocab_size {self.hf_vocab}")
        self.gqa = self.kv_heads != self.heads
        self.experts = cfg.get("num_local_experts") if mt == "mixtral" else None
        gemma = mt in ("gemma", "gemma2")
        self.tied = cfg.get("tie_word_embeddings", gemma)


def _expect(t, name, shape):
    if list(t.shape) != list(shape):
        raise MappingError(f"Hugging Face tensor '{name}' has shape {list(t.shape)}, "
                           f"mapp needs {list(shape)}")
    return t


def hf_to_mapp(hf, cfg, vocab_size=None):
    """HF state dict -> mapp state dict for the model imported from `cfg`."""
    s = Shape(cfg, vocab_size)
    hf = dict(hf)
    out = {}
    H, QW, KV, F = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.ffn

    def take(name, shape):
        if name not in hf:
            raise MappingError(f"Hugging Face checkpoint has no '{name}'")
        return _expect(hf.pop(name), name, shape)

    def vocab(name):
        w = take(name, [s.hf_vocab, H])
        pad = s.vocab - s.hf_vocab
        return torch.cat([w, w.new_zeros(pad, H)]) if pad else w

    def attention(l, m, q, k, v, suffix):
        if s.gqa:
            out.update({m + f"attn.q.{suffix}": q, m + f"attn.k.{suffix}": k,
                        m + f"attn.v.{suffix}": v})
        else:
            out[m + f"attn.qkv.{suffix}"] = torch.cat([q, k, v])

    if s.family == "gpt_neox":
        g = "gpt_neox."
        out["wte.weight"] = vocab(g + "embed_in.weight")
        D = s.head_dim
        for l in range(s.layers):
            h, m = f"{g}layers.{l}.", f"layers.{l}."
            for hn, mn in (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")):
                for p in ("weight", "bias"):
                    out[f"{m}{mn}.{p}"] = take(f"{h}{hn}.{p}", [H])
            # [heads, (q|k|v), D] rows -> mapp's [q | k | v].
            w = take(h + "attention.query_key_value.weight", [3 * H, H])
            b = take(h + "attention.query_key_value.bias", [3 * H])
            out[m + "attn.qkv.weight"] = w.view(s.heads, 3, D, H).transpose(0, 1).reshape(3 * H, H)
            out[m + "attn.qkv.bias"] = b.view(s.heads, 3, D).transpose(0, 1).reshape(3 * H)
            out[m + "attn.proj.weight"] = take(h + "attention.dense.weight", [H, H])
            out[m + "attn.proj.bias"] = take(h + "attention.dense.bias", [H])
            out[m + "mlp.fc1.weight"] = take(h + "mlp.dense_h_to_4h.weight", [F, H])
            out[m + "mlp.fc1.bias"] = take(h + "mlp.dense_h_to_4h.bias", [F])
            out[m + "mlp.fc2.weight"] = take(h + "mlp.dense_4h_to_h.weight", [H, F])
            out[m + "mlp.fc2.bias"] = take(h + "mlp.dense_4h_to_h.bias", [H])
        out["ln_f.weight"] = take(g + "final_layer_norm.weight", [H])
        out["ln_f.bias"] = take(g + "final_layer_norm.bias", [H])
        head = "embed_out.weight"
    else:
        out["wte.weight"] = vocab("model.embed_tokens.weight")
        for l in range(s.layers):
            h, m = f"model.layers.{l}.", f"layers.{l}."
            out[m + "ln1.weight"] = take(h + "input_layernorm.weight", [H])
            a = h + "self_attn."
            if s.family == "phi3":
                q, k, v = take(a + "qkv_proj.weight", [QW + 2 * KV, H]).split([QW, KV, KV])
            else:
                q, k, v = (take(a + f"{p}_proj.weight", [n, H])
                           for p, n in zip("qkv", (QW, KV, KV)))
            attention(l, m, q, k, v, "weight")
            if s.family == "qwen2":
                qb, kb, vb = (take(a + f"{p}_proj.bias", [n]) for p, n in zip("qkv", (QW, KV, KV)))
                attention(l, m, qb, kb, vb, "bias")
            out[m + "attn.proj.weight"] = take(a + "o_proj.weight", [H, QW])
            if s.family == "gemma2":
                out[m + "ln_post_attn.weight"] = take(h + "post_attention_layernorm.weight", [H])
                out[m + "ln2.weight"] = take(h + "pre_feedforward_layernorm.weight", [H])
                out[m + "ln_post_mlp.weight"] = take(h + "post_feedforward_layernorm.weight", [H])
            else:
                out[m + "ln2.weight"] = take(h + "post_attention_layernorm.weight", [H])
            if s.family == "mixtral":
                moe, E = h + "block_sparse_moe.", s.experts
                out[m + "mlp.router.weight"] = take(moe + "gate.weight", [E, H])
                # experts.N.w1 (gate) / w3 (up) [F, H], w2 (down) [H, F] ->
                # mapp's grouped [E, in, out].
                for mn, hn, shape in (("gate", "w1", [F, H]), ("up", "w3", [F, H]),
                                      ("down", "w2", [H, F])):
                    out[m + f"mlp.experts.{mn}.weight"] = torch.stack(
                        [take(f"{moe}experts.{e}.{hn}.weight", shape).t() for e in range(E)])
            elif s.family == "phi3":
                gate, up = take(h + "mlp.gate_up_proj.weight", [2 * F, H]).split([F, F])
                out[m + "mlp.gate.weight"], out[m + "mlp.up.weight"] = gate, up
                out[m + "mlp.down.weight"] = take(h + "mlp.down_proj.weight", [H, F])
            else:
                for p, shape in (("gate", [F, H]), ("up", [F, H]), ("down", [H, F])):
                    out[m + f"mlp.{p}.weight"] = take(h + f"mlp.{p}_proj.weight", shape)
        out["ln_f.weight"] = take("model.norm.weight", [H])
        head = "lm_head.weight"
    if s.tied:
        if head in hf:
            w = hf.pop(head)
            if not torch.equal(w, out["wte.weight"][:s.hf_vocab]):
                raise MappingError(f"tied model, but '{head}' differs from the embedding "
                                   "(import the config with tie_word_embeddings false)")
    else:
        out["lm_head.weight"] = vocab(head)
    left = sorted(k for k in hf if not k.endswith(_BUFFERS))
    if left:
        raise MappingError("Hugging Face tensors mapp's model has no place for: "
                           + ", ".join(left[:5]))
    return {k: v.contiguous() for k, v in out.items()}


def mapp_to_hf(state, cfg, vocab_size=None):
    """mapp state dict -> HF state dict (padded vocabulary rows dropped)."""
    s = Shape(cfg, vocab_size)
    st = dict(state)
    out = {}
    H, QW, KV, F, D = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.ffn, s.head_dim

    def take(name):
        if name not in st:
            raise MappingError(f"mapp checkpoint has no '{name}'")
        return st.pop(name)

    def qkv(m, suffix):
        if s.gqa:
            return tuple(take(m + f"attn.{p}.{suffix}") for p in "qkv")
        return take(m + f"attn.qkv.{suffix}").split([QW, KV, KV])

    if s.family == "gpt_neox":
        g = "gpt_neox."
        out[g + "embed_in.weight"] = take("wte.weight")[:s.hf_vocab]
        for l in range(s.layers):
            h, m = f"{g}layers.{l}.", f"layers.{l}."
            for hn, mn in (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")):
                for p in ("weight", "bias"):
                    out[f"{h}{hn}.{p}"] = take(f"{m}{mn}.{p}")
            w, b = take(m + "attn.qkv.weight"), take(m + "attn.qkv.bias")
            out[h + "attention.query_key_value.weight"] = \
                w.view(3, s.heads, D, H).transpose(0, 1).reshape(3 * H, H)
            out[h + "attention.query_key_value.bias"] = \
                b.view(3, s.heads, D).transpose(0, 1).reshape(3 * H)
            out[h + "attention.dense.weight"] = take(m + "attn.proj.weight")
            out[h + "attention.dense.bias"] = take(m + "attn.proj.bias")
            out[h + "mlp.dense_h_to_4h.weight"] = take(m + "mlp.fc1.weight")
            out[h + "mlp.dense_h_to_4h.bias"] = take(m + "mlp.fc1.bias")
            out[h + "mlp.dense_4h_to_h.weight"] = take(m + "mlp.fc2.weight")
            out[h + "mlp.dense_4h_to_h.bias"] = take(m + "mlp.fc2.bias")
        out[g + "final_layer_norm.weight"] = take("ln_f.weight")
        out[g + "final_layer_norm.bias"] = take("ln_f.bias")
        head = "embed_out.weight"
    else:
        out["model.embed_tokens.weight"] = take("wte.weight")[:s.hf_vocab]
        for l in range(s.layers):
            h, m = f"model.layers.{l}.", f"layers.{l}."
            a = h + "self_attn."
            out[h + "input_layernorm.weight"] = take(m + "ln1.weight")
            q, k, v = qkv(m, "weight")
            if s.family == "phi3":
                out[a + "qkv_proj.weight"] = torch.cat([q, k, v])
            else:
                out.update({a + "q_proj.weight": q, a + "k_proj.weight": k,
                            a + "v_proj.weight": v})
            if s.family == "qwen2":
                qb, kb, vb = qkv(m, "bias")
                out.update({a + "q_proj.bias": qb, a + "k_proj.bias": kb,
                            a + "v_proj.bias": vb})
            out[a + "o_proj.weight"] = take(m + "attn.proj.weight")
            if s.family == "gemma2":
                out[h + "post_attention_layernorm.weight"] = take(m + "ln_post_attn.weight")
                out[h + "pre_feedforward_layernorm.weight"] = take(m + "ln2.weight")
                out[h + "post_feedforward_layernorm.weight"] = take(m + "ln_post_mlp.weight")
            else:
                out[h + "post_attention_layernorm.weight"] = take(m + "ln2.weight")
            if s.family == "mixtral":
                moe = h + "block_sparse_moe."
                out[moe + "gate.weight"] = take(m + "mlp.router.weight")
                for mn, hn in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                    w = take(m + f"mlp.experts.{mn}.weight")
                    for e in range(s.experts):
                        out[f"{moe}experts.{e}.{hn}.weight"] = w[e].t()
            elif s.family == "phi3":
                out[h + "mlp.gate_up_proj.weight"] = torch.cat(
                    [take(m + "mlp.gate.weight"), take(m + "mlp.up.weight")])
                out[h + "mlp.down_proj.weight"] = take(m + "mlp.down.weight")
            else:
                for p in ("gate", "up", "down"):
                    out[h + f"mlp.{p}_proj.weight"] = take(m + f"mlp.{p}.weight")
        out["model.norm.weight"] = take("ln_f.weight")
        head = "lm_head.weight"
    if not s.tied:
        out[head] = take("lm_head.weight")[:s.hf_vocab]
    if st:
        raise MappingError("mapp parameters with no Hugging Face name: "
                           + ", ".join(sorted(st)[:5]))
    return {k: v.contiguous() for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="mapp.hf_families",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("direction", choices=("to-mapp", "to-hf"))
    ap.add_argument("--config", required=True, help="the model's HF config.json")
    ap.add_argument("--vocab-size", type=int,
                    help="mapp's (padded) vocabulary size, if larger than the config's")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    try:
        with open(a.config) as f:
            cfg = json.load(f)
        tensors, _ = safetensors.load(a.src)
        convert = hf_to_mapp if a.direction == "to-mapp" else mapp_to_hf
        safetensors.save(convert(tensors, cfg, a.vocab_size), a.dst)
    except (MappingError, OSError, ValueError, KeyError) as e:
        print(f"mapp.hf_families: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
