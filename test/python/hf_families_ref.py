"""Small configs of the Hugging Face families (the keys of each family's
published config.json, tiny sizes), random checkpoints under HF's names, and
an independent forward of each family written from HF's model descriptions
(modeling_qwen2/mistral/mixtral/gemma/gemma2/phi3/gpt_neox), in plain torch
on the HF-named tensors. test_hf_families.py checks mapp against it;
bench/gpu/hf_oracle.py reuses the configs with transformers itself."""

import math

import torch
import torch.nn.functional as F

V = 256  # mapp-run's byte tokenizer
COMMON = {"hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 64,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": V,
          "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32"}

SMALL = {
    # Qwen2.5-0.5B-like: q/k/v biases, large rope theta, tied, GQA.
    "qwen2": dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  attention_dropout=0.0, bos_token_id=151643, eos_token_id=151643,
                  hidden_act="silu", max_window_layers=2, num_key_value_heads=2,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=64,
                  tie_word_embeddings=True, transformers_version="4.43.1",
                  use_sliding_window=False),
    # Mistral-7B-v0.1-like: sliding window shorter than the sequence.
    "mistral": dict(COMMON, architectures=["MistralForCausalLM"], model_type="mistral",
                    bos_token_id=1, eos_token_id=2, hidden_act="silu",
                    num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=6, tie_word_embeddings=False,
                    transformers_version="4.34.0.dev0"),
    # Mixtral-8x7B-like: 4 experts, top-2.
    "mixtral": dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
                    hidden_act="silu", num_experts_per_tok=2, num_key_value_heads=2,
                    num_local_experts=4, output_router_logits=False, rms_norm_eps=1e-5,
                    rope_theta=1000000.0, router_aux_loss_coef=0.02, sliding_window=None,
                    tie_word_embeddings=False, transformers_version="4.36.0.dev0"),
    # Gemma-2B-like: multi-query, head_dim 16 with 4 heads (64 != hidden 32).
    "gemma": dict(COMMON, architectures=["GemmaForCausalLM"], model_type="gemma",
                  attention_bias=False, attention_dropout=0.0, bos_token_id=2,
                  eos_token_id=1, head_dim=16, hidden_act="gelu_pytorch_tanh",
                  hidden_activation="gelu_pytorch_tanh", num_key_value_heads=1,
                  pad_token_id=0, rms_norm_eps=1e-6, rope_scaling=None,
                  rope_theta=10000.0, transformers_version="4.38.0"),
    # Gemma-2-9B-like; caps small enough that tanh bends the scores.
    "gemma2": dict(COMMON, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                   attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=2.0,
                   bos_token_id=2, cache_implementation="hybrid", eos_token_id=1,
                   final_logit_softcapping=3.0, head_dim=16,
                   hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                   num_key_value_heads=2, pad_token_id=0, query_pre_attn_scalar=12,
                   rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=6,
                   transformers_version="4.42.0"),
    # Phi-3-mini-like: fused qkv_proj / gate_up_proj, sliding window.
    "phi3": dict(COMMON, architectures=["Phi3ForCausalLM"], model_type="phi3",
                 attention_bias=False, attention_dropout=0.0, bos_token_id=1,
                 embd_pdrop=0.0, eos_token_id=32000, hidden_act="silu",
                 num_key_value_heads=4, original_max_position_embeddings=64,
                 pad_token_id=32000, resid_pdrop=0.0, rms_norm_eps=1e-5, rope_scaling=None,
                 rope_theta=10000.0, sliding_window=7, tie_word_embeddings=False,
                 transformers_version="4.40.2"),
    # Pythia-like: parallel residual, rotary on a quarter of each head.
    "gpt_neox": dict(COMMON, architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox",
                     bos_token_id=0, eos_token_id=0, hidden_act="gelu",
                     intermediate_size=128, layer_norm_eps=1e-5, rotary_emb_base=10000,
                     rotary_pct=0.25, tie_word_embeddings=False,
                     transformers_version="4.24.0", use_parallel_residual=True),
}


def dims(cfg):
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // n
    return h, n, cfg.get("num_key_value_heads") or n, d, cfg["intermediate_size"]


