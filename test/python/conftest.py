"""pytest setup for the Python front end: python/ on sys.path, and helpers
to find the built tools (MAPP_OPT / MAPP_BIN or build/bin)."""

import json
import os
import pathlib
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def find_tool(name):
    """The built tool `name`: $MAPP_<NAME> (mapp-make-test-plan:
    MAPP_MAKE_TEST_PLAN), else $MAPP_BIN, build/bin, build-rt (the
    standalone runtime build) or the PATH; None if none has it."""
    env = os.environ.get(name.upper().replace("-", "_"))
    if env and os.path.exists(env):
        return env
    for d in (os.environ.get("MAPP_BIN"), os.path.join(ROOT, "build", "bin"),
              os.path.join(ROOT, "build-rt")):
        if d and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return shutil.which(name)


def require_tool(name):
    """find_tool, or skip the test when the tool is not built."""
    import pytest
    path = find_tool(name)
    if not path:
        pytest.skip(f"{name} is not built")
    return path


def read_st(path):
    """name -> (shape, values) of an F32 safetensors file, without torch."""
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32"
        b, e = h["data_offsets"]
        data = raw[8 + n + b:8 + n + e]
        out[name] = (h["shape"], struct.unpack(f"<{len(data) // 4}f", data))
    return out
