//===- MappMoeOps.td - mixture-of-experts ops -----------------------------===//
//
// Included by MappOps.td. One MoE layer (docs/moe.md) is
//
//   logits           = linear(x, router.weight)            [N, E]
//   probs, experts   = moe_router(logits) {topk}            [N, k] each
//   slots, counts    = moe_assign(probs, experts)           [N, k], [E]
//   xp               = moe_permute(x, slots)                [R, H], R = N·k
//   h                = moe_grouped_matmul(xp, fc1, counts)  [R, F]
//   h                = gelu(h)
//   yp               = moe_grouped_matmul(h, fc2, counts)   [R, H]
//   y                = moe_unpermute(yp, probs, slots)      [N, H]
//   loss            += moe_aux_loss(logits, experts) + moe_z_loss(logits)
//
// Rows of a permuted buffer are grouped by expert: expert e owns rows
// [Σ_{e'<e} counts[e'], Σ_{e'<=e} counts[e']); rows past Σ counts are zero.
// Integer results carry no gradient; the kernels check the data-dependent
// conditions (slots and expert ids in range, Σ counts <= rows).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MOE_OPS_TD
#define MAPP_MOE_OPS_TD

def Mapp_I32Tensor : RankedTensorOf<[I32]>;

def Mapp_MoeRouterOp : Mapp_DiffOp<"moe_router"> {
  let summary = "softmax over experts, top-k, renormalized top-k probabilities";
  let description = [{
    `logits` is [N, E]. Per token: s = softmax(logits), the `topk` largest
    entries of s (ties: lower expert id first), in descending order, as
    `experts` [N, k] (i32) and `probs` [N, k] = s_top / Σ s_top. This is
    Megatron's default (use_pre_softmax=False: softmax over the top-k
    logits), which equals softmax, top-k, renormalize.
  }];
  let arguments = (ins Mapp_FloatTensor:$logits, I64Attr:$topk);
  let results = (outs Mapp_FloatTensor:$probs, Mapp_I32Tensor:$experts);
  let assemblyFormat = "$logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeRouterGradOp : Mapp_ComputeOp<"moe_router_grad"> {
  let summary = "dlogits[n, experts[n,j]] = p_j·(dp_j − Σ_i dp_i·p_i), 0 elsewhere";
  let arguments = (ins Mapp_FloatTensor:$dprobs, Mapp_FloatTensor:$probs,
                       Mapp_I32Tensor:$experts);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dprobs `,` $probs `,` $experts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeAssignOp : Mapp_ComputeOp<"moe_assign"> {
  let summary = "rows of the expert-sorted buffer per (token, choice); capacity drops";
  let description = [{
    `experts` [N, k] are the router's choices, `probs` their probabilities.
    Without `capacity` (dropless) every choice is kept. With `capacity` C,
    expert e keeps the C choices with the highest probability (ties: lower
    token index) and drops the rest (Megatron's drop_policy="probs").
    Kept choices of expert e are laid out in token order after those of
    experts < e: `slots[n, j]` is the row of choice (n, j), -1 when dropped;
    `counts[e]` is the number of rows of expert e. Nothing is
    differentiable (the outputs are integers).
  }];
  let arguments = (ins Mapp_FloatTensor:$probs, Mapp_I32Tensor:$experts,
                       I64Attr:$num_experts, OptionalAttr<I64Attr>:$capacity);
  let results = (outs Mapp_I32Tensor:$slots, Mapp_I32Tensor:$counts);
  let assemblyFormat = "$probs `,` $experts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoePermuteOp : Mapp_DiffOp<"moe_permute"> {
  let summary = "y[slots[n, j]] = x[n] for kept choices; other rows zero";
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_I32Tensor:$slots);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x `,` $slots attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoePermuteGradOp : Mapp_ComputeOp<"moe_permute_grad"> {
  let summary = "dx[n] = Σ_j dy[slots[n, j]] over kept choices";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_I32Tensor:$slots);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy `,` $slots attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeUnpermuteOp : Mapp_DiffOp<"moe_unpermute"> {
  let summary = "out[n] = Σ_j probs[n, j]·y[slots[n, j]] over kept choices";
  let arguments = (ins Mapp_FloatTensor:$y, Mapp_FloatTensor:$probs,
                       Mapp_I32Tensor:$slots);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$y `,` $probs `,` $slots attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeUnpermuteGradOp : Mapp_ComputeOp<"moe_unpermute_grad"> {
  let summary = "dy[slots[n,j]] = probs[n,j]·dout[n]; dprobs[n,j] = dout[n]·y[slots[n,j]]";
  let description = [{
    Rows of dy that no kept choice maps to are zero, as are dprobs of
    dropped choices.
  }];
  let arguments = (ins Mapp_FloatTensor:$dout, Mapp_FloatTensor:$y,
                       Mapp_FloatTensor:$probs, Mapp_I32Tensor:$slots);
  let results = (outs Mapp_FloatTensor:$dy, Mapp_FloatTensor:$dprobs);
  let assemblyFormat = "$dout `,` $y `,` $probs `,` $slots attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeGroupedMatmulOp : Mapp_DiffOp<"moe_grouped_matmul"> {
  let summary = "per-expert matrix product over the expert-sorted rows";
  let description = [{
    `x` is [R, K], `w` is [E, K, N] ([E, N, K] with `transpose_b`),
    `counts` [E]. The rows of expert e (see moe_assign) are multiplied by
    w[e] (w[e]ᵀ); rows past Σ counts are zero in the result [R, N].
  }];
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$w,
                       Mapp_I32Tensor:$counts, UnitAttr:$transpose_b);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x `,` $w `,` $counts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeGroupedMatmulWgradOp : Mapp_ComputeOp<"moe_grouped_matmul_wgrad"> {
  let summary = "dw[e] = x_eᵀ·dy_e over the rows of expert e";
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$dy,
                       Mapp_I32Tensor:$counts);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x `,` $dy `,` $counts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeAuxLossOp : Mapp_DiffOp<"moe_aux_loss"> {
  let summary = "Switch load-balancing loss: coeff·E·Σ_e f_e·P_e";
  let description = [{
    `logits` [N, E], `experts` [N, k] (the router's choices before any
    capacity drop, as Megatron counts them). f_e = (choices of e)/(N·k),
    P_e = mean_n softmax(logits)[n, e]. The gradient flows into `logits`
    only (f is a count).
  }];
  let arguments = (ins Mapp_FloatTensor:$logits, Mapp_I32Tensor:$experts,
                       F64Attr:$coeff);
  let results = (outs Mapp_Scalar:$result);
  let assemblyFormat = "$logits `,` $experts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeAuxLossGradOp : Mapp_ComputeOp<"moe_aux_loss_grad"> {
  let summary = "dlogits of moe_aux_loss (softmax backward of coeff·E·f_e/N)";
  let arguments = (ins Mapp_Scalar:$dloss, Mapp_FloatTensor:$logits,
                       Mapp_I32Tensor:$experts, F64Attr:$coeff);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dloss `,` $logits `,` $experts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeZLossOp : Mapp_DiffOp<"moe_z_loss"> {
  let summary = "router z-loss: coeff·mean_n(logsumexp(logits[n])²)";
  let arguments = (ins Mapp_FloatTensor:$logits, F64Attr:$coeff);
  let results = (outs Mapp_Scalar:$result);
  let assemblyFormat = "$logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_MoeZLossGradOp : Mapp_ComputeOp<"moe_z_loss_grad"> {
  let summary = "dlogits[n] = dloss·coeff·2·lse_n/N·softmax(logits[n])";
  let arguments = (ins Mapp_Scalar:$dloss, Mapp_FloatTensor:$logits,
                       F64Attr:$coeff);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dloss `,` $logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Expert parallelism (--mapp-expert-parallel, docs/expert-parallel.md)
//===----------------------------------------------------------------------===//

class Mapp_ExpertCommOp<string mnemonic, list<Trait> traits = []>
    : Mapp_Op<mnemonic, !listconcat(traits, [
        MemoryEffects<[MemRead, MemWrite]>,
        DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>,
        DeclareOpInterfaceMethods<Mapp_GradientOpInterface>])> {
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The parallel group ("ep" unless set) or "" when explicit ranks.
    ::llvm::StringRef getGroupName() {
      if (getRanks())
        return ::llvm::StringRef();
      return getGroup() ? *getGroup() : ::llvm::StringRef("ep");
    }
  }];
}

def Mapp_EpDispatchOp : Mapp_ExpertCommOp<"ep_dispatch"> {
  let summary = "send each expert's permuted rows to the member that owns it (variable all_to_all)";
  let description = [{
    `x` [N, ...] are this rank's rows sorted by global expert (what
    moe_permute produces), `counts` [E] the rows of each expert (rows past
    Σ counts are padding). Member j of the expert-parallel group (`group`,
    default "ep", or explicit `ranks`) of `members` ranks owns experts
    [j·E/members, (j+1)·E/members). The result `y` [C, ...] holds the rows
    every member routed to this rank's experts, grouped by local expert,
    source member minor; rows past their total are zero. C must hold the
    total: the dropless worst case is members·N (every member routes every
    row here); with a capacity c per expert, E·c suffices. `local_counts`
    [E/members] (optional) are the rows per local expert, the counts of
    the grouped GEMMs that follow.

    The gradient of dispatch is `ep_combine` with the same counts (the
    route is a partial permutation; its adjoint sends each row back).
  }];
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_I32Tensor:$counts,
                       I64Attr:$members, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks);
  let results = (outs Mapp_FloatTensor:$y,
                      Optional<Mapp_I32Tensor>:$local_counts);
  let assemblyFormat = "$x `,` $counts attr-dict `:` functional-type(operands, results)";
}

def Mapp_EpCombineOp : Mapp_ExpertCommOp<"ep_combine"> {
  let summary = "return expert output rows to the ranks and rows they came from";
  let description = [{
    The inverse of `ep_dispatch` with the same `counts` [E] (this rank's
    rows per global expert before dispatch) and group: `y` [C, ...] holds
    this rank's experts' rows as dispatch laid them out; the result `x`
    [N, ...] has every row back at its place in the sender's expert-sorted
    buffer; rows past Σ counts are zero. The gradient is `ep_dispatch`
    with the same counts.
  }];
  let arguments = (ins Mapp_FloatTensor:$y, Mapp_I32Tensor:$counts,
                       I64Attr:$members, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks);
  let results = (outs Mapp_FloatTensor:$x);
  let assemblyFormat = "$y `,` $counts attr-dict `:` functional-type(operands, results)";
}

#endif // MAPP_MOE_OPS_TD
