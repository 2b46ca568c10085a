"""The host fp8 rounding (mapp::rt::fp8Round, restated here in numpy from the
OCP FP8 spec as test/python/fp8_ref.py does) against torch's float8 casts
(torch >= 2.1: torch.float8_e4m3fn / float8_e5m2), on the device machine.

torch's cast rounds to nearest even but does not saturate (overflow gives
NaN for e4m3fn, inf for e5m2), so the values are clamped to +-max first, which
is what __NV_SATFINITE does. Prints one line; exit 1 on a mismatch.
"""
import sys

import numpy as np
import torch

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from fp8_ref import fp8_round, FP8_MAX  # noqa: E402

rng = np.random.default_rng(5)
bad = 0
total = 0
for fmt, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
    # Every fp8 value, midpoints and neighbours, and a wide random spread.
    grid = torch.arange(256, dtype=torch.uint8).view(dt).float().numpy()
    grid = np.unique(grid[np.isfinite(grid)])
    mids = (grid[1:] + grid[:-1]) / 2
    vals = np.concatenate([grid, mids, np.nextafter(mids, -np.inf), np.nextafter(mids, np.inf),
                           rng.standard_normal(200000) * np.exp2(rng.uniform(-22, 18, 200000)),
                           [FP8_MAX[fmt] * 1.5, 1e30, -1e30]]).astype(np.float32)
    ours = fp8_round(vals, fmt)
    clamped = torch.from_numpy(np.clip(vals, -FP8_MAX[fmt], FP8_MAX[fmt]))
    theirs = clamped.to("cuda" if torch.cuda.is_available() else "cpu").to(dt).float().cpu().numpy()
    n = int(np.sum(ours != theirs))
    bad += n
    total += len(vals)
print(f"fp8 rounding vs torch float8 casts: {total - bad}/{total} equal" + (" OK" if not bad else " FAIL"))
sys.exit(1 if bad else 0)
