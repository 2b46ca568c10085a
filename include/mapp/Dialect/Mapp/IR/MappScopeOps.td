//===- MappScopeOps.td - MegaScope observation and perturbation ops -------===//
//
// Included by MappOps.td. Probes and perturbations are inserted by
// --mapp-insert-probes after autodiff and lower to the plan kernels "probe"
// and "perturb" (docs/megascope.md has the attribute contract).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_OPS_TD
#define MAPP_SCOPE_OPS_TD

def Mapp_ProbeOp : Mapp_Op<"probe", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "observe a value: reductions recorded by the runtime's probe sink";
  let description = [{
    Reads `inputs` and records reductions of them; produces nothing, so the
    training step computes exactly what it computed without the probe. The
    write effect keeps the op alive through DCE and ordered after its input.

    * `probe_id`: index into the run's probe table (unique per module).
    * `point`: the observation point as the user wrote it (glob expanded),
      e.g. `layers.0.mlp.fc1`, `grad:lm_head`, `layers.0.attn.probs`.
    * `reduce`: comma-separated reductions: max, min, mean, std, absmax,
      sparsity, hist, topk, sketch, raw, attn.
    * `every`: record every k-th step. `tokens`: selected sequence positions
      (negative counts from the end; absent = all positions).
    * hist: `bins`, `lo`, `hi`; topk: `k`; sketch: `dim`, `seed`;
      sparsity: `eps`; raw: `cap` (elements kept).
    * `attn` takes two inputs, q and k of a `mapp.attention`, with that op's
      `heads`, `scale`, `causal`, `rotary`, `rotary_base`, and records the
      attention probabilities of batch row 0 ([heads, T, T]).
  }];
  let arguments = (ins Variadic<Mapp_FloatTensor>:$inputs, I64Attr:$probe_id,
                       StrAttr:$point, StrAttr:$reduce,
                       DefaultValuedAttr<I64Attr, "1">:$every);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs)";
  let hasVerifier = 1;
}

def Mapp_PerturbOp : Mapp_Op<"perturb", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let summary = "seeded, switchable perturbation of a value (straight-through)";
  let description = [{
    y = x perturbed by `kind` while the run-time switch `switch_id` is on
    (its initial state is `enabled`; the runtime may change it and
    `magnitude` between steps). Kinds: `gaussian` (x + N(0,1)·magnitude),
    `uniform` (x·U(1−magnitude, 1+magnitude)), `offset` (x + magnitude),
    `mask` (the listed last-dim `channels` set to 0), `bitflip` (each element
    has one uniformly chosen bit flipped with probability `p`), `int8` and
    `fp8` (quantize and dequantize: per-tensor absmax int8, or OCP e4m3).
    Noise comes from a counter RNG of (`seed`, step, microbatch, element), so
    runs are reproducible. The gradient treats the op as the identity.
  }];
  let arguments = (ins Mapp_FloatTensor:$x, I64Attr:$switch_id, StrAttr:$kind,
                       StrAttr:$point, StrAttr:$target,
                       DefaultValuedAttr<F64Attr, "0.0">:$magnitude,
                       DefaultValuedAttr<F64Attr, "0.0">:$p,
                       DefaultValuedAttr<I64Attr, "0">:$seed,
                       DefaultValuedAttr<BoolAttr, "true">:$enabled,
                       OptionalAttr<DenseI64ArrayAttr>:$channels);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
  let hasVerifier = 1;
}

#endif // MAPP_SCOPE_OPS_TD
