"""Issue 37: the `fused` kernel (mapp.fused's program, docs/fusion.md) run on
its own by mapp-kernel-check against PyTorch: the three operand loads (in
place, a suffix bias, a general broadcast), several results, a final
reduce_sum over leading dims; a row program (a LayerNorm, two row sums in the
middle of the program, rows longer than a 256-element block); row programs
with a reduce_max (a softmax and a cross-entropy's log-sum-exp, rows with
-inf and large values; the max bit-identical to the unfused reduce_max,
NaN included); and a bad program refused at load naming the statement."""

import torch
import torch.nn.functional as F

from test_kernels import close, run_kernel

PROGRAM = "mul(%i0, %i1); add(%0, %i2); gelu[tanh](%1); reduce_sum[0,1](%2)"


def test_fused_program_matches_pytorch():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 300)   # more than one 256-element block per row
    rows = torch.randn(2, 3, 1)  # a general broadcast (strides)
    bias = torch.randn(300)      # a suffix of the domain
    attrs = {"program": PROGRAM, "domain": [2, 3, 300], "outputs": [1, 3]}
    (pre, summed), _ = run_kernel("fused", [x, rows, bias],
                                  [((2, 3, 300), torch.float32), ((300,), torch.float32)],
                                  attrs)
    want_pre = x * rows + bias
    close(pre, want_pre, "fused: x*rows + bias")
    close(summed, F.gelu(want_pre.double(), approximate="tanh").sum(dim=(0, 1)),
          "fused: reduce_sum of gelu")


LAYER_NORM = ("reduce_sum[2](%i0); row scale[{inv}](%0); sub(%i0, %1); mul(%2, %2); "
              "reduce_sum[2](%3); row scale[{inv}](%4); row add(%5, %i1); row rsqrt(%6); "
              "mul(%2, %7); mul(%8, %i2); add(%9, %i3)")


def test_row_program_layer_norm_matches_pytorch():
    torch.manual_seed(1)
    c = 300
    x = torch.randn(2, 3, c) * 3 + 1
    eps = torch.tensor(1e-5)                  # read per row (a scalar)
    w, b = torch.randn(c), torch.randn(c)
    attrs = {"program": LAYER_NORM.format(inv=repr(1.0 / c)), "domain": [2, 3, c],
             "outputs": [10, 7]}
    (y, rstd), _ = run_kernel("fused", [x, eps, w, b],
                              [((2, 3, c), torch.float32), ((2, 3, 1), torch.float32)], attrs)
    xd = x.double()
    want_rstd = torch.rsqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-5)
    close(rstd, want_rstd, "fused row program: the row factor")
    close(y, F.layer_norm(xd, (c,), w.double(), b.double(), eps=1e-5),
          "fused row program: layer norm")


SOFTMAX = "reduce_max[2](%i0); sub(%i0, %0); exp(%1); reduce_sum[2](%2); div(%2, %3)"


