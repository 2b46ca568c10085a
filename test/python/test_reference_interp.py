"""Numerics: the exported graph (and the imported one, normalized by
mapp-opt), run by an interpreter written from docs/semantics.md, gives the
reference model's loss."""

import os
import subprocess

import pytest
import torch

from conftest import find_tool
from mapp import interp
from mapp.config import normalize_config
from mapp.export import example_inputs, export_module
from mapp.reference import GPT

TINY = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
            vocab_size=64, micro_batch_size=2)
CASES = {
    "gpt": dict(TINY),
    "gpt-untied-erf": dict(TINY, tie_embeddings=False, gelu_approximate="none"),
    "llama": dict(TINY, variant="llama", rotary_base=500.0),
    "llama-tied": dict(TINY, variant="llama", tie_embeddings=True, ffn_hidden_size=24),
    # Mixture of experts (docs/moe.md): capacity drops, aux and z losses.
    "moe-gpt": dict(TINY, num_moe_experts=4, moe_router_topk=2, moe_capacity_factor=0.75,
                    moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01, moe_ffn_hidden_size=24),
    "moe-llama": dict(TINY, variant="llama", num_moe_experts=3, moe_router_topk=2,
                      moe_layer_freq=[1, 0], moe_aux_loss_coeff=0.1),
}


def _setup(case, seed=5):
    cfg = normalize_config(CASES[case])
    model = GPT(cfg, seed=seed)
    # Init-size weights make attention nearly uniform, which would hide a
    # wrong scale, mask or rotary: use std 0.4 matrices and random norms.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(20.0)
            else:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    tokens, targets = example_inputs(cfg)
    with torch.no_grad():
        want = model(tokens, targets)
    return cfg, model, tokens, targets, want


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_graph_computes_the_reference_loss(case):
    cfg, model, tokens, targets, want = _setup(case)
    text = export_module(model, tokens, targets)
    got = interp.run(text, dict(model.state_dict()), [tokens, targets])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_graph_computes_the_reference_loss(tmp_path, case):
    opt, translate = find_tool("mapp-opt"), find_tool("mapp-translate")
    if not (opt and translate):
        pytest.skip("mapp-opt / mapp-translate not built")
    cfg, model, tokens, targets, want = _setup(case)
    path = tmp_path / "cfg.json"
    import json
    path.write_text(json.dumps(CASES[case]))
    imported = subprocess.run([translate, "--import-gpt-config", str(path)],
                              capture_output=True, text=True, check=True).stdout
    generic = subprocess.run([opt, "-mlir-print-op-generic"], input=imported,
                             capture_output=True, text=True, check=True).stdout
    got = interp.run(generic, dict(model.state_dict()), [tokens, targets])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_check_is_sensitive():
    cfg, model, tokens, targets, want = _setup("llama")
    text = export_module(model, tokens, targets)
    w = dict(model.state_dict())
    for old, new in (("rotary_base = 500.0", "rotary_base = 10000.0"),
                     ("causal, ", ""), ("scale = 0.35355339059327373", "scale = 0.1")):
        assert old in text
        got = interp.run(text.replace(old, new), w, [tokens, targets])
        assert abs(got.item() - want.item()) > 1e-3, old


def test_dropout_rng_is_deterministic_and_unbiased():
    a = interp.dropout_keep(seed=3, step=0, n=4000, p=0.25)
    assert torch.equal(a, interp.dropout_keep(seed=3, step=0, n=4000, p=0.25))
    assert not torch.equal(a, interp.dropout_keep(seed=3, step=1, n=4000, p=0.25))
    assert abs(a.float().mean().item() - 0.75) < 0.03


def test_the_moe_check_is_sensitive():
    cfg, model, tokens, targets, want = _setup("moe-gpt")
    text = export_module(model, tokens, targets)
    w = dict(model.state_dict())
    for old, new in (("capacity = 6 : i64", "capacity = 8 : i64"),
                     ('"layers.0.mlp.moe_aux_loss", coeff = 0.1', '"layers.0.mlp.moe_aux_loss", coeff = 0.2'),
                     ('"layers.1.mlp.moe_z_loss", coeff = 0.01', '"layers.1.mlp.moe_z_loss", coeff = 0.0')):
        assert old in text, old
        got = interp.run(text.replace(old, new), w, [tokens, targets])
        assert abs(got.item() - want.item()) > 1e-4, old
