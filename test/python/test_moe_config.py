"""MoE config keys (docs/models.md): python/mapp/config.py and the C++
importer (mapp-translate --import-gpt-config) accept the same configs, fill
the same defaults and reject the same bad ones with the same message."""
import json
import subprocess

import pytest

from conftest import find_tool
from mapp.config import ConfigError, normalize_config

BASE = {"num_layers": 3, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 8,
        "vocab_size": 64}

BAD = {
    "topk-over-experts": ({"num_moe_experts": 4, "moe_router_topk": 5},
                          "config key 'moe_router_topk': 5 is not in [1, num_moe_experts = 4]"),
    "topk-zero": ({"num_moe_experts": 4, "moe_router_topk": 0},
                  "config key 'moe_router_topk': 0 is not in [1, num_moe_experts = 4]"),
    "capacity-negative": ({"num_moe_experts": 4, "moe_capacity_factor": -0.5},
                          "config key 'moe_capacity_factor': must be positive (absent = "
                          "dropless), got -0.5"),
    "capacity-zero": ({"num_moe_experts": 4, "moe_capacity_factor": 0},
                      "config key 'moe_capacity_factor': must be positive"),
    "unknown-moe-key": ({"num_moe_experts": 4, "moe_router_top_k": 2},
                        "config key 'moe_router_top_k': unknown key"),
    "no-experts": ({"moe_aux_loss_coeff": 0.01},
                   "config key 'moe_aux_loss_coeff': needs num_moe_experts"),
    "experts-zero": ({"num_moe_experts": 0},
                     "config key 'num_moe_experts': must be positive, got 0"),
    "freq-length": ({"num_moe_experts": 2, "moe_layer_freq": [1, 0]},
                    "config key 'moe_layer_freq': 2 entries for num_layers = 3"),
    "freq-bits": ({"num_moe_experts": 2, "moe_layer_freq": [1, 0, 3]},
                  "config key 'moe_layer_freq': expected an int or a list of 0/1"),
    "freq-zero": ({"num_moe_experts": 2, "moe_layer_freq": 0},
                  "config key 'moe_layer_freq': must be positive, got 0"),
    "z-negative": ({"num_moe_experts": 2, "moe_z_loss_coeff": -1},
                   "config key 'moe_z_loss_coeff': must be >= 0, got -1"),
    "experts-type": ({"num_moe_experts": "8"},
                     "config key 'num_moe_experts': expected int, got \"8\""),
}


def _translate(tmp_path, cfg):
    tool = find_tool("mapp-translate")
    if not tool:
        pytest.skip("mapp-translate not built")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([tool, "--import-gpt-config", str(path), "-o", str(tmp_path / "o.mlir")],
                          capture_output=True, text=True)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_moe_config_is_rejected_by_both(tmp_path, case):
    extra, message = BAD[case]
    cfg = dict(BASE, **extra)
    with pytest.raises(ConfigError) as e:
        normalize_config(cfg)
    assert str(e.value).startswith(message), str(e.value)
    r = _translate(tmp_path, cfg)
    assert r.returncode == 1, r.stderr
    assert f"error: {message}" in r.stderr, r.stderr
    assert "cfg.json:1:" in r.stderr  # located at the key


def test_defaults_and_layer_freq():
    cfg = normalize_config(dict(BASE, num_moe_experts=4, moe_layer_freq=2))
    assert cfg["moe_router_topk"] == 2  # Megatron's default
    assert cfg["moe_ffn_hidden_size"] == cfg["ffn_hidden_size"] == 128
    assert cfg["moe_aux_loss_coeff"] == cfg["moe_z_loss_coeff"] == 0.0
    assert "moe_capacity_factor" not in cfg  # dropless
    assert cfg["moe_layer_freq"] == [1, 0, 1]  # layers 0, 2, ... as in Megatron
    assert normalize_config(dict(BASE, num_moe_experts=4, moe_layer_freq=[0, 1, 1])
                            )["moe_layer_freq"] == [0, 1, 1]
    assert "num_moe_experts" not in normalize_config(BASE)  # dense graphs unchanged


def test_importer_writes_the_same_defaults(tmp_path):
    r = _translate(tmp_path, dict(BASE, num_moe_experts=4, moe_layer_freq=2))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "o.mlir").read_text()
    for attr in ("moe_router_topk = 2 : i64", "moe_ffn_hidden_size = 128 : i64",
                 "moe_layer_freq = array<i64: 1, 0, 1>", "num_moe_experts = 4 : i64"):
        assert attr in text, attr
    assert "moe_capacity_factor" not in text
    assert text.count("mapp.moe_router ") == 2 and "mapp.moe_aux_loss " not in text
