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

from conftest import ROOT, require_tool
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


def gpt2_checkpoint(gen, v=100):
    h, f = 32, 128
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


def llama_checkpoint(gen, v=100):
    h, f, kv = 32, 48, 16
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


# --- mapp-run --weights-format hf (runtime/src/ckpt/HfNames.cpp) -----------

CORPUS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")  # bytes <= 226
HF_VOCAB = 250  # GPT-2: mapp pads it to 256 (make_vocab_size_divisible_by 128)
STEPS = 20
OPT = "lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
CLI = {"gpt2": dict(GPT2, vocab_size=HF_VOCAB, make_vocab_size_divisible_by=128),
       "llama": dict(LLAMA, vocab_size=HF_VOCAB)}


def sh(cmd, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    if ok:
        assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r


def compile_plan(tmp, cfg, opt=OPT):
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    sh([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
        "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
        "--weights", tmp / "init.safetensors", "--seed", 7])
    name = "lr0" if "lr=0 " in opt else "train"
    sh([require_tool("mapp-opt"), tmp / "model.mlir", "-mapp-autodiff", f"-mapp-optimizer={opt}",
        "-o", tmp / f"{name}.mlir"])
    sh([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir", "-o",
        tmp / f"{name}.mplan"])
    return tmp / f"{name}.mplan"


def mapp_run(mplan, *extra, steps=STEPS, ok=True):
    return sh([require_tool("mapp-run"), mplan, "--backend=cpu", "--data", CORPUS, "--tokenizer",
               "bytes", "--steps", steps, "--seed", 11, "--quiet", "--threads", 1, *extra],
              ok=ok)


def hf_file(tmp, name):
    gen = torch.Generator().manual_seed(3)
    sd = (gpt2_checkpoint if name == "gpt2" else llama_checkpoint)(gen, v=HF_VOCAB)
    safetensors.save({k: v.contiguous() for k, v in sd.items()}, tmp / "hf.safetensors")
    return sd


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_mapp_run_trains_from_hf_checkpoint(tmp_path, name):
    """mapp-run --weights under HF names (detected): step 0's loss equals the
    HF-layout forward written from HF's modeling code; 20 AdamW steps equal
    the reference module loaded from the same checkpoint."""
    cfg = CLI[name]
    mplan = compile_plan(tmp_path, cfg)
    sd = hf_file(tmp_path, name)
    mapp_run(mplan, "--weights", tmp_path / "hf.safetensors", "--metrics",
             tmp_path / "m.jsonl", "--dump-batches", tmp_path / "b.jsonl")
    metrics = [json.loads(l) for l in (tmp_path / "m.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(metrics) == STEPS
    tokens, targets = torch.tensor(batches[0]["tokens"]), torch.tensor(batches[0]["targets"])
    with torch.no_grad():
        logits = (gpt2_logits if name == "gpt2" else llama_logits)(sd, tokens)
        if name == "gpt2":  # mapp's 6 padded vocab rows: zero logits, in the softmax
            logits = torch.cat([logits, logits.new_zeros(*logits.shape[:-1], 6)], -1)
        want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    assert abs(metrics[0]["loss"] - want.item()) <= 1e-5 * want.item(), \
        (metrics[0]["loss"], want.item())
    model = GPT(cfg)
    model.load_state_dict(hf.hf_to_mapp(sd, cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    for step, batch in enumerate(batches):
        opt.zero_grad()
        loss = model(torch.tensor(batch["tokens"]), torch.tensor(batch["targets"]))
        loss.backward()
        opt.step()
        got = metrics[step]["loss"]
        assert abs(got - loss.item()) <= 1e-5 * loss.item(), (step, got, loss.item())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_mapp_run_hf_round_trips(tmp_path, name):
    """With lr=0 the parameters do not move: HF -> mapp-run -> HF gives the
    checkpoint's own tensors back bit for bit (vocabulary padding dropped,
    GPT-2's position rows past seq_length kept), and mapp -> HF -> mapp the
    mapp file's; the HF names written equal python/mapp/hf.py's."""
    cfg = CLI[name]
    mplan = compile_plan(tmp_path, cfg, "lr=0 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1")
    sd = hf_file(tmp_path, name)
    mapp_run(mplan, "--weights", tmp_path / "hf.safetensors", "--weights-format", "hf",
             "--save", tmp_path / "hf2.safetensors", steps=1)
    got = safetensors.load(tmp_path / "hf2.safetensors")[0]
    # Buffers and GPT-2's tied head (the embedding saved twice) are not written.
    want = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", "inv_freq"))
            and not (name == "gpt2" and k == "lm_head.weight")}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k

    init = safetensors.load(tmp_path / "init.safetensors")[0]
    mapp_run(mplan, "--weights", tmp_path / "init.safetensors", "--save-format", "hf",
             "--save", tmp_path / "as-hf.safetensors", steps=1)
    as_hf = safetensors.load(tmp_path / "as-hf.safetensors")[0]
    py = hf.mapp_to_hf(init, cfg)
    assert as_hf.keys() == py.keys()
    for k, v in py.items():
        assert torch.equal(as_hf[k], v), k
    mapp_run(mplan, "--weights", tmp_path / "as-hf.safetensors",
             "--save", tmp_path / "back.safetensors", steps=1)
    back = safetensors.load(tmp_path / "back.safetensors")[0]
    assert back.keys() == init.keys()
    for k, v in init.items():
        assert torch.equal(back[k], v), k
    if name == "gpt2":  # --hf-vocab-size drops mapp's padding rows
        mapp_run(mplan, "--weights", tmp_path / "init.safetensors", "--save-format", "hf",
                 "--hf-vocab-size", HF_VOCAB, "--save", tmp_path / "v.safetensors", steps=1)
        v = safetensors.load(tmp_path / "v.safetensors")[0]
        assert v["transformer.wte.weight"].shape == (HF_VOCAB, 32)


def test_mapp_run_hf_errors_name_the_tensor(tmp_path):
    cfg = CLI["gpt2"]
    mplan = compile_plan(tmp_path, cfg)
    sd = hf_file(tmp_path, "gpt2")

    def fails(tensors, *extra):
        safetensors.save({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "bad.safetensors")
        r = mapp_run(mplan, "--weights", tmp_path / "bad.safetensors", *extra, steps=1, ok=False)
        assert r.returncode != 0
        return r.stderr

    bad = dict(sd)
    del bad["transformer.h.1.mlp.c_fc.bias"]
    assert "Hugging Face checkpoint has no 'transformer.h.1.mlp.c_fc.bias' (for mapp's " \
        "'layers.1.mlp.fc1.bias')" in fails(bad)
    bad = dict(sd, **{"transformer.h.0.attn.c_attn.lora": torch.zeros(1)})
    assert "no place for: transformer.h.0.attn.c_attn.lora" in fails(bad)
    bad = dict(sd, **{"transformer.h.0.attn.c_proj.weight": torch.zeros(32, 16)})
    assert "for mapp's 'layers.0.attn.proj.weight', the plan needs [32,32]" in fails(bad)
    bad = dict(sd, **{"lm_head.weight": torch.zeros(HF_VOCAB, 32)})
    assert "'lm_head.weight' differs from the token embedding" in fails(bad)
    bad = dict(sd, **{"transformer.wpe.weight": torch.zeros(4, 32)})
    assert "fewer than seq_length 8" in fails(bad)
    # A mapp-named file read as HF names.
    assert "not a Hugging Face GPT-2 or LLaMA checkpoint" in \
        fails(safetensors.load(tmp_path / "init.safetensors")[0], "--weights-format", "hf")
    r = mapp_run(mplan, "--weights-format", "meta", steps=1, ok=False)
    assert r.returncode == 2 and "--weights-format needs auto, mapp or hf" in r.stderr
