"""Activation patching (mapp-run --patch): B's activation at (layer, pos)
written into A's forward; the target token's logit at A's last position
with and without the patch equals PyTorch forward hooks doing the same patch
on the same weights. Bad specs are clear errors."""

import json
import os
import pathlib
import subprocess

import pytest
import torch

from mapp import safetensors
from mapp.reference import GPT
from conftest import require_tool
from scope_ref import ROOT, TINY, compile_plan, export, run

A, B, TARGET = "The cat", "A dog r", "a"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("patch")
    export(d)
    plan = compile_plan(d, None)
    (d / "A.txt").write_text(A + "\n")
    (d / "B.txt").write_text(B)
    model = GPT(TINY)
    model.load_state_dict(safetensors.load(d / "init.safetensors")[0])
    return d, plan, model.eval()


def module_of(model, site, layer):
    block = model.layers[layer]
    return {"resid": block, "attn": block.attn, "mlp": block.mlp,
            "mlp.fc1": block.mlp.fc1}[site]


def reference(model, site, layer, pos, mod=None, logits=None):
    """(clean, patched) logit of TARGET at A's last position via hooks on
    `mod` (default module_of), logits by `logits` (default model_logits)."""
    T = TINY["seq_length"]
    pad = lambda s: torch.tensor([list(s.encode()) + [0] * (T - len(s))])
    tgt, last = TARGET.encode()[0], len(A) - 1
    mod = mod or module_of(model, site, layer)
    model_logits = logits or globals()["model_logits"]
    saved = {}
    h = mod.register_forward_hook(lambda m, i, o: saved.update(row=o[0, pos].clone()))
    with torch.no_grad():
        model_logits(model, pad(B))
    h.remove()

    def put(m, i, o):
        o = o.clone()
        o[:, pos] = saved["row"]
        return o
    with torch.no_grad():
        clean = model_logits(model, pad(A))[0, last, tgt].item()
        h = mod.register_forward_hook(put)
        patched = model_logits(model, pad(A))[0, last, tgt].item()
        h.remove()
    return clean, patched


def model_logits(model, tokens):
    x = model.wte(tokens) + model.wpe.weight[:tokens.shape[1]]
    for layer in model.layers:
        x = layer(x)
    return model.lm_head(model.ln_f(x))


@pytest.mark.parametrize("site,layer,pos", [("resid", 0, 2), ("attn", 1, 6),
                                            ("mlp", 0, 6), ("mlp.fc1", 1, 6), ("attn", 0, 0)])
def test_patch_matches_forward_hooks(setup, site, layer, pos):
    d, plan, model = setup
    r = run([require_tool("mapp-run"), plan, "--weights", d / "init.safetensors",
             "--patch", f"into={d / 'A.txt'},from={d / 'B.txt'},site={site},"
             f"layer={layer},pos={pos},target={TARGET}"])
    got = json.loads(r.stdout)
    clean, patched = reference(model, site, layer, pos)
    assert got["target"] == TARGET.encode()[0] and got["position"] == len(A) - 1
    assert abs(got["clean_logit"] - clean) <= 1e-5
    assert abs(got["patched_logit"] - patched) <= 1e-5
    assert abs(got["delta"] - (patched - clean)) <= 1e-5
    # The patch changes something (else the check above proves nothing;
    # a last-layer site reaches A's last position only at that position).
    assert abs(patched - clean) > 1e-4


@pytest.mark.parametrize("site,layer", [("resid", 1), ("attn", 0), ("mlp.c_fc", 1)])
def test_patch_generic_export(tmp_path, site, layer):
    """nanoGPT exported by its own module paths (transformer.h.N.attn,
    ...): `layer` finds the model's block N, not a "layers.N" it lacks."""
    import importlib
    import sys
    here = str(pathlib.Path(__file__).parent)
    cfg = dict(vocab_size=256, micro_batch_size=2, seq_length=TINY["seq_length"],
               n_embd=16, n_head=2, n_layer=2, block_size=TINY["seq_length"])
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), here]))
    run([sys.executable, "-m", "mapp.export", "--module", "models.nano:GPT", "--config",
         tmp_path / "cfg.json", "-o", tmp_path / "model.mlir", "--weights",
         tmp_path / "init.safetensors", "--seed", 7, "--output", "loss"], env=env)
    plan = compile_plan(tmp_path, None)
    (tmp_path / "A.txt").write_text(A + "\n")
    (tmp_path / "B.txt").write_text(B)
    sys.path.insert(0, here)
    model = importlib.import_module("models.nano").GPT(cfg)
    sys.path.remove(here)
    keys = model.load_state_dict(safetensors.load(tmp_path / "init.safetensors")[0], strict=False)
    assert all(k.endswith("attn.bias") for k in keys.missing_keys), keys  # the mask buffers
    model.eval()
    pos = 6
    r = run([require_tool("mapp-run"), plan, "--weights", tmp_path / "init.safetensors",
             "--patch", f"into={tmp_path / 'A.txt'},from={tmp_path / 'B.txt'},site={site},"
             f"layer={layer},pos={pos},target={TARGET}"])
    got = json.loads(r.stdout)
    block = model.transformer.h[layer]
    mod = {"resid": block, "attn": block.attn, "mlp.c_fc": block.mlp.c_fc}[site]
    clean, patched = reference(model, site, layer, pos, mod,
                               lambda m, t: m(t, torch.zeros_like(t))[0])
    assert got["value"].startswith(f"transformer.h.{layer}"), got
    assert abs(got["clean_logit"] - clean) <= 1e-5 and abs(got["patched_logit"] - patched) <= 1e-5
    assert abs(patched - clean) > 1e-4


@pytest.mark.parametrize("spec,message", [
    ("into={A},from={B},site=resid,layer=0,pos=7,target=a", "pos 7 is outside"),
    ("into={A},from={B},site=resid,layer=5,pos=0,target=a", "no forward value is named 'layers.5'"),
    ("into={A},from={B},site=resid,layer=0,pos=0,target=ab", "is 2 tokens, not one"),
    ("into={A},from={B},site=x;rm,layer=0,pos=0,target=a", "is not a dotted name"),
    ("into={A},from=/nonexistent,site=resid,layer=0,pos=0,target=a", "cannot read prompt B"),
    ("into={A},from={B},site=resid,layer=zero,pos=0,target=a", "layer must be an integer"),
    ("into={A},from={B},site=resid,layer=0,pos=0,target=a,code=1", "unknown key 'code'"),
    ("into={A},from={B},site=resid,layer=0", "--patch needs"),
])
def test_patch_bad_spec(setup, spec, message):
    d, plan, _ = setup
    spec = spec.format(A=d / "A.txt", B=d / "B.txt")
    r = subprocess.run([require_tool("mapp-run"), plan, "--weights", str(d / "init.safetensors"),
                        "--patch", spec], capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_patch_needs_weights_and_one_mode(setup):
    d, plan, _ = setup
    spec = f"into={d / 'A.txt'},from={d / 'B.txt'},site=resid,layer=0,pos=0,target=a"
    r = subprocess.run([require_tool("mapp-run"), plan, "--patch", spec], capture_output=True, text=True)
    assert r.returncode != 0 and "--patch needs --weights" in r.stderr
    r = subprocess.run([require_tool("mapp-run"), plan, "--patch", spec, "--generate"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "different modes" in r.stderr
