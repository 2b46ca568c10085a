"""Checkpoints in Hugging Face naming (python/mapp/hf.py).

Tiny GPT-2 (GPT2LMHeadModel layout: Conv1D [in, out] weights, fused c_attn)
and LLaMA (LlamaForCausalLM layout: separate q/k/v projections, grouped-query
k/v, rotate-half rotary) checkpoints are written here with torch under HF's
names; an independent HF-style forward written from HF's modeling code gives
the logits, which the reference module loaded through the mapping must
reproduce. mapp -> HF -> mapp is bit-identical, through the CLI too."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from mapp import hf, safetensors
from mapp.reference import GPT
from scope_ref import reference_logits

GPT2 = {"variant": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "seq_length": 8, "vocab_size": 100, "make_vocab_size_divisible_by": 64,
        "gelu_approximate": "tanh"}
LLAMA = {"variant": "llama", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
         "num_query_groups": 2, "ffn_hidden_size": 48, "seq_length": 8, "vocab_size": 100,
         "rotary_base": 500000.0, "tie_embeddings": False}
HF_POSITIONS = 12


def rnd(*shape, gen):
    return torch.randn(*shape, generator=gen) * 0.2


def gpt2_checkpoint(gen):
    h, v, f = 32, 100, 128
    sd = {"transformer.wte.weight": rnd(v, h, gen=gen),
          "transformer.wpe.weight": rnd(HF_POSITIONS, h, gen=gen)}
    for l in range(2):
        p = f"transformer.h.{l}."
        sd.update({p + "ln_1.weight": 1 + rnd(h, gen=gen), p + "ln_1.bias": rnd(h, gen=gen),
                   p + "attn.c_attn.weight": rnd(h, 3 * h, gen=gen),
                   p + "attn.c_attn.bias": rnd(3 * h, gen=gen),
                   p + "attn.c_proj.weight": rnd(h, h, gen=gen), p + "attn.c_proj.bias": rnd(h, gen=gen),
                   p + "ln_2.weight": 1 + rnd(h, gen=gen), p + "ln_2.bias": rnd(h, gen=gen),
                   p + "mlp.c_fc.weight": rnd(h, f, gen=gen), p + "mlp.c_fc.bias": rnd(f, gen=gen),
                   p + "mlp.c_proj.weight": rnd(f, h, gen=gen), p + "mlp.c_proj.bias": rnd(h, gen=gen),
                   p + "attn.bias": torch.ones(1, 1, HF_POSITIONS, HF_POSITIONS).tril()})
    sd["transformer.ln_f.weight"] = 1 + rnd(h, gen=gen)
    sd["transformer.ln_f.bias"] = rnd(h, gen=gen)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def gpt2_logits(sd, tokens, heads=4):
    """GPT2LMHeadModel's forward (Conv1D: x @ W + b)."""
    b, t = tokens.shape
    conv = lambda x, n: x @ sd[n + ".weight"] + sd[n + ".bias"]
    ln = lambda x, n: F.layer_norm(x, x.shape[-1:], sd[n + ".weight"], sd[n + ".bias"], 1e-5)
    x = sd["transformer.wte.weight"][tokens] + sd["transformer.wpe.weight"][:t]
    for l in range(2):
        p = f"transformer.h.{l}."
        q, k, v = conv(ln(x, p + "ln_1"), p + "attn.c_attn").split(32, dim=2)
        sh = lambda z: z.view(b, t, heads, 8).transpose(1, 2)
        w = (sh(q) @ sh(k).transpose(-1, -2)) / math.sqrt(8)
        w = w.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        a = (w.softmax(-1) @ sh(v)).transpose(1, 2).reshape(b, t, 32)
        x = x + conv(a, p + "attn.c_proj")
        m = conv(ln(x, p + "ln_2"), p + "mlp.c_fc")
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + conv(m, p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ sd["lm_head.weight"].t()


def llama_checkpoint(gen):
    h, v, f, kv = 32, 100, 48, 16
    sd = {"model.embed_tokens.weight": rnd(v, h, gen=gen)}
    for l in range(2):
        p = f"model.layers.{l}."
        sd.update({p + "input_layernorm.weight": 1 + rnd(h, gen=gen),
                   p + "self_attn.q_proj.weight": rnd(h, h, gen=gen),
                   p + "self_attn.k_proj.weight": rnd(kv, h, gen=gen),
                   p + "self_attn.v_proj.weight": rnd(kv, h, gen=gen),
                   p + "self_attn.o_proj.weight": rnd(h, h, gen=gen),
                   p + "self_attn.rotary_emb.inv_freq": torch.ones(4),
                   p + "post_attention_layernorm.weight": 1 + rnd(h, gen=gen),
                   p + "mlp.gate_proj.weight": rnd(f, h, gen=gen),
                   p + "mlp.up_proj.weight": rnd(f, h, gen=gen),
                   p + "mlp.down_proj.weight": rnd(h, f, gen=gen)})
    sd["model.norm.weight"] = 1 + rnd(h, gen=gen)
    sd["lm_head.weight"] = rnd(v, h, gen=gen)
    return sd


def llama_logits(sd, tokens, heads=4, kv_heads=2, base=500000.0):
    """LlamaForCausalLM's forward: RMSNorm, rotate_half rotary, repeat_kv."""
    b, t = tokens.shape
    d = 32 // heads
    rms = lambda x, n: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * sd[n]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(t).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rot = lambda z: torch.cat((-z[..., d // 2:], z[..., :d // 2]), dim=-1)
    x = sd["model.embed_tokens.weight"][tokens]
    for l in range(2):
        p = f"model.layers.{l}."
        a = rms(x, p + "input_layernorm.weight")
        q = (a @ sd[p + "self_attn.q_proj.weight"].t()).view(b, t, heads, d).transpose(1, 2)
        k = (a @ sd[p + "self_attn.k_proj.weight"].t()).view(b, t, kv_heads, d).transpose(1, 2)
        v = (a @ sd[p + "self_attn.v_proj.weight"].t()).view(b, t, kv_heads, d).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        w = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        w = w.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        o = (w.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 32)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].t()
        m = rms(x, p + "post_attention_layernorm.weight")
        g = F.silu(m @ sd[p + "mlp.gate_proj.weight"].t()) * (m @ sd[p + "mlp.up_proj.weight"].t())
        x = x + g @ sd[p + "mlp.down_proj.weight"].t()
    return rms(x, "model.norm.weight") @ sd["lm_head.weight"].t()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_checkpoint_gives_reference_logits(name):
    gen = torch.Generator().manual_seed(3)
    cfg, sd = (GPT2, gpt2_checkpoint(gen)) if name == "gpt2" else (LLAMA, llama_checkpoint(gen))
    tokens = torch.randint(0, 100, (2, 8), generator=gen)
    with torch.no_grad():
        want = (gpt2_logits if name == "gpt2" else llama_logits)(sd, tokens)
        model = GPT(cfg)
        model.load_state_dict(hf.hf_to_mapp(sd, cfg))
        got = reference_logits(model, tokens)
    assert got.shape[-1] == (128 if name == "gpt2" else 100)  # gpt2: padded vocab
    scale = want.abs().max().item()
    assert (got[..., :100] - want).abs().max().item() <= 1e-5 * scale
    if name == "gpt2":  # padded rows are zeros: their logits are exactly 0
        assert torch.equal(got[..., 100:], torch.zeros_like(got[..., 100:]))


@pytest.mark.parametrize("cfg", [GPT2, LLAMA, dict(LLAMA, num_query_groups=4)],
                         ids=["gpt2", "llama-gqa", "llama-mha"])
def test_round_trip_is_bit_identical(tmp_path, cfg):
    state = GPT(cfg, seed=5).state_dict()
    names = hf.mapp_to_hf(state, cfg)
    assert ("transformer.h.0.attn.c_attn.weight" in names) == (cfg["variant"] == "gpt")
    back = hf.hf_to_mapp(names, cfg)
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(back[k], v), k


def test_cli_round_trip(tmp_path):
    cfg = LLAMA
    state = GPT(cfg, seed=5).state_dict()
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    safetensors.save({k: v for k, v in state.items()}, tmp_path / "m.safetensors")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for direction, src, dst in (("to-hf", "m", "hf"), ("to-mapp", "hf", "back")):
        r = subprocess.run([sys.executable, "-m", "mapp.hf", direction, "--config",
                            str(tmp_path / "cfg.json"), str(tmp_path / f"{src}.safetensors"),
                            str(tmp_path / f"{dst}.safetensors")], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "model.layers.0.self_attn.k_proj.weight" in \
        safetensors.load(tmp_path / "hf.safetensors")[0]
    back = safetensors.load(tmp_path / "back.safetensors")[0]
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(back[k], v), k


def test_mapping_errors_name_the_tensor():
    gen = torch.Generator().manual_seed(3)
    sd = gpt2_checkpoint(gen)
    del sd["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(hf.MappingError, match="no 'transformer.h.1.mlp.c_fc.bias'"):
        hf.hf_to_mapp(sd, GPT2)
    sd = gpt2_checkpoint(gen)
    sd["transformer.h.0.attn.c_attn.lora"] = torch.zeros(1)
    with pytest.raises(hf.MappingError, match="no place for: transformer.h.0.attn.c_attn.lora"):
        hf.hf_to_mapp(sd, GPT2)
    with pytest.raises(hf.MappingError, match="fewer than seq_length 16"):
        hf.hf_to_mapp(gpt2_checkpoint(gen), dict(GPT2, seq_length=16))
