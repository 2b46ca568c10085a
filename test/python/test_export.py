"""The exporter: graph structure for the reference model, names, types,
patterns, errors that name the aten op and the source line, the CLI, and
(when built) that mapp-opt parses and verifies the output."""

import collections
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import ROOT, find_tool
from mapp import safetensors
from mapp.config import normalize_config
from mapp.export import example_inputs, export_module
from mapp.reference import GPT
from mapp.values import ExportError

TINY = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
            vocab_size=64, micro_batch_size=2)
OP_RE = re.compile(r'^\s*%\S+ = "(mapp\.\w+)"\((.*?)\)(?: \{(.*)\})? : \((.*?)\) -> (\S+)$')


def export(cfg):
    m = GPT(cfg)
    return m, export_module(m, *example_inputs(normalize_config(cfg)),
                            model_attrs={"kind": m.config["variant"]})


def ops(text):
    out = []
    for line in text.splitlines():
        m = OP_RE.match(line)
        if m:
            name = re.search(r'mapp\.name = "([^"]*)"', m.group(3) or "")
            out.append((m.group(1), name.group(1) if name else None, m.group(3) or "", m.group(5)))
    return out


def counts(text):
    return collections.Counter(o[0] for o in ops(text) if o[0] != "mapp.param_ref")


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_structure(tied):
    m, text = export({**TINY, "tie_embeddings": tied})
    L = 2
    assert counts(text) == {"mapp.embedding": 1, "mapp.add": 1 + 2 * L, "mapp.layer_norm": 2 * L + 1,
                            "mapp.linear": 4 * L + 1, "mapp.slice": 3 * L, "mapp.attention": L,
                            "mapp.gelu": L, "mapp.cross_entropy": 1}
    params = re.findall(r'"mapp.param"\(\) \{sym_name = "([^"]+)"', text)
    assert params == list(m.state_dict().keys())
    names = [o[1] for o in ops(text) if o[0] != "mapp.param_ref"]
    assert len(names) == len(set(names)), "mapp.name values must be unique"
    assert names[:3] == ["wte", "add", "layers.0.ln1"]
    assert names[-3:] == ["ln_f", "lm_head", "cross_entropy"]
    for want in ("layers.1.attn.qkv", "layers.1.attn.attention", "layers.1.attn.proj",
                 "layers.1.mlp.fc1", "layers.1.mlp.gelu", "layers.1.mlp.fc2", "layers.1.add_1"):
        assert want in names
    head = [o for o in ops(text) if o[1] == "lm_head"][0]
    assert head[3] == "tensor<2x8x64xf32>"
    refs = re.findall(r'param = @"([^"]+)"', text)
    assert refs.count("wte.weight") == (2 if tied else 1)
    assert "func.func @forward(%tokens: tensor<2x8xi32>, %targets: tensor<2x8xi32>) -> tensor<f32>" in text


@pytest.mark.parametrize("tied", [True, False])
def test_llama_structure(tied):
    m, text = export({**TINY, "variant": "llama", "tie_embeddings": tied, "ffn_hidden_size": 48})
    L = 2
    assert counts(text) == {"mapp.embedding": 1, "mapp.add": 2 * L, "mapp.rms_norm": 2 * L + 1,
                            "mapp.linear": 5 * L + 1, "mapp.slice": 3 * L, "mapp.attention": L,
                            "mapp.silu": L, "mapp.mul": L, "mapp.cross_entropy": 1}
    att = [o for o in ops(text) if o[0] == "mapp.attention"][0]
    assert "heads = 4 : i64" in att[2] and "causal" in att[2] and "rotary," in att[2]
    assert "rotary_base = 10000.0 : f64" in att[2]
    assert f"scale = {1 / math.sqrt(8)!r} : f64" in att[2]
    assert [o[1] for o in ops(text) if o[0] == "mapp.linear"][:6] == [
        "layers.0.attn.qkv", "layers.0.attn.proj", "layers.0.mlp.gate", "layers.0.mlp.up",
        "layers.0.mlp.down", "layers.1.attn.qkv"]


def test_rotary_base_is_recovered():
    _, text = export({**TINY, "variant": "llama", "rotary_base": 500000})
    assert "rotary_base = 500000.0 : f64" in text


def test_dropout_and_untanh_gelu():
    _, text = export({**TINY, "hidden_dropout": 0.1, "gelu_approximate": "none"})
    drops = [o for o in ops(text) if o[0] == "mapp.dropout"]
    assert [o[1] for o in drops] == ["dropout", "layers.0.dropout", "layers.0.dropout_1",
                                     "layers.1.dropout", "layers.1.dropout_1"]
    assert [re.search(r"seed = (\d+)", o[2]).group(1) for o in drops] == ["0", "1", "2", "3", "4"]
    assert all("p = 0.1 : f64" in o[2] for o in drops)
    assert 'approximate = "none"' in text


