"""Lowering of the mixture-of-experts ops (torch.ops.mapp.moe_*, defined in
moe.py) to the mapp ops of the same names (docs/moe.md).  A mixin of
lower.Lowering: one trace node, one mapp op.  Expert ids, slots and counts
are i32 in mapp whatever torch's integer type."""

from . import ir
from .values import Tensor, Tuple, fail


class MoeLowering:
    def _moe(self, node, name, operands, results, attrs=None):
        vals = [o.materialize(self, node) for o in operands]
        out = self.b.op_multi(name, vals, results, attrs, module=self.module(node))
        return [Tensor(v) for v in out]

    def _rows(self, node, x, what):
        if len(x.shape) != 2:
            fail(node, f"{what} must be 2-d [tokens, features], got {list(x.shape)}")

    def op_moe_router(self, node, logits, topk):
        self._rows(node, logits, "router logits")
        n = logits.shape[0]
        probs, experts = self._moe(node, "mapp.moe_router", [logits],
                                   [((n, topk), logits.elem), ((n, topk), "i32")],
                                   {"topk": ir.I64(topk)})
        return Tuple([probs, experts])

    def op_moe_assign(self, node, probs, experts, num_experts, capacity):
        attrs = {"num_experts": ir.I64(num_experts)}
        if capacity > 0:
            attrs["capacity"] = ir.I64(capacity)
        slots, counts = self._moe(node, "mapp.moe_assign", [probs, experts],
                                  [(experts.shape, "i32"), ((num_experts,), "i32")], attrs)
        return Tuple([slots, counts])

    def op_moe_permute(self, node, x, slots):
        self._rows(node, x, "moe_permute input")
        rows = slots.shape[0] * slots.shape[1]
        return self.emit(node, "mapp.moe_permute", [x, slots], (rows, x.shape[1]))

    def op_moe_grouped_matmul(self, node, x, w, counts):
        return self.emit(node, "mapp.moe_grouped_matmul", [x, w, counts],
                         (x.shape[0], w.shape[2]))

    def op_moe_unpermute(self, node, y, probs, slots):
        return self.emit(node, "mapp.moe_unpermute", [y, probs, slots],
                         (slots.shape[0], y.shape[1]))

    def op_moe_aux_loss(self, node, logits, experts, coeff):
        return self.emit(node, "mapp.moe_aux_loss", [logits, experts], (),
                         {"coeff": ir.F64(coeff)})

    def op_moe_z_loss(self, node, logits, coeff):
        return self.emit(node, "mapp.moe_z_loss", [logits], (), {"coeff": ir.F64(coeff)})
