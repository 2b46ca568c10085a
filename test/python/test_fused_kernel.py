"""Issue 37: the `fused` kernel (mapp.fused's program, docs/fusion.md) run on
its own by mapp-kernel-check against PyTorch: the three operand loads (in
place, a suffix bias, a general broadcast), several results, a final
reduce_sum over leading dims; and a bad program refused at load naming the
statement."""

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


def test_bad_program_is_refused():
    x = torch.randn(4)
    run_kernel("fused", [x], [((4,), torch.float32)],
               {"program": "neg(%i0); frobnicate(%0)", "domain": [4], "outputs": [1]},
               expect_error="statement 1: unknown op 'frobnicate'")
    run_kernel("fused", [x], [((4,), torch.float32)],
               {"program": "neg(%i0)", "domain": [3], "outputs": [0]},
               expect_error="does not broadcast to the domain")
