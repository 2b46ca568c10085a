#ifndef MAPP_OPS_TD
#define MAPP_OPS_TD

include "mapp/Dialect/Mapp/IR/MappDialect.td"
include "mapp/Dialect/Mapp/IR/MappAttrs.td"
include "mapp/Dialect/Mapp/IR/MappOpInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Mapp_FloatTensor : RankedTensorOf<[F32, BF16, F16, F8E4M3FN, F8E5M2]>;
def Mapp_IndexTensor : RankedTensorOf<[I32, I64]>;
def Mapp_Scalar : 0DTensorOf<[F32]>;

//===----------------------------------------------------------------------===//
// Op classes
//===----------------------------------------------------------------------===//

// A compute op: pure, costed, lowered to one plan instruction.
class Mapp_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Mapp_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>])>;

// A compute op that autodiff can differentiate.
class Mapp_DiffOp<string mnemonic, list<Trait> traits = []>
    : Mapp_ComputeOp<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<Mapp_GradientOpInterface>])>;

class Mapp_UnaryOp<string mnemonic, list<Trait> traits = []>
    : Mapp_DiffOp<mnemonic, !listconcat(traits, [SameOperandsAndResultType])> {
  let arguments = (ins Mapp_FloatTensor:$x);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

//===----------------------------------------------------------------------===//
// Parameters and gradients
//===----------------------------------------------------------------------===//

def Mapp_ParamOp : Mapp_Op<"param", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a trainable parameter, named as in a PyTorch state_dict";
  let description = [{
    Declares a parameter tensor such as `layers.3.attn.qkv.weight`. The name
    is kept through every pass and is the key in safetensors checkpoints.
    `init` says how the runtime initializes it without a weights file
    ("normal", "ones", "zeros"); `std` is the normal's standard deviation.

    With `shard_dim`, `type` is this rank's slice of the full tensor along
    that dim, split over the parallel group `shard_group` ("tp", "dp" or
    "ep", the expert-parallel group of --mapp-expert-parallel):
    the full tensor is cut along `shard_dim` into `shard_blocks` (default 1)
    equal blocks, each block into group-size equal pieces, and rank r holds
    piece r of every block, concatenated in block order. `shard_blocks = 3`
    describes a fused qkv weight [3H, K] whose q, k and v blocks are sharded
    separately, so every rank holds whole heads of each.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Mapp_FloatTensor>:$type,
                       DefaultValuedStrAttr<StrAttr, "normal">:$init,
                       OptionalAttr<F64Attr>:$std,
                       OptionalAttr<I64Attr>:$shard_dim,
                       OptionalAttr<StrAttr>:$shard_group,
                       OptionalAttr<I64Attr>:$shard_blocks);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
}

def Mapp_ParamRefOp : Mapp_Op<"param_ref",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the current value of a parameter";
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$param attr-dict `:` type($result)";
}

def Mapp_GradAccumulateOp : Mapp_Op<"grad_accumulate",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "add a gradient contribution into a parameter's gradient buffer";
  let description = [{
    The buffer is zeroed before the first microbatch of a step, so after the
    backward of every microbatch it holds the summed gradient.
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, Mapp_FloatTensor:$grad);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($grad)";
}

def Mapp_GradRefOp : Mapp_Op<"grad_ref",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead]>]> {
  let summary = "the accumulated gradient of a parameter";
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$param attr-dict `:` type($result)";
}

def Mapp_GlobalNormOp : Mapp_ComputeOp<"global_norm"> {
  let summary = "sqrt of the summed squares of all operands";
  let arguments = (ins Variadic<Mapp_FloatTensor>:$grads);
  let results = (outs Mapp_Scalar:$result);
  let assemblyFormat = "$grads attr-dict `:` type($grads) `->` type($result)";
  let hasVerifier = 1;
}

class Mapp_UpdateOp<string mnemonic> : Mapp_Op<mnemonic,
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead, MemWrite]>,
     DeclareOpInterfaceMethods<Mapp_CostOpInterface,
                               ["getFlops", "getBytesWritten"]>]> {
  let assemblyFormat = [{
    $param `,` $grad (`clip` `(` $norm^ `:` type($norm) `)`)? attr-dict `:` type($grad)
  }];
  let hasVerifier = 1;
}