def test_attention_dropout_lowers_generically():
    """Issue 38: dropout on the attention probabilities has no fused form,
    so the attention is emitted as its ops (matmul, mask, softmax,
    dropout, matmul) rather than refused."""
    c = counts(export({**TINY, "attention_dropout": 0.1})[1])
    assert c["mapp.attention"] == 0 and c["mapp.softmax"] == TINY["num_layers"], c
    assert c["mapp.dropout"] >= TINY["num_layers"] and c["mapp.matmul"] >= 2 * TINY["num_layers"], c


class Cumsum(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab_size"], 8)

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        x = torch.cumsum(x, dim=1)  # CUMSUM_LINE
        return x.mean()


class Sort(Cumsum):
    def forward(self, tokens, targets):
        x, _ = torch.sort(self.emb(tokens), dim=-1)  # SORT_LINE
        return x.mean()


class ArgMax(Cumsum):
    def forward(self, tokens, targets):
        x = self.emb(tokens)
        i = torch.max(x, dim=-1).indices
        return (x * i.unsqueeze(-1)).mean()  # ARGMAX_USE_LINE


def test_max_indices_refused_by_name():
    """torch.max(x, dim) lowers its values (mapp.reduce_max); a use of its
    indices is refused, naming them and the line that uses them."""
    with pytest.raises(ExportError) as e:
        export_module(ArgMax(TINY), *example_inputs(TINY))
    msg = str(e.value)
    assert "the indices of torch.max(x, dim) (argmax)" in msg, msg
    assert f"{os.path.abspath(__file__)}:{_line('# ARGMAX_USE_LINE')}" in msg, msg


def _line(marker):
    with open(__file__) as f:
        return next(i for i, l in enumerate(f, 1) if l.rstrip().endswith(marker) and "def" not in l)


@pytest.mark.parametrize("cls,op,marker", [(Cumsum, "aten.cumsum", "# CUMSUM_LINE"),
                                           (Sort, "aten.sort", "# SORT_LINE")])
def test_unsupported_op_names_op_and_line(cls, op, marker):
    m = cls(TINY)
    with pytest.raises(ExportError) as e:
        export_module(m, *example_inputs(TINY))
    msg = str(e.value)
    assert op in msg
    assert f"{os.path.abspath(__file__)}:{_line(marker)}" in msg


class Plain(nn.Module):
    """Non-GPT code: user-written pieces the exporter maps op by op."""

    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab_size"], 16)
        self.norm = nn.LayerNorm(16, elementwise_affine=False)
        self.fc = nn.Linear(16, cfg["vocab_size"])

    def forward(self, tokens, targets):
        x = self.norm(self.emb(tokens))
        x = torch.cat([x[:, :, 8:], x[:, :, :8]], dim=-1).transpose(0, 1).transpose(0, 1)
        x = F.silu(x) * 2.0 - x
        logits = self.fc(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten().long())


def test_generic_module():
    text = export_module(Plain(TINY), *example_inputs(TINY))
    c = counts(text)
    assert c["mapp.concat"] == 1 and c["mapp.slice"] == 2 and c["mapp.fill"] == 2
    assert "mapp.transpose" not in c and "mapp.reshape" not in c
    # x - y is mapp.sub (the tensor algebra), no longer x + (-1)·y.
    assert c["mapp.scale"] == 1 and c["mapp.sub"] == 1
    assert c["mapp.linear"] == 1 and c["mapp.cross_entropy"] == 1
    names = [o[1] for o in ops(text) if o[0] == "mapp.layer_norm"]
    assert names == ["norm"]


def test_cli_writes_ir_and_weights(tmp_path):
    out, w = tmp_path / "m.mlir", tmp_path / "w.safetensors"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
                        "--config", os.path.join(ROOT, "examples", "llama-tiny.json"),
                        "-o", str(out), "--weights", str(w), "--seed", "7"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'kind = "llama"' in out.read_text()
    tensors, meta = safetensors.load(str(w))
    ref = GPT(normalize_config(open(os.path.join(ROOT, "examples", "llama-tiny.json")).read()), seed=7)
    assert list(tensors) == list(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(tensors[k], v)


def test_cli_error_exit(tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text('{"num_layers": 1, "hidden_size": 30, "num_attention_heads": 4, '
                   '"seq_length": 8, "vocab_size": 16}')
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
                        "--config", str(cfg), "-o", str(tmp_path / "m.mlir")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "num_attention_heads" in r.stderr


@pytest.mark.parametrize("example", ["gpt-tiny", "llama-tiny", "gpt-small"])
def test_mapp_opt_verifies(tmp_path, example):
    opt = find_tool("mapp-opt")
    if opt is None:
        pytest.skip("mapp-opt not built (set MAPP_OPT or build into build/)")
    out = tmp_path / "m.mlir"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
                        "--config", os.path.join(ROOT, "examples", f"{example}.json"), "-o", str(out)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([opt, str(out), "-o", os.devnull], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
