//===- MappCpOps.td - context-parallel ops -----------------*- tablegen -*-===//
//
// Context parallelism (--mapp-context-parallel, docs/context-parallel.md):
// the sequence of every row is split over the cp group with causal load
// balancing. With S tokens and cp members the sequence has 2·cp chunks of
// S/(2·cp); member r holds chunks r and 2·cp−1−r, in that order, so every
// member does the same causal attention work.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_CP_OPS_TD
#define MAPP_CP_OPS_TD

class Mapp_CpLayoutOp<string mnemonic> : Mapp_Op<mnemonic, [Pure,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>,
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let arguments = (ins AnyRankedTensor:$x, I64Attr:$dim, I64Attr:$members,
                       DefaultValuedStrAttr<StrAttr, "cp">:$group);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_CpShardOp : Mapp_CpLayoutOp<"cp_shard"> {
  let summary = "this cp member's load-balanced share of a sequence dimension";
  let description = [{
    `x` has the whole sequence (S) along `dim`; the result has S/members:
    chunks r and 2·members−1−r of S/(2·members) each, r the rank's index in
    its `group` (default "cp"). No communication. The gradient is
    `cp_unshard`.
  }];
}

def Mapp_CpUnshardOp : Mapp_CpLayoutOp<"cp_unshard"> {
  let summary = "places this cp member's share into a zero sequence (cp_shard's adjoint)";
  let description = [{
    `x` has S/members along `dim`; the result has S, with x's two chunks at
    chunks r and 2·members−1−r and zeros elsewhere. The gradient is
    `cp_shard`.
  }];
}

def Mapp_CpAttentionOp : Mapp_Op<"cp_attention", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>,
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let summary = "attention over a sequence split over the cp group (ring or all-to-all)";
  let description = [{
    `attention` (same q/k/v layout, heads, GQA, scale, causal, rotary) of the
    rank's load-balanced share of the sequence (cp_shard's chunks) against
    the whole sequence of its cp group of `members` ranks: positions (the
    causal mask, rotary angles) are global. `comm` = "ring": K/V blocks go
    around the group with point-to-point messages, the next block posted
    before the current one is used, and partial results merge with an online
    softmax; "a2a" (Ulysses): all-to-alls turn sequence-sharded q/k/v into
    head-sharded ones over the whole sequence and the output back (heads and
    key/value heads must divide by members).
  }];
  let arguments = (ins Mapp_FloatTensor:$q, Mapp_FloatTensor:$k,
                       Mapp_FloatTensor:$v, I64Attr:$heads, F64Attr:$scale,
                       UnitAttr:$causal, UnitAttr:$rotary,
                       DefaultValuedAttr<F64Attr, "10000.0">:$rotary_base,
                       OptionalAttr<I64Attr>:$rotary_dim,
                       I64Attr:$members, StrAttr:$comm,
                       DefaultValuedStrAttr<StrAttr, "cp">:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$q `,` $k `,` $v attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_CpAttentionGradOp : Mapp_Op<"cp_attention_grad", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let summary = "gradients of cp_attention (recomputes the probabilities; dK/dV go back around the ring)";
  let arguments = (ins Mapp_FloatTensor:$dout, Mapp_FloatTensor:$q,
                       Mapp_FloatTensor:$k, Mapp_FloatTensor:$v,
                       I64Attr:$heads, F64Attr:$scale, UnitAttr:$causal,
                       UnitAttr:$rotary,
                       DefaultValuedAttr<F64Attr, "10000.0">:$rotary_base,
                       OptionalAttr<I64Attr>:$rotary_dim,
                       I64Attr:$members, StrAttr:$comm,
                       DefaultValuedStrAttr<StrAttr, "cp">:$group);
  let results = (outs Mapp_FloatTensor:$dq, Mapp_FloatTensor:$dk,
                      Mapp_FloatTensor:$dv);
  let assemblyFormat = "$dout `,` $q `,` $k `,` $v attr-dict `:` functional-type(operands, results)";
}

#endif // MAPP_CP_OPS_TD