def Mapp_AdamWOp : Mapp_UpdateOp<"adamw"> {
  let summary = "AdamW update with decoupled weight decay (torch.optim.AdamW)";
  let description = [{
    Updates the parameter and its two moment buffers in place. With a `clip`
    operand (the global gradient norm) the gradient is scaled by
    min(1, max_norm / (norm + 1e-6)) first. The learning rate follows
    `schedule` ("constant" or "cosine": linear warmup over `warmup` steps,
    cosine decay to `min_lr` at `total_steps`).
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, Mapp_FloatTensor:$grad,
      Optional<Mapp_Scalar>:$norm,
      F64Attr:$lr, DefaultValuedAttr<F64Attr, "0.9">:$beta1,
      DefaultValuedAttr<F64Attr, "0.999">:$beta2,
      DefaultValuedAttr<F64Attr, "1.0e-8">:$eps,
      DefaultValuedAttr<F64Attr, "0.01">:$weight_decay,
      DefaultValuedAttr<F64Attr, "0.0">:$max_norm,
      DefaultValuedStrAttr<StrAttr, "constant">:$schedule,
      DefaultValuedAttr<I64Attr, "0">:$warmup,
      DefaultValuedAttr<I64Attr, "0">:$total_steps,
      DefaultValuedAttr<F64Attr, "0.0">:$min_lr);
}

def Mapp_SGDOp : Mapp_UpdateOp<"sgd"> {
  let summary = "SGD with momentum (torch.optim.SGD)";
  let arguments = (ins FlatSymbolRefAttr:$param, Mapp_FloatTensor:$grad,
      Optional<Mapp_Scalar>:$norm,
      F64Attr:$lr, DefaultValuedAttr<F64Attr, "0.0">:$momentum,
      DefaultValuedAttr<F64Attr, "0.0">:$weight_decay,
      DefaultValuedAttr<F64Attr, "0.0">:$max_norm,
      DefaultValuedStrAttr<StrAttr, "constant">:$schedule,
      DefaultValuedAttr<I64Attr, "0">:$warmup,
      DefaultValuedAttr<I64Attr, "0">:$total_steps,
      DefaultValuedAttr<F64Attr, "0.0">:$min_lr);
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

def Mapp_EmbeddingOp : Mapp_DiffOp<"embedding"> {
  let summary = "row lookup: y[i] = table[ids[i]]";
  let description = [{
    With `group` (vocab-parallel), `table` is this rank's contiguous slice of
    the vocabulary: rank r of the group holds rows [r·V, (r+1)·V) where V is
    the table's first dim; ids outside that range give zero rows (the
    partial results are summed over the group by a following all_reduce).
  }];
  let arguments = (ins Mapp_FloatTensor:$table, Mapp_IndexTensor:$ids,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$table `,` $ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_EmbeddingGradOp : Mapp_ComputeOp<"embedding_grad"> {
  let summary = "scatter-add of row gradients into a [vocab, hidden] table";
  let description = [{
    With `group`, the table is the rank's vocabulary slice as for embedding:
    rows of ids outside [r·vocab, (r+1)·vocab) are dropped.
  }];
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_IndexTensor:$ids, I64Attr:$vocab,
                       OptionalAttr<StrAttr>:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy `,` $ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_LinearOp : Mapp_DiffOp<"linear"> {
  let summary = "y = x·wᵀ (+ b), weight in nn.Linear's [out, in] layout";
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$w,
                       Optional<Mapp_FloatTensor>:$bias);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $w (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mapp_MatmulOp : Mapp_DiffOp<"matmul"> {
  let summary = "(batched) matrix product with transpose flags";
  let description = [{
    `a` is [..., M, K] ([..., K, M] with `transpose_a`); `b` is [K, N] or
    batched with the same leading dims as `a` ([N, K] / [..., N, K] with
    `transpose_b`). The result is [..., M, N].
  }];
  let arguments = (ins Mapp_FloatTensor:$a, Mapp_FloatTensor:$b,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$a `,` $b attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// FP8 (--mapp-mixed-precision compute=fp8; docs/checkpoints.md, "FP8")
//===----------------------------------------------------------------------===//

// The scaling state of one fp8 linear layer is a parameter `<layer>.fp8_meta`
// (init "fp8_meta", no gradient use, no optimizer update): f32[3 * (1 + H)],
// three rows of (scale, amax history h[0..H-1]): row 0 the input x, row 1
// the weight w, row 2 the output gradient dy. h[0] collects the current
// step's amax; mapp.fp8_update turns the history into the next step's scale.
class Mapp_Fp8GemmOp<string mnemonic> : Mapp_Op<mnemonic,
    [MemoryEffects<[MemRead, MemWrite]>,
     DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let hasVerifier = 1;
}

def Mapp_Fp8LinearOp : Mapp_Fp8GemmOp<"fp8_linear"> {
  let summary = "linear with both operands quantized to fp8 (delayed scaling)";
  let description = [{
    y = (q(x·s_x) · q(w·s_w)ᵀ) / (s_x·s_w) (+ b): x and w are scaled by the
    scales in rows `meta_a` and `meta_b` of `meta`, saturated to the format's
    largest finite value and rounded to nearest even in `fp8_a` / `fp8_b`
    ("e4m3" = OCP E4M3FN, max 448; "e5m2" = OCP E5M2, max 57344), multiplied
    exactly and accumulated in fp32. The op also max-accumulates amax(|x|)
    and amax(|w|) (before scaling) into h[0] of those rows: it writes
    `meta`. `fast_accum` lets the CUDA backend use fp8 fast accumulation.
  }];
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$w,
                       Optional<Mapp_FloatTensor>:$bias, Mapp_FloatTensor:$meta,
                       StrAttr:$fp8_a, StrAttr:$fp8_b, I64Attr:$meta_a,
                       I64Attr:$meta_b, UnitAttr:$fast_accum);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $w (`,` $bias^)? `meta` `(` $meta `)` attr-dict `:` functional-type(operands, results)
  }];
}

def Mapp_Fp8MatmulOp : Mapp_Fp8GemmOp<"fp8_matmul"> {
  let summary = "matmul with both operands quantized to fp8 (delayed scaling)";
  let description = [{
    mapp.matmul's product (2-D b; a [..., M, K], or [K, M] with
    `transpose_a`) on operands quantized like mapp.fp8_linear's: a with row
    `meta_a` in `fp8_a`, b with row `meta_b` in `fp8_b`; amaxes into h[0]
    of those rows. The input gradient (dy·w) and weight gradient (dyᵀ·x) of
    an fp8 linear layer.
  }];
  let arguments = (ins Mapp_FloatTensor:$a, Mapp_FloatTensor:$b,
                       Mapp_FloatTensor:$meta, UnitAttr:$transpose_a,
                       StrAttr:$fp8_a, StrAttr:$fp8_b, I64Attr:$meta_a,
                       I64Attr:$meta_b, UnitAttr:$fast_accum);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = [{
    $a `,` $b `meta` `(` $meta `)` attr-dict `:` functional-type(operands, results)
  }];
}

def Mapp_Fp8UpdateOp : Mapp_Op<"fp8_update",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "delayed scaling: the next step's fp8 scales from the amax history";
  let description = [{
    In @optimizer_step, once per step, in place on the parameter `param`
    (an fp8 meta, see above). For each row r (x, w, dy) with its format
    (`format_x`, `format_w`, `format_dy`):
    a = max(h[0..H-1]); if a is finite and > 0, scale = fmax / a / 2^margin
    (fmax: 448 for e4m3, 57344 for e5m2), else the scale is kept; then the
    history rolls: h[i] = h[i-1] for i = H-1..1, h[0] = 0. `history` = H.
    Transformer Engine's DelayedScaling with amax_compute_algo = "max".
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, StrAttr:$format_x,
                       StrAttr:$format_w, StrAttr:$format_dy,
                       I64Attr:$history, I64Attr:$margin);
  let assemblyFormat = "$param attr-dict";
  let hasVerifier = 1;
}

def Mapp_ReduceSumOp : Mapp_DiffOp<"reduce_sum"> {
  let summary = "sum over the listed dims, which are removed";
  let arguments = (ins Mapp_FloatTensor:$x, DenseI64ArrayAttr:$dims);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

class Mapp_BinaryOp<string mnemonic> : Mapp_DiffOp<mnemonic> {
  let description = [{
    `rhs`'s shape must be a suffix of `lhs`'s (trailing broadcast); the
    result has `lhs`'s type.
  }];
  let arguments = (ins Mapp_FloatTensor:$lhs, Mapp_FloatTensor:$rhs);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_AddOp : Mapp_BinaryOp<"add"> {
  let summary = "elementwise sum";
  let hasCanonicalizer = 1;
}
def Mapp_MulOp : Mapp_BinaryOp<"mul"> { let summary = "elementwise product"; }

def Mapp_ScaleOp : Mapp_UnaryOp<"scale"> {
  let summary = "y = factor·x";
  let arguments = (ins Mapp_FloatTensor:$x, F64Attr:$factor);
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Mapp_GeluOp : Mapp_UnaryOp<"gelu"> {
  let summary = "GELU, exact (erf) or tanh-approximated as in F.gelu";
  let arguments = (ins Mapp_FloatTensor:$x,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let hasVerifier = 1;
}

def Mapp_SiluOp : Mapp_UnaryOp<"silu"> { let summary = "x·sigmoid(x)"; }

def Mapp_SoftcapOp : Mapp_UnaryOp<"softcap"> {
  let summary = "y = cap·tanh(x/cap) (Gemma 2's final_logit_softcapping)";
  let arguments = (ins Mapp_FloatTensor:$x, F64Attr:$cap);
  let hasVerifier = 1;
}

class Mapp_ActGradOp<string mnemonic> : Mapp_ComputeOp<mnemonic,
    [SameOperandsAndResultType]> {
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy `,` $x attr-dict `:` type($x)";
}

def Mapp_GeluGradOp : Mapp_ActGradOp<"gelu_grad"> {
  let summary = "dx = dy·gelu'(x)";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$x,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
}

def Mapp_SiluGradOp : Mapp_ActGradOp<"silu_grad"> {
  let summary = "dx = dy·silu'(x)";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$x);
}

def Mapp_SoftcapGradOp : Mapp_ActGradOp<"softcap_grad"> {
  let summary = "dx = dy·(1 − tanh²(x/cap))";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$x, F64Attr:$cap);
}

def Mapp_LayerNormOp : Mapp_DiffOp<"layer_norm"> {
  let summary = "layer normalization over the last dim";
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$gamma,
                       Mapp_FloatTensor:$beta,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x `,` $gamma `,` $beta attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_LayerNormGradOp : Mapp_ComputeOp<"layer_norm_grad"> {
  let summary = "gradients of layer_norm (recomputes its statistics)";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$x,
                       Mapp_FloatTensor:$gamma,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps);
  let results = (outs Mapp_FloatTensor:$dx, Mapp_FloatTensor:$dgamma,
                      Mapp_FloatTensor:$dbeta);
  let assemblyFormat = "$dy `,` $x `,` $gamma attr-dict `:` functional-type(operands, results)";
}

def Mapp_RMSNormOp : Mapp_DiffOp<"rms_norm"> {
  let summary = "RMS normalization over the last dim";
  let description = [{
    y = x·rsqrt(mean(x²) + eps)·(gamma + weight_offset); Gemma stores the
    gain as 1 + weight (weight_offset = 1).
  }];
  let arguments = (ins Mapp_FloatTensor:$x, Mapp_FloatTensor:$gamma,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps,
                       DefaultValuedAttr<F64Attr, "0.0">:$weight_offset);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x `,` $gamma attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_RMSNormGradOp : Mapp_ComputeOp<"rms_norm_grad"> {
  let summary = "gradients of rms_norm";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$x,
                       Mapp_FloatTensor:$gamma,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps,
                       DefaultValuedAttr<F64Attr, "0.0">:$weight_offset);
  let results = (outs Mapp_FloatTensor:$dx, Mapp_FloatTensor:$dgamma);
  let assemblyFormat = "$dy `,` $x `,` $gamma attr-dict `:` functional-type(operands, results)";
}

def Mapp_SoftmaxOp : Mapp_UnaryOp<"softmax"> {
  let summary = "softmax over the last dim";
}

def Mapp_SoftmaxGradOp : Mapp_ComputeOp<"softmax_grad", [SameOperandsAndResultType]> {
  let summary = "dx = y·(dy − Σ dy·y) from the softmax output y";
  let arguments = (ins Mapp_FloatTensor:$dy, Mapp_FloatTensor:$y);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy `,` $y attr-dict `:` type($y)";
}

def Mapp_AttentionOp : Mapp_DiffOp<"attention"> {
  let summary = "fused multi-head (causal) attention";
  let description = [{
    q is [B, T, H]; `heads` splits H into heads of D = H/heads. k and v are
    [B, T, G·D] with G key/value heads dividing `heads` (G < heads is
    grouped-query attention, G = 1 multi-query); query head i attends with
    key/value head i / (heads/G).
    Per head: softmax(mask(softcap(scale·q·kᵀ)))·v. With `rotary`, q and k are
    rotated first (rotate-half form, base `rotary_base`) over their first
    `rotary_dim` columns (default all D; GPT-NeoX's partial rotary).
    `softcap` c > 0 (Gemma 2's attn_logit_softcapping) maps each score s to
    c·tanh(s/c). `sliding_window` W (Mistral, Gemma 2) lets query i see only
    keys j with i − j < W, besides the causal mask. `dropout` p > 0 drops
    probabilities P[b, h, i, j] with dropout's counter-based mask (seed
    `dropout_seed`, element index ((b·heads + h)·T + i)·T + j; kept ones are
    scaled by 1/(1 − p)), as GPT-2's attn_pdrop.
  }];
  let arguments = (ins Mapp_FloatTensor:$q, Mapp_FloatTensor:$k,
                       Mapp_FloatTensor:$v, I64Attr:$heads, F64Attr:$scale,
                       UnitAttr:$causal, UnitAttr:$rotary,
                       DefaultValuedAttr<F64Attr, "10000.0">:$rotary_base,
                       OptionalAttr<I64Attr>:$rotary_dim,
                       OptionalAttr<F64Attr>:$softcap,
                       OptionalAttr<I64Attr>:$sliding_window,
                       OptionalAttr<F64Attr>:$dropout,
                       OptionalAttr<I64Attr>:$dropout_seed);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$q `,` $k `,` $v attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_AttentionGradOp : Mapp_ComputeOp<"attention_grad"> {
  let summary = "gradients of attention (recomputes the probabilities)";
  let arguments = (ins Mapp_FloatTensor:$dout, Mapp_FloatTensor:$q,
                       Mapp_FloatTensor:$k, Mapp_FloatTensor:$v,
                       I64Attr:$heads, F64Attr:$scale, UnitAttr:$causal,
                       UnitAttr:$rotary,
                       DefaultValuedAttr<F64Attr, "10000.0">:$rotary_base,
                       OptionalAttr<I64Attr>:$rotary_dim,
                       OptionalAttr<F64Attr>:$softcap,
                       OptionalAttr<I64Attr>:$sliding_window,
                       OptionalAttr<F64Attr>:$dropout,
                       OptionalAttr<I64Attr>:$dropout_seed);
  let results = (outs Mapp_FloatTensor:$dq, Mapp_FloatTensor:$dk,
                      Mapp_FloatTensor:$dv);
  let assemblyFormat = "$dout `,` $q `,` $k `,` $v attr-dict `:` functional-type(operands, results)";
}

def Mapp_DropoutOp : Mapp_UnaryOp<"dropout"> {
  let summary = "seeded dropout (counter-based mask, see docs/semantics.md)";
  let arguments = (ins Mapp_FloatTensor:$x, F64Attr:$p, I64Attr:$seed);
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Mapp_DropoutGradOp : Mapp_ComputeOp<"dropout_grad", [SameOperandsAndResultType]> {
  let summary = "applies the forward dropout's mask to the gradient";
  let arguments = (ins Mapp_FloatTensor:$dy, F64Attr:$p, I64Attr:$seed);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy attr-dict `:` type($dy)";
}

def Mapp_CrossEntropyOp : Mapp_DiffOp<"cross_entropy"> {
  let summary = "mean next-token cross-entropy over non-ignored rows";
  let arguments = (ins Mapp_FloatTensor:$logits, Mapp_IndexTensor:$targets,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Mapp_Scalar:$result);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_CrossEntropyGradOp : Mapp_ComputeOp<"cross_entropy_grad"> {
  let summary = "dlogits = dloss·(softmax − onehot)/count";
  let arguments = (ins Mapp_Scalar:$dloss, Mapp_FloatTensor:$logits,
                       Mapp_IndexTensor:$targets,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dloss `,` $logits `,` $targets attr-dict `:` functional-type(operands, results)";
}

def Mapp_ReshapeOp : Mapp_DiffOp<"reshape"> {
  let summary = "same elements, new shape (row-major)";
  let arguments = (ins Mapp_FloatTensor:$x);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Mapp_TransposeOp : Mapp_DiffOp<"transpose"> {
  let summary = "permute dims (x.permute(perm))";
  let arguments = (ins Mapp_FloatTensor:$x, DenseI64ArrayAttr:$perm);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Mapp_SliceOp : Mapp_DiffOp<"slice"> {
  let summary = "x.narrow(dim, start, end − start)";
  let arguments = (ins Mapp_FloatTensor:$x, I64Attr:$dim, I64Attr:$start,
                       I64Attr:$end);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Mapp_SliceGradOp : Mapp_ComputeOp<"slice_grad"> {
  let summary = "zeros of the result type with dy written at [start, start+len) of dim";
  let arguments = (ins Mapp_FloatTensor:$dy, I64Attr:$dim, I64Attr:$start);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dy attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_ConcatOp : Mapp_DiffOp<"concat"> {
  let summary = "torch.cat along dim";
  let arguments = (ins Variadic<Mapp_FloatTensor>:$inputs, I64Attr:$dim);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_FillOp : Mapp_ComputeOp<"fill"> {
  let summary = "a tensor with every element equal to value";
  let arguments = (ins F64Attr:$value);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def Mapp_ReduceMaxOp : Mapp_DiffOp<"reduce_max"> {
  let summary = "max over the listed dims, which are removed";
  let description = [{
    The gradient is torch.amax's: each reduced slice's dy is shared evenly
    among the elements equal to its max (torch.max(x, dim) gives it all to
    one of them; the two differ only on ties).
  }];
  let arguments = (ins Mapp_FloatTensor:$x, DenseI64ArrayAttr:$dims);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_VocabCEPartialsOp : Mapp_DiffOp<"vocab_ce_partials"> {
  let summary = "per-row partial sums of a vocab-parallel cross-entropy";
  let description = [{
    `logits` [..., V] is rank r's slice of the vocabulary over `group`
    (global ids [r·V, (r+1)·V)); `rowmax` [...] is the row max over the whole
    vocabulary (all_reduce max of reduce_max). The result [..., 2] holds
    per row (Σ_v exp(logits_v − rowmax), logits_t − rowmax if the target t
    lies in this rank's range else 0). Summed over the group (all_reduce
    sum), `ce_from_partials` turns them into the loss. The gradient never
    flows into `rowmax`: the loss does not depend on the shift.
  }];
  let arguments = (ins Mapp_FloatTensor:$logits, Mapp_IndexTensor:$targets,
                       Mapp_FloatTensor:$rowmax, StrAttr:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$logits `,` $targets `,` $rowmax attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_VocabCEPartialsGradOp : Mapp_ComputeOp<"vocab_ce_partials_grad"> {
  let summary = "dlogits = dp[...,0]·exp(logits − rowmax) + dp[...,1]·onehot_local(t)";
  let arguments = (ins Mapp_FloatTensor:$dpartials, Mapp_FloatTensor:$logits,
                       Mapp_IndexTensor:$targets, Mapp_FloatTensor:$rowmax,
                       StrAttr:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dpartials `,` $logits `,` $targets `,` $rowmax attr-dict `:` functional-type(operands, results)";
}

def Mapp_CEFromPartialsOp : Mapp_DiffOp<"ce_from_partials"> {
  let summary = "mean over non-ignored rows of log(partials[...,0]) − partials[...,1]";
  let arguments = (ins Mapp_FloatTensor:$partials, Mapp_IndexTensor:$targets,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Mapp_Scalar:$result);
  let assemblyFormat = "$partials `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_CEFromPartialsGradOp : Mapp_ComputeOp<"ce_from_partials_grad"> {
  let summary = "dpartials = dloss/count · (1/partials[...,0], −1), 0 on ignored rows";
  let arguments = (ins Mapp_Scalar:$dloss, Mapp_FloatTensor:$partials,
                       Mapp_IndexTensor:$targets,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$dloss `,` $partials `,` $targets attr-dict `:` functional-type(operands, results)";
}

include "mapp/Dialect/Mapp/IR/MappCommOps.td"
include "mapp/Dialect/Mapp/IR/MappScopeOps.td"
include "mapp/Dialect/Mapp/IR/MappMoeOps.td"
include "mapp/Dialect/Mapp/IR/MappTensorOps.td"
include "mapp/Dialect/Mapp/IR/MappCpOps.td"
include "mapp/Dialect/Mapp/IR/MappFusedOps.td"

#endif // MAPP_OPS_TD
