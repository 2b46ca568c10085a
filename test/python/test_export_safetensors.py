"""The hand-written safetensors reader/writer."""

import json
import struct

import pytest
import torch

from mapp import safetensors


def test_round_trip(tmp_path):
    ts = {"b.weight": torch.randn(3, 5), "a": torch.arange(7, dtype=torch.int32),
          "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4)}
    p = tmp_path / "t.safetensors"
    safetensors.save(ts, p, {"producer": "test"})
    back, meta = safetensors.load(p)
    assert list(back) == list(ts) and meta == {"producer": "test"}
    for k in ts:
        assert back[k].dtype == ts[k].dtype and torch.equal(back[k], ts[k])


def test_layout(tmp_path):
    p = tmp_path / "t.safetensors"
    safetensors.save({"x": torch.tensor([1.0, 2.0])}, p)
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["x"] == {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert raw[8 + n:] == struct.pack("<2f", 1.0, 2.0)


def test_truncated_is_an_error(tmp_path):
    p = tmp_path / "t.safetensors"
    safetensors.save({"x": torch.randn(16)}, p)
    p.write_bytes(p.read_bytes()[:-4])
    with pytest.raises(ValueError, match="outside the data"):
        safetensors.load(p)
