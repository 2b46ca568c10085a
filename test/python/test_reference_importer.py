"""The exporter's graph of the reference GPT and mapp-translate's graph from
the same config are the same graph: both are normalized by mapp-opt
(--canonicalize, generic form) and compared as text — names, attributes,
op order and parameter declarations included."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, find_tool

TINY = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
            vocab_size=64, micro_batch_size=2)

CASES = {
    "gpt-tied": dict(TINY),
    "gpt-untied": dict(TINY, tie_embeddings=False),
    "llama-tied": dict(TINY, variant="llama", tie_embeddings=True),
    "llama-untied": dict(TINY, variant="llama", ffn_hidden_size=40),
    "gpt-dropout-erf": dict(TINY, hidden_dropout=0.1, gelu_approximate="none",
                            layernorm_epsilon=1e-6),
    "llama-hf-keys": {"variant": "llama", "n_layer": 1, "n_embd": 16, "n_head": 2,
                      "n_positions": 8, "vocab_size": 50, "make_vocab_size_divisible_by": 8,
                      "rope_theta": 500000, "rms_norm_eps": 1e-6, "hidden_dropout": 0.2},
    # Mixture of experts (docs/moe.md): dropless, capacity drops, SwiGLU
    # experts on a 0/1 layer list, no auxiliary losses with dropout.
    "moe-gpt": dict(TINY, num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=1e-2,
                    moe_z_loss_coeff=1e-3, moe_ffn_hidden_size=48),
    "moe-gpt-capacity": dict(TINY, num_layers=3, num_moe_experts=3, moe_router_topk=1,
                             moe_capacity_factor=1.25, moe_layer_freq=2,
                             moe_aux_loss_coeff=0.1),
    "moe-llama": dict(TINY, variant="llama", num_moe_experts=4, moe_layer_freq=[0, 1],
                      moe_z_loss_coeff=1e-3, moe_capacity_factor=0.5),
    "moe-dropout-no-aux": dict(TINY, num_moe_experts=2, moe_router_topk=1,
                               hidden_dropout=0.1),
}


def _tools():
    opt, translate = find_tool("mapp-opt"), find_tool("mapp-translate")
    if not (opt and translate):
        pytest.skip("mapp-opt / mapp-translate not built")
    return opt, translate


def _normalize(opt, path):
    r = subprocess.run([opt, "--canonicalize", "-mlir-print-op-generic", path],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _compare(tmp_path, config_path):
    opt, translate = _tools()
    exported, imported = str(tmp_path / "exported.mlir"), str(tmp_path / "imported.mlir")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
                        "--config", config_path, "-o", exported],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([translate, "--import-gpt-config", config_path, "-o", imported],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = _normalize(opt, exported), _normalize(opt, imported)
    assert a.count("\n") > 20
    if a != b:
        import difflib
        diff = "".join(list(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                                 "exporter", "importer"))[:60])
        pytest.fail("exporter and importer graphs differ:\n" + diff)


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_graph(tmp_path, case):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CASES[case]))
    _compare(tmp_path, str(cfg))


@pytest.mark.parametrize("example", ["gpt-tiny", "llama-tiny", "gpt-small", "gpt-moe-tiny"])
def test_same_graph_examples(tmp_path, example):
    _compare(tmp_path, os.path.join(ROOT, "examples", f"{example}.json"))
