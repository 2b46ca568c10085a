"""CPU kernels of the model families' options (docs/models.md, "Model
families") against PyTorch written from Hugging Face's descriptions:
attention with a sliding window (Mistral), score soft-capping (Gemma 2),
partial rotary (GPT-NeoX), attention dropout (GPT-2's attn_pdrop, the mask of
docs/semantics.md computed here independently), with grouped-query heads;
rms_norm with weight_offset (Gemma's 1 + weight); softcap (Gemma 2's final
logits). Forward and gradients, as test_kernels.py checks the plain ones."""
import math

import pytest
import torch

from test_kernels import KERNEL_CHECK, close, f32, fwd, grads, run_kernel, splitmix64

pytestmark = pytest.mark.skipif(KERNEL_CHECK is None, reason="mapp-kernel-check not built")


def rotate(x, base, dim):
    """Rotate-half rotary on the first `dim` columns of [B, heads, T, D]."""
    t = x.shape[2]
    i = torch.arange(dim // 2, dtype=torch.float64)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-2 * i / dim)[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x0, x1, rest = x[..., :dim // 2], x[..., dim // 2:dim], x[..., dim:]
    return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin, rest], -1)


def drop_mask(b, heads, t, p, seed, step):
    """Dropout's factors for P[b, h, i, j] (docs/semantics.md: u =
    splitmix(seed ^ splitmix(step ^ splitmix(n))) >> 40 / 2^24, kept when
    u >= p), n = ((b·heads + h)·T + i)·T + j."""
    keep = torch.empty(b * heads * t * t)
    for n in range(keep.numel()):
        r = splitmix64(seed ^ splitmix64(step ^ splitmix64(n)))
        keep[n] = 1.0 / (1.0 - p) if (r >> 40) / 16777216.0 >= p else 0.0
    return keep.view(b, heads, t, t)


def ref(q, k, v, heads, scale, window=None, softcap=None, rotary_dim=None,
        base=10000.0, drop=None):
    b, t, h = q.shape
    d = h // heads
    kv = k.shape[2] // d
    split = lambda x, n: x.view(b, t, n, d).transpose(1, 2)
    q, k, v = split(q, heads), split(k, kv), split(v, kv)
    if rotary_dim:
        q, k = rotate(q, base, rotary_dim), rotate(k, base, rotary_dim)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    keep = j <= i
    if window:
        keep = keep & (i - j < window)
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    if drop is not None:
        p = p * drop
    return (p @ v).transpose(1, 2).reshape(b, t, h)


CASES = {
    # name: (heads, kv heads, D, attrs)
    "window": (4, 2, 8, {"sliding_window": 3}),
    "softcap": (4, 4, 8, {"softcap": 1.5}),
    "window+softcap+rotary": (4, 2, 8, {"sliding_window": 4, "softcap": 2.0,
                                        "rotary": True, "rotary_base": 500.0}),
    "partial rotary": (2, 2, 16, {"rotary": True, "rotary_base": 500.0, "rotary_dim": 4}),
    "dropout": (2, 1, 8, {"dropout": 0.3, "dropout_seed": 9}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_options(name):
    heads, kv, d, extra = CASES[name]
    b, t = 2, 9
    q, k, v = f32(b, t, heads * d), f32(b, t, kv * d), f32(b, t, kv * d)
    scale = 1 / math.sqrt(d)
    attrs = dict(extra, heads=heads, scale=scale, causal=True)
    step = 4
    drop = (drop_mask(b, heads, t, extra["dropout"], extra["dropout_seed"], step)
            if "dropout" in extra else None)
    fn = lambda q_, k_, v_: ref(q_, k_, v_, heads, scale, extra.get("sliding_window"),
                                extra.get("softcap"),
                                extra.get("rotary_dim", d) if extra.get("rotary") else None,
                                extra.get("rotary_base", 10000.0), drop)
    fwd("attention", [q, k, v], fn(q, k, v), attrs, step=step)
    do = f32(b, t, heads * d)
    want = grads(fn, [q, k, v], do, [0, 1, 2])
    outs, _ = run_kernel("attention_grad", [do, q, k, v],
                         [((b, t, heads * d), torch.float32),
                          ((b, t, kv * d), torch.float32),
                          ((b, t, kv * d), torch.float32)], attrs, step=step)
    for o, r, n in zip(outs, want, ["dq", "dk", "dv"]):
        close(o, r, f"{name} {n}")


def test_options_change_the_result():
    """Each option is live: the kernel's output without it differs."""
    q, k, v = f32(1, 9, 16), f32(1, 9, 16), f32(1, 9, 16)
    base = {"heads": 2, "scale": 0.3, "causal": True}
    (plain,), _ = run_kernel("attention", [q, k, v], [((1, 9, 16), torch.float32)], base)
    for extra in ({"sliding_window": 3}, {"softcap": 0.5}, {"dropout": 0.3, "dropout_seed": 1}):
        (o,), _ = run_kernel("attention", [q, k, v], [((1, 9, 16), torch.float32)],
                             dict(base, **extra))
        assert (o - plain).abs().max() > 1e-3, extra


def test_rms_norm_weight_offset():
    x, g = f32(3, 5, 16), f32(16) * 0.1
    fn = lambda x_, g_: x_ * torch.rsqrt(x_.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + g_)
    attrs = {"eps": 1e-6, "weight_offset": 1.0}
    fwd("rms_norm", [x, g], fn(x, g), attrs)
    dy = f32(3, 5, 16)
    dx, dg = grads(fn, [x, g], dy, [0, 1])
    outs, _ = run_kernel("rms_norm_grad", [dy, x, g],
                         [((3, 5, 16), torch.float32), ((16,), torch.float32)], attrs)
    close(outs[0], dx, "dx")
    close(outs[1], dg, "dgamma")


def test_softcap():
    x = f32(4, 33) * 5
    fn = lambda x_: 2.5 * torch.tanh(x_ / 2.5)
    fwd("softcap", [x], fn(x), {"cap": 2.5})
    dy = f32(4, 33)
    (dx,) = grads(fn, [x], dy, [0])
    (out,), _ = run_kernel("softcap_grad", [dy, x], [((4, 33), torch.float32)], {"cap": 2.5})
    close(out, dx, "softcap dx")
    run_kernel("softcap", [x], [((4, 33), torch.float32)], {"cap": 0.0},
               expect_error="cap must be > 0")
