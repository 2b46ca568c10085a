"""Model families from their own config.json (docs/models.md, "Model
families"): for each of qwen2, mistral, mixtral, gemma, gemma2, phi3 and
gpt_neox, a small config with the keys of the published one is imported by
mapp-translate, trained a few AdamW steps by mapp-run on CPU from a random
checkpoint under Hugging Face's names (python/mapp/hf_families.py), and every
step's loss is checked against an independent PyTorch forward written from
HF's model descriptions (hf_families_ref.py) trained with torch.optim.AdamW on
the HF-named tensors. Step 0 checks the forward (logits through the loss),
later steps the gradients. The names round-trip bit for bit; bad
checkpoints name the tensor."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, require_tool
from hf_families_ref import SMALL, checkpoint, forward, logits
from mapp import hf_families, safetensors

CORPUS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")
T, B, STEPS = 16, 2, 4
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
OPT = f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} weight-decay={WD}"


def sh(cmd, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                       errors="replace")
    if ok:
        assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r


def compile_plan(tmp, cfg):
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    sh([require_tool("mapp-translate"), "--import-gpt-config", tmp / "config.json", "--seq-length", T,
        "--micro-batch-size", B, "-o", tmp / "model.mlir"])
    sh([require_tool("mapp-opt"), tmp / "model.mlir", "-mapp-autodiff", f"-mapp-optimizer={OPT}",
        "-o", tmp / "train.mlir"])
    sh([require_tool("mapp-translate"), "--mapp-to-plan", tmp / "train.mlir", "-o", tmp / "train.mplan"])
    return tmp / "train.mplan"


@pytest.mark.parametrize("family", sorted(SMALL))
def test_family_trains_like_hf(tmp_path, family):
    cfg = SMALL[family]
    mplan = compile_plan(tmp_path, cfg)
    sd = checkpoint(cfg, torch.Generator().manual_seed(5))
    safetensors.save(hf_families.hf_to_mapp(sd, cfg), tmp_path / "mapp.safetensors")
    sh([require_tool("mapp-run"), mplan, "--backend=cpu", "--data", CORPUS, "--tokenizer", "bytes",
        "--steps", STEPS, "--seed", 11, "--quiet", "--threads", 1,
        "--weights", tmp_path / "mapp.safetensors", "--metrics", tmp_path / "m.jsonl",
        "--dump-batches", tmp_path / "b.jsonl"])
    losses = [json.loads(l)["loss"] for l in (tmp_path / "m.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS and len(batches) == STEPS
    params = {k: v.clone().requires_grad_() for k, v in sd.items()}
    opt = torch.optim.AdamW(params.values(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for step, batch in enumerate(batches):
        opt.zero_grad()
        loss = forward(cfg, params, torch.tensor(batch["tokens"]), torch.tensor(batch["targets"]))
        loss.backward()
        opt.step()
        assert abs(losses[step] - loss.item()) <= 1e-4 * loss.item(), \
            (family, step, losses[step], loss.item())


@pytest.mark.parametrize("family", sorted(SMALL))
def test_family_logits_like_hf(tmp_path, family):
    """The logits at a prompt's last position (mapp-run --generate
    --generate-out), by the full forward and by the KV cache (cached_attention
    with the window, softcap and partial rotary), equal the reference's."""
    cfg = SMALL[family]
    mplan = compile_plan(tmp_path, cfg)
    sd = checkpoint(cfg, torch.Generator().manual_seed(6))
    safetensors.save(hf_families.hf_to_mapp(sd, cfg), tmp_path / "mapp.safetensors")
    prompt = "The quick brown"  # 15 byte tokens, T = 16: past every window
    with torch.no_grad():
        want = logits(cfg, sd, torch.tensor([list(prompt.encode())]))[0, -1]
    modes = ([], ["--no-kv-cache"])
    if family == "mixtral":
        # The MoE layers mix tokens (routing): no KV-cache decoding.
        r = sh([require_tool("mapp-run"), mplan, "--backend=cpu", "--tokenizer", "bytes", "--weights",
                tmp_path / "mapp.safetensors", "--generate", "--max-new-tokens", 1,
                "--prompt", prompt], ok=False)
        assert r.returncode != 0 and "is not per token" in r.stderr, r.stderr
        modes = (["--no-kv-cache"],)
    for cache in modes:
        out = tmp_path / "gen.jsonl"
        sh([require_tool("mapp-run"), mplan, "--backend=cpu", "--tokenizer", "bytes", "--threads", 1,
            "--weights", tmp_path / "mapp.safetensors", "--generate", *cache, "--greedy",
            "--max-new-tokens", 1, "--prompt", prompt, "--generate-out", out])
        got = torch.tensor(json.loads(out.read_text().splitlines()[0])["logits"])
        err = (got - want).abs().max().item()
        assert err <= 1e-4 * max(1.0, want.abs().max().item()), (family, cache, err)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_names_round_trip_bit_identical(family):
    cfg = SMALL[family]
    sd = checkpoint(cfg, torch.Generator().manual_seed(1))
    for pad in (None, 320):  # also through a padded mapp vocabulary
        mapp = hf_families.hf_to_mapp(sd, cfg, pad)
        back = hf_families.mapp_to_hf(mapp, cfg, pad)
        assert back.keys() == sd.keys()
        for k in sd:
            assert torch.equal(back[k], sd[k]), k
        again = hf_families.hf_to_mapp(back, cfg, pad)
        assert all(torch.equal(again[k], mapp[k]) for k in mapp)


