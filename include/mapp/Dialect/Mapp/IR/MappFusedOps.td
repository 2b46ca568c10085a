// mapp.fused (issue 37): a fusion region formed by --mapp-fuse, its body a
// compact program (mapp/rt/FusedProgram.h, docs/fusion.md) that the plan
// carries as the instruction's attributes and the backends evaluate in one
// pass over memory, with no kernel written for the composition.
#ifndef MAPP_FUSED_OPS_TD
#define MAPP_FUSED_OPS_TD

include "mapp/Dialect/Mapp/IR/MappDialect.td"
include "mapp/Dialect/Mapp/IR/MappOpInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Mapp_FusedOp : Mapp_Op<"fused", [Pure,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let summary = "elementwise ops (and a final reduce_sum) evaluated in one pass";
  let description = [{
    `program`: statements over the iteration domain `domain` (a shape), e.g.
    `silu(%i0); mul(%0, %i1)`: `%iK` is operand K, loaded with NumPy
    broadcasting to `domain`; `%N` is statement N. An optional last
    statement `reduce_sum[dims](%N)` sums over the listed domain dims. A
    row program (docs/fusion.md) has reduce_sums over the trailing dims
    (the rows) anywhere, one value per row; `row` statements compute once
    per row; others read a row value broadcast along its row.
    `outputs[k]` is the statement whose value result k holds: the domain's
    shape, or for the reduce_sum statement the domain without its dims (a
    row value: the rows' shape, or with the row dims kept as 1).
    Values are computed in f32 and stored in each result's element type.
    Formed after autodiff, so it has no gradient rule.
  }];
  let arguments = (ins Variadic<Mapp_FloatTensor>:$inputs, StrAttr:$program,
                       DenseI64ArrayAttr:$domain, DenseI64ArrayAttr:$outputs);
  let results = (outs Variadic<Mapp_FloatTensor>:$values);
  let assemblyFormat = "$inputs attr-dict `:` functional-type($inputs, $values)";
  let hasVerifier = 1;
}

#endif // MAPP_FUSED_OPS_TD
