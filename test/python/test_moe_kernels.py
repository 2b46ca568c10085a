"""Conformance of the MoE CPU kernels against the PyTorch reference of
test/python/moe_ref.py (Megatron's formulas; autograd for gradients)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_ref  # noqa: E402
from test_kernels import close, pytestmark, run_kernel  # noqa: E402,F401

N, E, K, H, F = 12, 4, 2, 6, 10


def test_router_forward_and_grad():
    torch.manual_seed(1)
    logits = torch.randn(N, E, requires_grad=True)
    probs, experts = moe_ref.router(logits, K)
    (p, ex), _ = run_kernel("moe_router", [logits.detach()],
                            [((N, K), torch.float32), ((N, K), torch.int32)], {"topk": K})
    close(p, probs, "probs")
    assert torch.equal(ex.long(), experts)
    dp = torch.randn(N, K)
    (g,) = torch.autograd.grad(probs, logits, dp)
    (dl,), _ = run_kernel("moe_router_grad", [dp, p, ex], [((N, E), torch.float32)])
    close(dl, g, "dlogits")


def test_aux_and_z_loss():
    torch.manual_seed(2)
    logits = torch.randn(N, E, requires_grad=True)
    _, experts = moe_ref.router(logits.detach(), K)
    ex = experts.to(torch.int32)
    aux = moe_ref.aux_loss(logits, experts, 0.01)
    (a,), _ = run_kernel("moe_aux_loss", [logits.detach(), ex], [((), torch.float32)], {"coeff": 0.01})
    close(a, aux, "aux")
    (g,) = torch.autograd.grad(aux, logits)
    (dl,), _ = run_kernel("moe_aux_loss_grad", [torch.tensor(1.0), logits.detach(), ex],
                          [((N, E), torch.float32)], {"coeff": 0.01})
    close(dl, g, "daux")
    z = moe_ref.z_loss(logits, 0.001)
    (zv,), _ = run_kernel("moe_z_loss", [logits.detach()], [((), torch.float32)], {"coeff": 0.001})
    close(zv, z, "z")
    (g,) = torch.autograd.grad(z, logits)
    (dl,), _ = run_kernel("moe_z_loss_grad", [torch.tensor(1.0), logits.detach()],
                          [((N, E), torch.float32)], {"coeff": 0.001})
    close(dl, g, "dz")


def _layer(cap):
    """assign + permute + grouped GEMMs + unpermute against experts_ffn."""
    torch.manual_seed(3)
    x = torch.randn(N, H)
    logits = torch.randn(N, E)
    fc1, fc2 = torch.randn(E, H, F), torch.randn(E, F, H)
    probs, experts = moe_ref.router(logits, K)
    attrs = {"num_experts": E}
    if cap is not None:
        attrs["capacity"] = cap
    (slots, counts), _ = run_kernel("moe_assign", [probs, experts.to(torch.int32)],
                                    [((N, K), torch.int32), ((E,), torch.int32)], attrs)
    keep = moe_ref.kept_mask(probs, experts, E, cap)
    assert torch.equal(slots >= 0, keep)
    assert int(counts.sum()) == int(keep.sum())
    (xp,), _ = run_kernel("moe_permute", [x, slots], [((N * K, H), torch.float32)])
    (h,), _ = run_kernel("moe_grouped_matmul", [xp, fc1, counts], [((N * K, F), torch.float32)])
    h = torch.relu(h)
    (yp,), _ = run_kernel("moe_grouped_matmul", [h, fc2, counts], [((N * K, H), torch.float32)])
    (y,), _ = run_kernel("moe_unpermute", [yp, probs, slots], [((N, H), torch.float32)])
    close(y, moe_ref.experts_ffn(x, probs, experts, keep, fc1, fc2, torch.relu), "moe layer")
    return keep


def test_dropless_layer():
    assert bool(_layer(None).all())


def test_capacity_drops_tokens():
    cap = moe_ref.capacity(N, K, E, 0.5)
    keep = _layer(cap)
    assert not bool(keep.all())  # the case really drops
