"""Issue 43, defect 9: model sizes are bounded. python/mapp/config.py and the
C++ importer (mapp-translate --import-gpt-config) take their bounds from one
place, runtime/include/mapp/rt/PlanLimits.h (which the runtime shares), and
reject a config beyond them with the same message."""
import json
import os
import re
import subprocess

import pytest

from conftest import find_tool
from mapp import config
from mapp.config import ConfigError, normalize_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "runtime", "include", "mapp", "rt", "PlanLimits.h")

BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 8,
        "vocab_size": 256}


def header_limits():
    """name -> value of every `inline constexpr ... kName = EXPR;` of the header."""
    text = open(HEADER, encoding="utf-8").read()
    out = {}
    for name, expr in re.findall(r"constexpr\s+\w+\s+(k\w+)\s*=\s*([^;]+);", text):
        expr = re.sub(r"u?int64_t\((\d+)\)", r"\1", expr).replace("INT32_MAX", str(2**31 - 1))
        out[name] = eval(expr, {})  # shifts and integers only
    return out


def test_python_bounds_are_the_header_bounds():
    h = header_limits()
    assert config.LIMITS == {
        "num_layers": h["kMaxLayers"],
        "hidden_size": h["kMaxHiddenSize"],
        "num_attention_heads": h["kMaxAttentionHeads"],
        "num_query_groups": h["kMaxAttentionHeads"],
        "ffn_hidden_size": h["kMaxFfnHiddenSize"],
        "seq_length": h["kMaxSeqLength"],
        "vocab_size": h["kMaxVocabSize"],
        "micro_batch_size": h["kMaxMicroBatchSize"],
        "make_vocab_size_divisible_by": h["kMaxVocabSize"],
    }
    assert config.MAX_EXPERTS == h["kMaxExperts"]
    assert config.MAX_TOKENS_PER_MICROBATCH == h["kMaxTokensPerMicrobatch"]
    assert config.MAX_TENSOR_BYTES == h["kMaxTensorBytes"]


BAD = {
    "layers": ({"num_layers": 10**8},
               "config key 'num_layers': must be at most 1024, got 100000000"),
    "hidden": ({"hidden_size": 2**18}, "config key 'hidden_size': must be at most 131072"),
    "groups": ({"num_query_groups": 8192},
               "config key 'num_query_groups': must be at most 4096, got 8192"),
    "mbs": ({"micro_batch_size": 2**17}, "config key 'micro_batch_size': must be at most 65536"),
    "tokens": ({"seq_length": 2**20, "micro_batch_size": 2**11},
               "config key 'seq_length': micro_batch_size x seq_length = 2147483648 tokens"),
    "ffn-bytes": ({"seq_length": 2**20, "micro_batch_size": 2**10, "ffn_hidden_size": 2**16 + 4},
                  "config key 'ffn_hidden_size': the f32 tensor [micro_batch_size, seq_length, "
                  "ffn_hidden_size] = [1024, 1048576, 65540]"),
    "padded": ({"vocab_size": 4000000, "make_vocab_size_divisible_by": 3000000},
               "config key 'vocab_size': padded to a multiple of 3000000 is 6000000, more than "
               "4194304"),
    "experts": ({"num_moe_experts": 5000},
                "config key 'num_moe_experts': must be at most 4096, got 5000"),
    "moe-ffn": ({"num_moe_experts": 4, "moe_ffn_hidden_size": 2**20},
                "config key 'moe_ffn_hidden_size': must be at most 524288, got 1048576"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_oversized_config_is_rejected_by_both(tmp_path, case):
    extra, message = BAD[case]
    cfg = dict(BASE, **extra)
    with pytest.raises(ConfigError) as e:
        normalize_config(cfg)
    assert str(e.value).startswith(message), str(e.value)
    tool = find_tool("mapp-translate")
    if not tool:
        pytest.skip("mapp-translate not built")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    r = subprocess.run([tool, "--import-gpt-config", str(path), "-o", os.devnull],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"cfg.json:1:" in r.stderr and f"error: {message}" in r.stderr, r.stderr