def softmax_rows(c, seed):
    """[2, 3, c] logits: large values (exp without the max shift overflows)
    and -inf entries (masked positions), never a whole row of -inf."""
    torch.manual_seed(seed)
    x = torch.randn(2, 3, c) * 4
    x[0, 0, :] += 200.0
    x[1, 2, 1::3] = float("-inf")
    x[0, 1, c // 2] = 500.0
    return x


def test_row_program_softmax_matches_pytorch():
    for c in (1, 7, 33, 300):  # one element; not multiples of 8 / 32; several blocks
        x = softmax_rows(c, c)
        (y, m), _ = run_kernel("fused", [x],
                               [((2, 3, c), torch.float32), ((2, 3), torch.float32)],
                               {"program": SOFTMAX, "domain": [2, 3, c], "outputs": [4, 0]})
        assert torch.equal(m, x.amax(-1)), "fused softmax: the row max"
        close(y, torch.softmax(x.double(), -1), f"fused softmax, rows of {c}")


def test_row_program_softmax_is_the_unfused_chain():
    # The unfused kernels one by one (the broadcasts as torch copies: the
    # same bits).
    c = 45
    x = softmax_rows(c, 3)
    (y,), _ = run_kernel("fused", [x], [((2, 3, c), torch.float32)],
                         {"program": SOFTMAX, "domain": [2, 3, c], "outputs": [4]})
    f32 = torch.float32
    (m,), _ = run_kernel("reduce_max", [x], [((2, 3), f32)], {"dims": [2]})
    (d,), _ = run_kernel("sub", [x, m[..., None].expand(2, 3, c).contiguous()],
                          [((2, 3, c), f32)])
    (e,), _ = run_kernel("exp", [d], [((2, 3, c), f32)])
    (t,), _ = run_kernel("reduce_sum", [e], [((2, 3), f32)], {"dims": [2]})
    (want,), _ = run_kernel("div", [e, t[..., None].expand(2, 3, c).contiguous()],
                             [((2, 3, c), f32)])
    assert torch.equal(y, want), (y - want).abs().max()


def test_row_program_cross_entropy_matches_pytorch():
    # loss = log Σ exp(x − max) + max − x_target per row (the target as a
    # one-hot operand: gathers are not in the vocabulary).
    c = 37
    x = softmax_rows(c, 5)
    target = torch.randint(0, c, (2, 3))
    target[1, 2] = 0  # a finite logit in the row with -inf entries
    onehot = F.one_hot(target, c).to(torch.float32)
    # select, not a product with the one-hot: -inf · 0 is NaN.
    prog = ("reduce_max[2](%i0); sub(%i0, %0); exp(%1); reduce_sum[2](%2); row log(%3); "
            "row add(%4, %0); select(%i1, %i0, %i2); reduce_sum[2](%6); row sub(%5, %7)")
    (loss,), _ = run_kernel("fused", [x, onehot, torch.tensor(0.0)], [((2, 3), torch.float32)],
                            {"program": prog, "domain": [2, 3, c], "outputs": [8]})
    want = F.cross_entropy(x.double().reshape(6, c), target.reshape(6),
                           reduction="none").reshape(2, 3)
    close(loss, want, "fused cross-entropy (log-sum-exp)")


def test_row_max_is_the_unfused_reduce_max():
    # The unfused kernel's rule: a NaN is skipped (a row of NaNs gives -inf).
    torch.manual_seed(2)
    x = torch.randn(4, 45)
    x[0, 3] = float("nan")
    x[1, :] = float("nan")
    x[2, :] = float("-inf")
    x[3, 0] = float("inf")
    (fused,), _ = run_kernel("fused", [x], [((4,), torch.float32)],
                             {"program": "reduce_max[1](%i0)", "domain": [4, 45],
                              "outputs": [0]})
    (unfused,), _ = run_kernel("reduce_max", [x], [((4,), torch.float32)], {"dims": [1]})
    assert torch.equal(fused, unfused), (fused, unfused)
    assert torch.equal(fused, torch.where(x.isnan(), float("-inf"), x).amax(-1))


def test_bad_program_is_refused():
    x = torch.randn(4)
    run_kernel("fused", [x], [((4,), torch.float32)],
               {"program": "neg(%i0); frobnicate(%0)", "domain": [4], "outputs": [1]},
               expect_error="statement 1: unknown op 'frobnicate'")
    run_kernel("fused", [x], [((4,), torch.float32)],
               {"program": "neg(%i0)", "domain": [3], "outputs": [0]},
               expect_error="does not broadcast to the domain")
    # A row value read by a row statement must be one per row.
    run_kernel("fused", [x.reshape(2, 2)], [((2,), torch.float32)],
               {"program": "exp(%i0); reduce_sum[1](%0); row mul(%1, %0)", "domain": [2, 2],
                "outputs": [2]},
               expect_error="statement 2: a row statement reads %0, a value per element")
    # reduce_max reduces the rows only (the trailing dims).
    run_kernel("fused", [x.reshape(2, 2)], [((2,), torch.float32)],
               {"program": "reduce_max[0](%i0)", "domain": [2, 2], "outputs": [0]},
               expect_error="a reduce_max inside a row program")
