"""Writes small, deliberately broken safetensors files for mapp-run tests:
python3 write_safetensors.py KIND OUT, KIND one of
  garbage-header   a header that is not JSON
  not-object       a JSON header that is not an object
  int-tensor       wte.weight stored as I32 with the right shape
  float-shape      a shape of floats ([256.0, 64.5]): nlohmann truncated them
  float-offsets    data_offsets [0, 1e308]: a float cast to an integer (UB)"""
import json
import struct
import sys

kind, out = sys.argv[1], sys.argv[2]
if kind == "garbage-header":
    header, data = b'{"wte.weight": {"dtype": F32 !!', b""
elif kind == "not-object":
    header, data = b"[1, 2, 3]", b""
elif kind == "int-tensor":
    header = json.dumps({"wte.weight": {"dtype": "I32", "shape": [256, 64],
                                        "data_offsets": [0, 256 * 64 * 4]}}).encode()
    data = bytes(256 * 64 * 4)
elif kind in ("float-shape", "float-offsets"):
    shape, end = ([256.0, 64.5], 256 * 64 * 4) if kind == "float-shape" \
        else ([256, 64], 1e308)
    header = json.dumps({"wte.weight": {"dtype": "F32", "shape": shape,
                                        "data_offsets": [0, end]}}).encode()
    data = bytes(256 * 64 * 4)
else:
    sys.exit("unknown kind " + kind)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