def checkpoint(cfg, gen, std=0.2):
    """Random tensors under HF's names for the family of `cfg`."""
    h, n, g, d, f = dims(cfg)
    fam, L = cfg["model_type"], cfg["num_hidden_layers"]
    r = lambda *s: torch.randn(*s, generator=gen) * std
    # Norm gains near their identity (Gemma stores gain - 1).
    gain = lambda: (0.0 if fam in ("gemma", "gemma2") else 1.0) + r(h)
    sd = {}
    if fam == "gpt_neox":
        sd["gpt_neox.embed_in.weight"] = r(V, h)
        for l in range(L):
            p = f"gpt_neox.layers.{l}."
            for ln in ("input_layernorm", "post_attention_layernorm"):
                sd[p + ln + ".weight"], sd[p + ln + ".bias"] = gain(), r(h)
            sd[p + "attention.query_key_value.weight"] = r(3 * h, h)
            sd[p + "attention.query_key_value.bias"] = r(3 * h)
            sd[p + "attention.dense.weight"], sd[p + "attention.dense.bias"] = r(h, h), r(h)
            sd[p + "mlp.dense_h_to_4h.weight"], sd[p + "mlp.dense_h_to_4h.bias"] = r(f, h), r(f)
            sd[p + "mlp.dense_4h_to_h.weight"], sd[p + "mlp.dense_4h_to_h.bias"] = r(h, f), r(h)
        sd["gpt_neox.final_layer_norm.weight"] = gain()
        sd["gpt_neox.final_layer_norm.bias"] = r(h)
        sd["embed_out.weight"] = r(V, h)
        return sd
    sd["model.embed_tokens.weight"] = r(V, h)
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        sd[p + "input_layernorm.weight"] = gain()
        if fam == "phi3":
            sd[a + "qkv_proj.weight"] = r(n * d + 2 * g * d, h)
        else:
            for x, rows in (("q", n * d), ("k", g * d), ("v", g * d)):
                sd[a + f"{x}_proj.weight"] = r(rows, h)
                if fam == "qwen2":
                    sd[a + f"{x}_proj.bias"] = r(rows)
        sd[a + "o_proj.weight"] = r(h, n * d)
        sd[p + "post_attention_layernorm.weight"] = gain()
        if fam == "gemma2":
            sd[p + "pre_feedforward_layernorm.weight"] = gain()
            sd[p + "post_feedforward_layernorm.weight"] = gain()
        if fam == "mixtral":
            m = p + "block_sparse_moe."
            sd[m + "gate.weight"] = r(cfg["num_local_experts"], h)
            for e in range(cfg["num_local_experts"]):
                sd[m + f"experts.{e}.w1.weight"] = r(f, h)
                sd[m + f"experts.{e}.w2.weight"] = r(h, f)
                sd[m + f"experts.{e}.w3.weight"] = r(f, h)
        elif fam == "phi3":
            sd[p + "mlp.gate_up_proj.weight"] = r(2 * f, h)
            sd[p + "mlp.down_proj.weight"] = r(h, f)
        else:
            for x, s in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f))):
                sd[p + f"mlp.{x}_proj.weight"] = r(*s)
    sd["model.norm.weight"] = gain()
    if not cfg.get("tie_word_embeddings", fam in ("gemma", "gemma2")):
        sd["lm_head.weight"] = r(V, h)
    return sd


# --- the forward, from HF's descriptions ----------------------------------