def test_mapp_names_match_the_imported_graph(tmp_path):
    """hf_to_mapp yields exactly the parameters (names and shapes) mapp-translate
    declares for each family."""
    for family, cfg in SMALL.items():
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        ir = sh([require_tool("mapp-translate"), "--import-gpt-config", tmp_path / "c.json",
                 "--seq-length", T]).stdout
        declared = {}
        for line in ir.splitlines():
            if "mapp.param @" in line:
                name = line.split("@")[1].split()[0]
                shape = line.split("tensor<")[1].split("xf32")[0]
                declared[name] = [int(x) for x in shape.split("x")]
        mapp = hf_families.hf_to_mapp(checkpoint(cfg, torch.Generator().manual_seed(0)), cfg)
        assert {k: list(v.shape) for k, v in mapp.items()} == declared, family


def test_bad_checkpoints_name_the_tensor(tmp_path):
    cfg = SMALL["mixtral"]
    sd = checkpoint(cfg, torch.Generator().manual_seed(0))
    missing = dict(sd)
    del missing["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    with pytest.raises(hf_families.MappingError,
                       match=r"no 'model.layers.1.block_sparse_moe.experts.3.w2.weight'"):
        hf_families.hf_to_mapp(missing, cfg)
    wrong = dict(sd, **{"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)})
    with pytest.raises(hf_families.MappingError,
                       match=r"'model.layers.0.self_attn.k_proj.weight' has shape "
                             r"\[32, 32\], mapp needs \[16, 32\]"):
        hf_families.hf_to_mapp(wrong, cfg)
    extra = dict(sd, **{"model.layers.0.mlp.gate_proj.weight": torch.zeros(64, 32)})
    with pytest.raises(hf_families.MappingError, match="no place for: model.layers.0.mlp"):
        hf_families.hf_to_mapp(extra, cfg)
    # Through the CLI: a non-zero exit and the tensor's name.
    neox = SMALL["gpt_neox"]
    sd = checkpoint(neox, torch.Generator().manual_seed(0))
    del sd["gpt_neox.layers.0.attention.dense.bias"]
    safetensors.save(sd, tmp_path / "hf.safetensors")
    (tmp_path / "c.json").write_text(json.dumps(neox))
    r = subprocess.run([sys.executable, "-m", "mapp.hf_families", "to-mapp", "--config",
                        tmp_path / "c.json", tmp_path / "hf.safetensors", tmp_path / "o"],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 1
    assert "no 'gpt_neox.layers.0.attention.dense.bias'" in r.stderr


# The published configs (test/Frontend/GPT/Inputs/hf/): import and compile
# with tp=8 pp=4 (Qwen2.5-7B's 28 heads: tp=4), shapes only, each in under
# 5 s (measured 2026-12-05 on 2 busy shared cores: docs/benchmarks.md).
FULL = [("qwen2.5-7b.json", ["--seq-length", "4096"], "tp=4 pp=4 microbatches=4"),
        ("qwen2.5-72b.json", ["--seq-length", "4096"], "tp=8 pp=4 microbatches=8"),
        ("mistral-7b.json", ["--seq-length", "8192"], "tp=8 pp=4 microbatches=4"),
        ("mixtral-8x7b.json", ["--seq-length", "4096"], "tp=8 pp=4 microbatches=4"),
        ("gemma-7b.json", [], "tp=8 pp=4 microbatches=4"),
        ("gemma-2-9b.json", [], "tp=8 pp=4 microbatches=4"),
        ("phi-3-mini-4k.json", [], "tp=8 pp=4 microbatches=4"),
        ("pythia-1.4b.json", [], "tp=8 pp=4 microbatches=4")]


@pytest.mark.parametrize("name,flags,pipeline", FULL, ids=[f[0] for f in FULL])
def test_full_size_configs_compile_fast(tmp_path, name, flags, pipeline):
    import time
    src = os.path.join(ROOT, "test", "Frontend", "GPT", "Inputs", "hf", name)
    start = time.monotonic()
    sh([require_tool("mapp-translate"), "--import-gpt-config", src, *flags, "-o", tmp_path / "m.mlir"])
    sh([require_tool("mapp-opt"), tmp_path / "m.mlir", f"--mapp-train-pipeline={pipeline}",
        "-o", tmp_path / "p.mlir"])
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"{name}: {elapsed:.2f} s"
