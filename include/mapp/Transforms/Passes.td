#ifndef MAPP_TRANSFORMS_PASSES_TD
#define MAPP_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

//===----------------------------------------------------------------------===//
// Train
//===----------------------------------------------------------------------===//

def MappAutodiff : Pass<"mapp-autodiff", "::mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation of the forward graph";
  let description = [{
    Differentiates `func.func @forward(tokens, targets) -> loss` through the
    gradient interface and splits the result into two functions:

    * `@train_forward(tokens, targets) -> (loss, saved...)` — the forward,
      returning every activation the backward needs (the saved activations
      are explicit in the signature);
    * `@train_backward(saved...)` — the backward, seeded with
      d(loss) = `loss-scale`, ending in one `mapp.grad_accumulate` per
      parameter (fan-out and tied weights are summed first).

    Parameter reads and constants are re-materialized in the backward rather
    than saved. Ops producing weight gradients carry `mapp.wgrad` so the
    backward can later be split into input- and weight-gradient parts.
    An op on the differentiated path without a gradient rule is an error
    naming that op.
  }];
  let options = [
    Option<"lossScale", "loss-scale", "double", "1.0",
           "Gradient seed d(loss); 1/num_microbatches averages microbatches">,
    Option<"entry", "entry", "std::string", "\"forward\"",
           "Name of the forward function to differentiate">,
  ];
}

def MappOptimizer : Pass<"mapp-optimizer", "::mlir::ModuleOp"> {
  let summary = "Optimizer step over every parameter's accumulated gradient";
  let description = [{
    Adds `func.func @optimizer_step()` that reads each parameter's gradient
    (`mapp.grad_ref`), optionally computes the global gradient norm for
    clipping (`max-grad-norm` > 0), and applies AdamW (decoupled weight
    decay) or SGD with momentum, with a constant or warmup+cosine learning
    rate schedule. Runs once per step, after every microbatch's backward.
  }];
  let options = [
    Option<"optimizer", "optimizer", "std::string", "\"adamw\"",
           "adamw | sgd">,
    Option<"lr", "lr", "double", "3.0e-4", "Peak learning rate">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", "0.999", "AdamW beta2">,
    Option<"eps", "eps", "double", "1.0e-8", "AdamW epsilon">,
    Option<"weightDecay", "weight-decay", "double", "0.01",
           "Decoupled (AdamW) or L2 (SGD) weight decay">,
    Option<"skipDecay1d", "skip-decay-1d", "bool", "false",
           "No weight decay on 1-d parameters (biases, norm gains), as Megatron">,
    Option<"momentum", "momentum", "double", "0.0", "SGD momentum">,
    Option<"maxGradNorm", "max-grad-norm", "double", "0.0",
           "Global-norm gradient clipping threshold (0 = off)">,
    Option<"schedule", "lr-schedule", "std::string", "\"constant\"",
           "constant | cosine (linear warmup, cosine decay to min-lr)">,
    Option<"warmup", "warmup", "int64_t", "0", "Warmup steps">,
    Option<"totalSteps", "total-steps", "int64_t", "0",
           "Steps of the cosine schedule">,
    Option<"minLr", "min-lr", "double", "0.0", "Final learning rate (cosine)">,
  ];
}

//===----------------------------------------------------------------------===//
// MegaScan
//===----------------------------------------------------------------------===//

def MappInsertTrace : Pass<"mapp-insert-trace", "::mlir::ModuleOp"> {
  let summary = "Trace events around compute, communication and optimizer work";
  let description = [{
    Brackets work in every plan block with `mapp.trace_begin` /
    `mapp.trace_end`:

    * `granularity=op`: every instruction;
    * `granularity=layer`: each run of ops of one transformer layer (from
      `mapp.name` = "layers.N...." or `mapp.layer`), and everything else by
      its module name;
    * `granularity=stage`: one region per block.

    Communication ops (collectives, send, recv) always get a region of their
    own, with bytes, peer and group, because MegaScan aligns clocks and finds
    slow links from them; optimizer updates are category "optimizer".
    `every=K window=W` records W consecutive steps out of every K (K = 0:
    every step); the runtime reads it from the plan.
  }];
  let options = [
    Option<"granularity", "granularity", "std::string", "\"layer\"",
           "op | layer | stage">,
    Option<"every", "every", "int64_t", "0",
           "Sampling period in steps (0 = trace every step)">,
    Option<"window", "window", "int64_t", "1",
           "Consecutive steps traced per period">,
  ];
}

//===----------------------------------------------------------------------===//
// Scope (MegaScope)
//===----------------------------------------------------------------------===//

def MappInsertProbes : Pass<"mapp-insert-probes", "::mlir::ModuleOp"> {
  let summary = "Observation probes and switchable perturbations from a spec";
  let description = [{
    Reads a JSON spec (docs/megascope.md) naming values by their `mapp.name`
    (globs, module paths such as `layers.0.attn` for a module's output,
    `logits`, `layers.N.resid` for the residual stream after layer N,
    `layers.N.attn.probs` for attention probabilities, `grad:<name>` for the
    gradient of a value or a parameter) and inserts `mapp.probe` ops with
    their reductions, token selection and sampling period, and
    `mapp.perturb` ops on op outputs (compute), layer outputs (system) or
    parameter reads (storage), each behind a run-time switch. A name that
    matches nothing is an error listing the nearest names. Run after
    autodiff so gradients can be observed and the step's math is unchanged
    by probes.
  }];
  let options = [
    Option<"spec", "spec", "std::string", "\"\"",
           "Path of the probes/perturbations spec (JSON)">,
  ];
}

//===----------------------------------------------------------------------===//
// Runtime
//===----------------------------------------------------------------------===//

def MappPlanMemory : Pass<"mapp-plan-memory", "::mlir::ModuleOp"> {
  let summary = "Liveness, buffer reuse and the peak-memory report per rank";
  let description = [{
    Plans every pipeline stage's memory: activations live in one arena per
    in-flight microbatch (slots from the schedule table), placed greedily by
    size so values whose live ranges do not overlap share bytes; parameters,
    gradients and optimizer state live in a persistent pool. Emits a remark
    per stage (peak = persistent + slots × arena, and the arena without
    reuse) and records `mapp.memory` on the module. The plan writer uses the
    same analysis, so the report is what the runtime allocates.
  }];
}

def MappCostReport : Pass<"mapp-cost-report", "::mlir::ModuleOp"> {
  let summary = "FLOPs and bytes of every plan block, in total and per layer";
  let description = [{
    Sums the cost interface over each plan block (forward, backward,
    optimizer) and over each transformer layer (from `mapp.name`, which
    autodiff carries onto gradient ops as "<name>.grad"), and reports them as
    remarks with the backward/forward FLOP ratio — about 2 for matmul-bound
    layers (two products per forward product), a little more with attention
    recomputing its probabilities in the backward.
  }];
}

def MappLowerToPlan : Pass<"mapp-lower-to-plan", "::mlir::ModuleOp"> {
  let summary = "Check the module lowers to per-rank plan programs";
  let description = [{
    Builds the per-rank instruction streams (kernel, operand buffers,
    attributes), parameters by name and schedule tables exactly as
    `mapp-translate --mapp-to-plan` serializes them, reporting anything that
    cannot be lowered as a located error, and records a `mapp.plan` summary
    (world size, instructions per rank) on the module.
  }];
}

#endif // MAPP_TRANSFORMS_PASSES_TD
