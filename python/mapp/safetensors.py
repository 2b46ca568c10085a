"""safetensors read/write, by hand (no safetensors package on these machines).

Layout: u64 little-endian header size N, N bytes of JSON
  {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
   "__metadata__": {"k": "v"}}
padded with spaces to a multiple of 8, then the raw little-endian data;
offsets are relative to the end of the header.  Tensors are written in the
order given (state_dict order), which keeps files reproducible.
"""

import json
import struct

import numpy as np
import torch

_DTYPES = {
    torch.float32: ("F32", np.float32),
    torch.float16: ("F16", np.float16),
    torch.float64: ("F64", np.float64),
    torch.int32: ("I32", np.int32),
    torch.int64: ("I64", np.int64),
    torch.int8: ("I8", np.int8),
    torch.uint8: ("U8", np.uint8),
    torch.bool: ("BOOL", np.bool_),
}
_BY_NAME = {name: (dt, np_dt) for dt, (name, np_dt) in _DTYPES.items()}


def save(tensors, path, metadata=None):
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} not supported by this writer")
        code, np_dt = _DTYPES[t.dtype]
        data = t.numpy().astype(np_dt, copy=False).astype(np.dtype(np_dt).newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load(path):
    """Returns (dict name -> tensor in file order, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header size {n} exceeds the file")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dt, np_dt = _BY_NAME[info["dtype"]]
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor {name} lies outside the data")
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(np_dt).newbyteorder("<"))
        if arr.size != int(np.prod(info["shape"], dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name} has {arr.size} elements, shape says {info['shape']}")
        out[name] = torch.from_numpy(arr.astype(np_dt).reshape(info["shape"]).copy()).to(dt)
    return out, meta
