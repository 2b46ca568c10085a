//===- FusionPasses.td - fusion passes (issue 37) ----------*- tablegen -*-===//
//
// Part of Passes.td (the umbrella includes it): the passes of
// lib/Transforms/Fusion, docs/fusion.md.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRANSFORMS_FUSIONPASSES_TD
#define MAPP_TRANSFORMS_FUSIONPASSES_TD

include "mlir/Pass/PassBase.td"

def MappDecomposeNorms : Pass<"mapp-decompose-norms", "::mlir::ModuleOp"> {
  let summary = "Write rms_norm and layer_norm with the tensor algebra";
  let description = [{
    Before --mapp-autodiff: every mapp.rms_norm and mapp.layer_norm becomes
    the ops the exporter writes for a norm it does not recognize (x², its
    row sum, the rows' mean, eps and rsqrt, x·r·(gamma + offset); the
    LayerNorm's two row sums), so autodiff differentiates them and
    --mapp-fuse makes each norm, forward and backward, one generated row
    program in place of the runtime's hand-written norm kernels
    (docs/fusion.md, "Norms from the algebra").
  }];
}

def MappFuse : Pass<"mapp-fuse", "::mlir::ModuleOp"> {
  let summary = "Group elementwise chains into mapp.fused ops (one pass over memory each)";
  let description = [{
    Runs on the training graph (after --mapp-autodiff and the passes that
    follow it, before --mapp-plan-memory): maximal chains of elementwise ops
    of one iteration domain (the tensor algebra, add, mul, scale, gelu,
    silu, softcap and their gradients; mapp.broadcast of an outside value
    as a broadcast load), optionally ended by a reduce_sum, become one
    mapp.fused op whose program the backends evaluate without intermediate
    tensors. A value read outside its group (by a GEMM, a collective, a
    probe, a perturbation, another group) is materialized, never recomputed;
    open sibling groups loading the same value merge, and an elementwise op
    after the GEMM that closed a group joins it when it can run before that
    GEMM; recomputed ops (--mapp-recompute) never share a group with the
    forward's ops. An op a GEMM's epilogue takes on the GPU (a linear's
    tanh GELU or residual add, a dgrad's gelu_grad, a norm gradient's
    residual add, a weight gradient's bias sum) stays out of regions unless
    `keep-epilogues=false`. docs/fusion.md.
  }];
  let options = [
    Option<"keepEpilogues", "keep-epilogues", "bool", "true",
           "Leave ops the CUDA backend runs as GEMM epilogues unfused">,
  ];
}

def MappFuseReport : Pass<"mapp-fuse-report", "::mlir::ModuleOp"> {
  let summary = "Per mapp.fused region: its ops and the bytes and launches fusion saves";
  let description = [{
    After --mapp-fuse: one remark per region (its name, its statements, the
    iteration domain; the bytes the unfused ops moved and the kernels they
    launched, against the region's one pass over its inputs and results),
    then a remark per function and one for the module. The unfused count
    is every statement a kernel reading its operands (a statement's value
    at its size in the region, an input at its own size) and writing its
    result, in the region's result element type; a mapp.broadcast the
    region absorbed is not counted, so the saving is a lower bound.
    With `profile=FILE` (a `mapp-run --calibrate` profile) each remark also
    gives the time saved from the profile's memory bandwidth and per-op
    overhead. docs/fusion.md.
  }];
  let options = [
    Option<"profile", "profile", "std::string", /*default=*/"\"\"",
           "a mapp-run --calibrate profile: the time saved from its mem_gbps and op_overhead_us">,
  ];
}

#endif // MAPP_TRANSFORMS_FUSIONPASSES_TD
