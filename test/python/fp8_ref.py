"""An independent numpy reference of the fp8 recipe (docs/checkpoints.md,
"FP8"), written from the OCP 8-bit floating point spec (OFP8 v1.0) and
Transformer Engine's DelayedScaling, not from mapp's C++:

- E4M3 (E4M3FN): 4 exponent bits, bias 7, 3 mantissa bits, no infinities,
  largest finite 448 (S.1111.110), smallest subnormal 2^-9.
- E5M2: 5 exponent bits, bias 15, 2 mantissa bits, largest finite 57344,
  smallest subnormal 2^-16.
- Conversion: round to nearest, ties to even; saturating (|x| > max -> max).
- Delayed scaling: scale = fp8_max / max(amax_history) / 2^margin when that
  max is finite and > 0, else the scale is kept; then the history rolls.

Used by test/python/test_fp8.py and, on the device, by
bench/gpu/fp8_torch_check.py against torch's float8 casts.
"""
import numpy as np

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_BITS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def fp8_grid(fmt):
    """Every non-negative finite value of the format, from its bit layout."""
    eb, mb, bias = _BITS[fmt]
    vals = []
    for e in range(2 ** eb):
        for m in range(2 ** mb):
            if fmt == "e4m3" and e == 15 and m == 7:
                continue  # NaN
            if fmt == "e5m2" and e == 31:
                continue  # inf / NaN
            if e == 0:
                vals.append(m * 2.0 ** (1 - bias - mb))
            else:
                vals.append((1 + m / 2 ** mb) * 2.0 ** (e - bias))
    return np.array(sorted(vals))


_GRIDS = {f: fp8_grid(f) for f in FP8_MAX}


def fp8_round(x, fmt):
    """Nearest grid value, ties to the even mantissa, saturated; NaN stays."""
    x = np.asarray(x, dtype=np.float64)
    g = _GRIDS[fmt]
    a = np.minimum(np.abs(x), g[-1])
    hi = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lo = hi - 1
    dlo, dhi = a - g[lo], g[hi] - a
    # Index parity is mantissa parity: consecutive grid values differ by one
    # in their bit pattern.
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    r = np.where(pick_hi, g[hi], g[lo])
    r = np.where(a == g[-1], g[-1], r)
    out = np.copysign(r, x)
    return np.where(np.isnan(x), np.nan, out).astype(np.float32)


def quantize(v, scale, fmt):
    """The rounded values of v * scale (the multiply in fp32)."""
    return fp8_round(np.float32(scale) * np.asarray(v, dtype=np.float32), fmt)


def update_row(row, history, margin, fmt):
    """One meta row (scale, h[0..H-1]) after a step, as a new array."""
    row = np.array(row, dtype=np.float32)
    h = row[1:1 + history]
    amax = np.nan if np.isnan(h).any() else float(h.max())
    if np.isfinite(amax) and amax > 0:
        s = np.float32(np.float32(FP8_MAX[fmt]) / np.float32(amax)) / np.float32(2.0 ** margin)
        if np.isfinite(s):
            row[0] = s
    if history > 1:
        row[2:1 + history] = h[:history - 1].copy()
    row[1] = 0
    return row