def rms_norm(x, w, eps, gemma):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def rotate(x, base, dim):
    """Rotate-half rotary over the first `dim` columns of [B, heads, T, D]."""
    t = x.shape[2]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.outer(torch.arange(t).float(), inv)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    xr, rest = x[..., :dim], x[..., dim:]
    x1, x2 = xr[..., :dim // 2], xr[..., dim // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


def attend(q, k, v, scale, window=None, softcap=None):
    """Causal attention of [B, heads, T, D] (k, v already repeated)."""
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    t = q.shape[2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    keep = j <= i
    if window:
        keep = keep & (i - j < window)  # HF: kv_idx > q_idx - sliding_window
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def heads_of(x, n, d):
    b, t, _ = x.shape
    return x.view(b, t, n, d).transpose(1, 2)


def merge(x):
    b, n, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, n * d)


def forward(cfg, sd, tokens, targets):
    """Mean cross-entropy of the family's causal LM on HF-named tensors."""
    out = logits(cfg, sd, tokens)
    return F.cross_entropy(out.reshape(-1, V), targets.reshape(-1))


def logits(cfg, sd, tokens):
    """[B, T, V] logits of the family's causal LM on HF-named tensors."""
    h, n, g, d, f = dims(cfg)
    fam = cfg["model_type"]
    if fam == "gpt_neox":
        return _neox(cfg, sd, tokens)
    gemma = fam in ("gemma", "gemma2")
    eps = cfg["rms_norm_eps"]
    norm = lambda x, name: rms_norm(x, sd[name], eps, gemma)
    lin = lambda x, name, bias=False: F.linear(x, sd[name + ".weight"],
                                               sd[name + ".bias"] if bias else None)
    x = sd["model.embed_tokens.weight"][tokens]
    if gemma:
        x = x * torch.tensor(h ** 0.5, dtype=x.dtype)
    window = cfg.get("sliding_window")
    if fam == "qwen2" and not cfg.get("use_sliding_window"):
        window = None
    scale = cfg.get("query_pre_attn_scalar", d) ** -0.5
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        y = norm(x, p + "input_layernorm.weight")
        if fam == "phi3":
            q, k, v = lin(y, a + "qkv_proj").split([n * d, g * d, g * d], -1)
        else:
            q, k, v = (lin(y, a + f"{c}_proj", fam == "qwen2") for c in "qkv")
        q, k, v = heads_of(q, n, d), heads_of(k, g, d), heads_of(v, g, d)
        q, k = rotate(q, cfg["rope_theta"], d), rotate(k, cfg["rope_theta"], d)
        k, v = k.repeat_interleave(n // g, 1), v.repeat_interleave(n // g, 1)
        w = window
        if fam == "gemma2" and l % 2 == 1:
            w = None  # Gemma 2: sliding on even layers only
        o = lin(merge(attend(q, k, v, scale, w, cfg.get("attn_logit_softcapping"))),
                a + "o_proj")
        if fam == "gemma2":
            o = norm(o, p + "post_attention_layernorm.weight")
        x = x + o
        y = norm(x, p + ("pre_feedforward_layernorm.weight" if fam == "gemma2"
                         else "post_attention_layernorm.weight"))
        if fam == "mixtral":
            m = _moe(cfg, sd, p + "block_sparse_moe.", y)
        else:
            if fam == "phi3":
                gate, up = lin(y, p + "mlp.gate_up_proj").chunk(2, -1)
            else:
                gate, up = lin(y, p + "mlp.gate_proj"), lin(y, p + "mlp.up_proj")
            act = F.gelu(gate, approximate="tanh") if gemma else F.silu(gate)
            m = lin(act * up, p + "mlp.down_proj")
        if fam == "gemma2":
            m = norm(m, p + "post_feedforward_layernorm.weight")
        x = x + m
    x = norm(x, "model.norm.weight")
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    out = x @ head.t()
    cap = cfg.get("final_logit_softcapping")
    if cap:
        out = torch.tanh(out / cap) * cap
    return out


def _moe(cfg, sd, p, y):
    """Mixtral's sparse MoE block: softmax over experts, top-k, renormalized."""
    b, t, h = y.shape
    x = y.reshape(-1, h)
    probs = torch.softmax(x @ sd[p + "gate.weight"].t(), -1)
    top, idx = torch.topk(probs, cfg["num_experts_per_tok"], -1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(cfg["num_local_experts"]):
        w = lambda k: sd[p + f"experts.{e}.{k}.weight"]
        ye = F.linear(F.silu(F.linear(x, w("w1"))) * F.linear(x, w("w3")), w("w2"))
        weight = (top * (idx == e)).sum(-1, keepdim=True)
        out = out + weight * ye
    return out.reshape(b, t, h)


def _neox(cfg, sd, tokens):
    h, n, _, d, _ = dims(cfg)
    eps = cfg["layer_norm_eps"]
    g = "gpt_neox."
    ln = lambda x, name: F.layer_norm(x, (h,), sd[name + ".weight"], sd[name + ".bias"], eps)
    lin = lambda x, name: F.linear(x, sd[name + ".weight"], sd[name + ".bias"])
    rot = int(d * cfg["rotary_pct"])
    x = sd[g + "embed_in.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"{g}layers.{l}."
        qkv = lin(ln(x, p + "input_layernorm"), p + "attention.query_key_value")
        b, t, _ = qkv.shape
        qkv = qkv.view(b, t, n, 3 * d).transpose(1, 2)  # per head [q | k | v]
        q, k, v = qkv.split(d, -1)
        q, k = rotate(q, cfg["rotary_emb_base"], rot), rotate(k, cfg["rotary_emb_base"], rot)
        attn = lin(merge(attend(q, k, v, d ** -0.5)), p + "attention.dense")
        mlp = lin(F.gelu(lin(ln(x, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h")),
                  p + "mlp.dense_4h_to_h")
        x = mlp + attn + x  # use_parallel_residual
    return ln(x, g + "final_layer_norm") @ sd["embed_out.weight"].t()
