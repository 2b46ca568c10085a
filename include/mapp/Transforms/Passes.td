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

    The gradient of a value read through disjoint slices (the fused qkv
    projection's q, k and v) is summed as one `mapp.concat` of the slices'
    gradients instead of adds of full-size `mapp.slice_grad`s (`mapp.add`'s
    canonicalization, applied to the backward; exact).
  }];
  let options = [
    Option<"concatSliceGrads", "concat-slice-grads", "bool", "true",
           "Sum gradients of disjoint slices as one concat (false keeps the "
           "slice_grad + add chain, for A/B measurements)">,
    Option<"lossScale", "loss-scale", "double", "1.0",
           "Gradient seed d(loss); 1/num_microbatches averages microbatches">,
    Option<"entry", "entry", "std::string", "\"forward\"",
           "Name of the forward function to differentiate">,
  ];
}

def MappSplitBackward : Pass<"mapp-split-backward", "::mlir::ModuleOp"> {
  let summary = "Split each backward into input-gradient (Bi) and weight-gradient (W) functions";
  let description = [{
    For zero-bubble schedules (`zb-h1`): every backward function
    (`mapp.phase = "backward"`) keeps what the previous pipeline stage
    waits for — the input gradient, its sends and collectives — and gets
    `mapp.split = "input"`; a new `@<name>_weight` (`mapp.split =
    "weight"`) takes the parameter gradients: every `mapp.grad_accumulate`
    and `mapp.grad_sync` and the pure ops only they use. The input part
    returns the values the weight part reads (its arguments), so the memory
    plan keeps them alive from Bi to W. Run it after --mapp-data-parallel
    (so the gradient syncs move with the accumulations) and before
    --mapp-pipeline-schedule=schedule=zb-h1; --mapp-train-pipeline does so
    for `schedule=zb-h1`.
  }];
  let dependentDialects = ["::mapp::MappDialect", "::mlir::func::FuncDialect"];
}

def MappRecompute : Pass<"mapp-recompute", "::mlir::ModuleOp"> {
  let summary = "Activation recomputation: fewer saved activations, re-materialized in the backward";
  let description = [{
    Runs after --mapp-autodiff, on every forward/backward pair (the single
    step's @train_forward/@train_backward, or each pipeline stage's
    @forward_s<S>_c<C>/@backward_s<S>_c<C>). A saved activation that the
    policy drops is no longer returned by the forward; the backward
    recomputes it, right before its first use, by cloning the forward ops
    that produced it from values still saved (the boundary values, which
    become saved when they were not). Recomputed ops are the forward's own
    ops with the same operands, so results are bit-identical.

    * `policy=selective` — the attention core (Megatron's selective
      recompute): `mapp.attention` (and, in an unfused attention, its
      softmax, dropout, matmul, scale, reshape and transpose ops) in the
      layer's `attn` scope; q, k and v stay saved.
    * `policy=full` — whole layers: every pure op of the layer; each layer
      keeps only its input (the previous layer's output) and the outputs of
      its collectives (all_reduce, all_gather, ...), so the backward
      recomputes the layer without communicating.
    * `policy=activations` — the outputs of the activation functions
      (`mapp.gelu`, `mapp.silu`): the MLP's widest saved tensor, recomputed
      by one elementwise pass from the pre-activation that the activation's
      gradient keeps saved anyway (PyTorch's min-cut partitioner makes the
      same trade). A GPT saves 4·h per token and layer less.

    A layer is the `<scope>.<N>.` prefix of the ops' `mapp.name`
    (`layers.N.` for the GPT and LLaMA front ends). `layers=all`, or a list
    of indices and ranges (`0,1`, `0-3,6`). Ops with side effects (send,
    recv, collectives, probes, trace marks) are never recomputed. The
    memory plan (--mapp-plan-memory) shows the saving: the stash per
    microbatch and the arena shrink. Run it before --mapp-optimizer and
    the parallel passes that follow autodiff; --mapp-train-pipeline does so
    for `recompute=selective|full` (`recompute-layers=`). Records
    `mapp.recompute = {policy, layers, dropped, added}` on the module.
  }];
  let options = [
    Option<"policy", "policy", "std::string", "\"none\"",
           "selective | full | activations | none">,
    Option<"layers", "layers", "std::string", "\"all\"",
           "all, or indices and ranges: 0,1 | 0-3,6">,
  ];
  let dependentDialects = ["::mapp::MappDialect", "::mlir::func::FuncDialect"];
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

def MappMixedPrecision : Pass<"mapp-mixed-precision", "::mlir::ModuleOp"> {
  let summary = "Precision policy and loss scaling (static or dynamic) as IR";
  let description = [{
    Runs after --mapp-autodiff and --mapp-optimizer. Records the policy as
    the module attribute `mapp.precision` ({compute, master, loss_scale})
    and, with loss scaling, marks the loss-gradient seed (the `mapp.fill`
    autodiff tags `mapp.loss_seed`) with `loss_scale = "dynamic"|"static"`
    (the runtime multiplies the seed by the current scale) and every
    `mapp.adamw` / `mapp.sgd` with `loss_scale` and `loss_scale_init`,
    `loss_scale_limit` (the compute type's largest value: fp16 65504, bf16
    and f32 FLT_MAX) and, dynamic, `loss_scale_growth`,
    `loss_scale_backoff`, `loss_scale_growth_interval`, `loss_scale_min`.
    The update divides the gradients and its clip norm by the scale. A
    dynamic step whose scaled global gradient norm is non-finite or above
    the limit is skipped (parameters and optimizer state untouched) and the
    scale multiplied by the backoff factor; after growth-interval finite
    steps it is multiplied by the growth factor. Master weights and
    optimizer state stay f32 (master=f32 only). compute=bf16|fp16 is
    recorded; the activation storage type comes from --mapp-plan-memory,
    and the CPU backend computes in fp32 (fp16's range is applied through
    the overflow limit).

    compute=fp8 (Transformer Engine's DelayedScaling; docs/checkpoints.md,
    "FP8"): every `mapp.linear` inside a transformer block (`mapp.name`
    `layers.N.*`: qkv, attention out, fc1, fc2 / gate, up, down; not the
    embeddings, the LM head or the attention core) becomes `mapp.fp8_linear`
    and its input-gradient and weight-gradient `mapp.matmul`s (`<name>.grad`)
    `mapp.fp8_matmul`. Forward operands are E4M3, the output gradient E5M2
    (fp8-format=hybrid; e4m3: E4M3 everywhere). Each layer gets a
    parameter `<name>.fp8_meta` (f32[3 * (1 + fp8-history)], init
    "fp8_meta": scale 1, empty history) read by its GEMMs, which
    max-accumulate the step's amaxes into it, and an `mapp.fp8_update` in
    @optimizer_step that computes the next step's scales (fp8_max /
    max(history) / 2^fp8-margin) and rolls the history. The meta is a
    parameter without gradient use or optimizer update, so checkpoints save
    and restore it with the weights. The rest of the step is as for bf16;
    loss scaling must be none (the per-tensor scales do its job).
  }];
  let options = [
    Option<"compute", "compute", "std::string", "\"f32\"", "f32 | bf16 | fp16 | fp8">,
    Option<"master", "master", "std::string", "\"f32\"", "f32">,
    Option<"lossScale", "loss-scale", "std::string", "\"none\"",
           "dynamic | static:S | none">,
    Option<"initialScale", "initial-scale", "double", "65536.0",
           "Dynamic: the first step's scale">,
    Option<"growthInterval", "growth-interval", "int64_t", "1000",
           "Dynamic: finite steps before the scale grows">,
    Option<"growthFactor", "growth-factor", "double", "2.0",
           "Dynamic: scale multiplier after growth-interval finite steps">,
    Option<"backoffFactor", "backoff-factor", "double", "0.5",
           "Dynamic: scale multiplier after an overflow">,
    Option<"minScale", "min-scale", "double", "1.0",
           "Dynamic: the scale never goes below this">,
    Option<"fp8Format", "fp8-format", "std::string", "\"hybrid\"",
           "fp8: hybrid (E4M3 forward, E5M2 output gradients) | e4m3">,
    Option<"fp8History", "fp8-history", "int64_t", "16",
           "fp8: amax history length (steps), >= 1">,
    Option<"fp8Margin", "fp8-margin", "int64_t", "0",
           "fp8: scale = fp8_max / amax / 2^margin, margin >= 0">,
  ];
}

//===----------------------------------------------------------------------===//
// Parallel (Megatron)
//===----------------------------------------------------------------------===//

def MappTensorParallel : Pass<"mapp-tensor-parallel", "::mlir::ModuleOp"> {
  let summary = "Megatron tensor parallelism (and sequence parallelism) on @forward";
  let description = [{
    Runs on the forward graph before autodiff. Recognizes attention (fused
    qkv or separate q/k/v linears, `mapp.attention`, output projection),
    MLPs (fc1 → gelu → fc2, silu(gate)·up → down), the LM head feeding
    `mapp.cross_entropy` and `mapp.embedding` tables, and shards them over
    the tp group as Megatron does:

    * column-parallel (qkv, fc1, gate, up, LM head): weight [N/tp, K],
      `shard_dim = 0`, bias sharded alike, input through
      `mapp.copy_to_group` (f: all-reduce of its gradient);
    * the fused qkv weight is sharded per block (`shard_blocks = 3`): rank
      r holds heads [r·h/tp, (r+1)·h/tp) of each of q, k and v;
    * attention runs heads/tp heads; grouped-query k/v linears are
      column-parallel when tp divides the key/value heads, and replicated
      when tp is a multiple of them (weights whole on every rank, each rank
      cutting its head's rows with reshape/concat/scatter_to_group, so the
      gradient is all-gathered and summed over the replicas);
    * row-parallel (attention proj, fc2, down): weight [N, K/tp],
      `shard_dim = 1`, output all-reduced over tp (g: identity gradient),
      bias added after the reduction;
    * vocab-parallel embedding (`group = "tp"` on `mapp.embedding`: zero
      rows outside the rank's vocabulary slice, then all-reduce) and
      vocab-parallel cross-entropy (`reduce_max` + all_reduce max,
      `vocab_ce_partials` + all_reduce sum, `ce_from_partials`).

    With `sequence-parallel`, the all-reduces become reduce-scatters along
    the sequence, norms/residual adds/dropout run on [B, T/tp, H], and each
    column-parallel input is all-gathered along the sequence.

    Sharded parameters get the shard type and `shard_dim`, `shard_group =
    "tp"` (and `shard_blocks`) so the runtime slices checkpoints. tp not
    dividing heads, hidden, ffn, vocab (or seq with sequence parallel) is
    an error naming both numbers.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"tp", "tp", "int64_t", "1", "Tensor-parallel degree">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "Shard the sequence between the tensor-parallel blocks">,
  ];
}

def MappExpertParallel : Pass<"mapp-expert-parallel", "::mlir::ModuleOp"> {
  let summary = "Megatron expert parallelism: experts split over the ep group, variable all_to_all dispatch/combine";
  let description = [{
    Runs on the forward graph after `--mapp-tensor-parallel` and before
    pipeline partitioning and autodiff. Each MoE layer is recognized by its
    `mapp.moe_permute`: the permuted rows [R, H] flow through
    `moe_grouped_matmul`s (with the layer's `moe_assign` counts) and row-wise
    ops (gelu, silu, mul, add, scale, slice/concat past dim 0) into one
    `moe_unpermute`. The pass rewrites that expert computation as Megatron's
    all-to-all token dispatcher does:

    * `mapp.ep_dispatch` after the permute sends each expert's rows to the
      member of the expert-parallel group that owns it (member j of `ep`
      owns experts [j·E/ep, (j+1)·E/ep)); it yields [C, H] rows and the
      rows per local expert;
    * the grouped matmuls run on this rank's experts only: weights
      [E/ep, K, N], sharded along dim 0 over `shard_group = "ep"` (rank i of
      the group holds experts [i·E/ep, (i+1)·E/ep) of the full tensor, so
      initialization, `--weights` and checkpoints slice the one-rank
      tensors), with the local counts;
    * `mapp.ep_combine` before the unpermute returns every row to the rank
      and row it came from; autodiff makes each the other's adjoint.

    C, the rows a rank's experts may receive, is the dropless worst case
    ep·R (every member routes all its rows here), or E·capacity when
    `moe_assign` has a capacity (at most capacity rows per expert from each
    member), whichever is smaller. The router, aux and z losses stay on the
    rank's own tokens. The module gets `mapp.parallel` ep; the ep group is
    ep consecutive dp ranks with the same tp and pp coordinates (EP inside
    DP: ep must divide dp), and `--mapp-data-parallel` reduces the expert
    gradients over the expert-data-parallel group "edp" (the dp/ep ranks
    with the same ep index) scaled as Megatron does, dense gradients over
    dp.

    Errors (located): ep < 1; ep > 1 on a model without an MoE layer;
    experts not divisible by ep; ep not dividing `dp` (when given; the
    data-parallel pass checks it again); expert computations the pass does
    not recognize; expert weights used outside them. ep = 1 leaves the
    module as it is.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"ep", "ep", "int64_t", "1", "Expert-parallel degree (divides dp and num_moe_experts)">,
    Option<"dp", "dp", "int64_t", "0",
           "Data-parallel degree to check ep against (0: checked by --mapp-data-parallel)">,
  ];
}

def MappContextParallel : Pass<"mapp-context-parallel", "::mlir::ModuleOp"> {
  let summary = "Context parallelism: the sequence split over the cp group with causal load balancing; ring or all-to-all attention";
  let description = [{
    Runs on the forward graph after `--mapp-tensor-parallel` and before
    pipeline partitioning and autodiff (docs/context-parallel.md). The
    sequence S of every row splits into 2·cp chunks; member r of the cp
    group keeps chunks r and 2·cp−1−r. The pass inserts `mapp.cp_shard`
    (dim 1) after every @forward argument (tokens, targets) and before
    position tables added to the activations (GPT's wpe, dim 0), narrows
    every position-local op's [B, S, ...] results to [B, S/cp, ...], and
    replaces each `mapp.attention` by `mapp.cp_attention` (comm = "ring" or
    "a2a", global positions for the mask and the rotary angles). The loss
    is each rank's mean over its tokens; the data-parallel pass, given
    dp·cp, averages the gradients over dp and cp together. The module gets
    `mapp.parallel` cp; the cp group is cp consecutive dp ranks (inside dp,
    as ep).

    Errors (located): cp < 1; S not divisible by 2·cp; cp not dividing
    `dp` (when given: the data-parallel degree that includes cp); comm not
    ring or a2a; a2a with heads or key/value heads not divisible by cp;
    attention with softcap, sliding_window or dropout; ops that mix
    positions (slice/concat/reshape/transpose across the sequence, a
    sequence-parallel module, dropout); ep > 1.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"cp", "cp", "int64_t", "1", "Context-parallel degree">,
    Option<"comm", "comm", "std::string", "\"ring\"",
           "ring (K/V blocks around the group) | a2a (Ulysses all-to-all)">,
    Option<"dp", "dp", "int64_t", "0",
           "Data-parallel degree including cp, checked against cp (0: unchecked)">,
  ];
}

def MappPipelinePartition : Pass<"mapp-pipeline-partition", "::mlir::ModuleOp"> {
  let summary = "Cut @forward into per-(stage, chunk) functions with send/recv";
  let description = [{
    Runs on the forward graph (after tensor parallelism, before autodiff).
    Layers are the ops reading `layers.N.*` parameters; ops before layer 0
    join the first layer, ops after the last layer join the last. Layers are
    grouped into pp·chunks contiguous virtual stages minimizing the most
    expensive one by the cost interface (FLOPs); a remark reports each
    virtual stage's layers and cost and the per-stage imbalance (max/mean).
    Virtual stage k runs on pipeline stage k mod pp as chunk k / pp.

    Output (docs/plan-lowering.md): `@forward_s<stage>_c<chunk>` with
    `mapp.phase = "forward"`, `mapp.stage`, `mapp.chunk`; arguments it
    reads from @forward keep `mapp.input` ("tokens", "targets"); values
    crossing a cut are received with `mapp.recv` at the start and sent with
    `mapp.send` at the end (peer = pipeline stage, even tags 2i; the
    gradient travels back with tag 2i + 1); the last virtual stage returns
    the loss and has `mapp.loss`. Parameters read on several stages (tied
    embeddings) get `mapp.pp_stages`. The module gets `mapp.pp` and
    `mapp.chunks`. With pp·chunks = 1 only those attributes are set.
    More virtual stages than layers is an error.

    Uneven stages (docs/elastic.md, "Re-partitioning"): `stage-layers=7,9,8,8`
    gives each virtual stage's layer count (pp·chunks entries, in virtual
    stage order, each ≥ 1, summing to the model's layers); `stage-weights=
    1,2,1,1` gives each pipeline stage's time per FLOP relative to the others
    (pp entries > 0, e.g. measured step time ÷ FLOPs: a stage twice as slow
    has weight 2) and the partition minimizes the most expensive weighted
    virtual stage. Not both.
  }];
  let dependentDialects = ["::mapp::MappDialect", "::mlir::func::FuncDialect"];
  let options = [
    Option<"pp", "pp", "int64_t", "1", "Pipeline stages">,
    Option<"chunks", "chunks", "int64_t", "1",
           "Virtual chunks per stage (interleaved schedules)">,
    ListOption<"stageLayers", "stage-layers", "int64_t",
               "Layers of each virtual stage (pp*chunks entries)">,
    ListOption<"stageWeights", "stage-weights", "double",
               "Relative time per FLOP of each pipeline stage (pp entries)">,
  ];
}

def MappDataParallel : Pass<"mapp-data-parallel", "::mlir::ModuleOp"> {
  let summary = "Bucketed data-parallel gradient sync overlapped with backward; ZeRO-1";
  let description = [{
    Runs after autodiff (after the optimizer when `zero1` is set). In every
    backward function (`mapp.phase = "backward"`) each `grad_accumulate`
    moves right after its gradient's definition, and once `bucket-mb` MiB
    of gradients are final a `mapp.grad_sync` (group "dp", reduction "avg")
    closes the bucket, so its all-reduce overlaps the rest of the backward.
    The runtime runs a grad_sync only on the step's last microbatch
    (docs/plan-lowering.md). Parameters accumulated by several chunks of a
    stage are synchronized at the end of chunk 0's backward; parameters
    tied across pipeline stages (`mapp.pp_stages`) get a grad_sync summing
    over those stages there too.

    With `zero1`, buckets reduce-scatter instead (each dp rank keeps the
    average of its 1/dp slice of the flattened bucket), the updates in
    @optimizer_step (and the global norm) carry `mapp.zero_shard = "dp"`,
    and one `mapp.param_gather` per bucket all-gathers the updated
    parameters. The module gets `mapp.dp`.

    After `--mapp-expert-parallel` (mapp.parallel ep, which must divide
    dp), expert weights (`shard_group = "ep"`) go in buckets of their own
    over the expert-data-parallel group "edp" (the dp/ep ranks holding the
    same experts; none when ep = dp), and each microbatch's expert gradient
    is scaled by 1/ep before it is accumulated: Megatron sums expert
    gradients over edp and scales them by 1/dp, which an average over edp
    times 1/ep is. zero1 with ep > 1 is an error.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"dp", "dp", "int64_t", "1", "Data-parallel degree">,
    Option<"bucketMb", "bucket-mb", "double", "25.0",
           "Bucket size in MiB of fp32 gradients (a bucket closes once it holds at least this much)">,
    Option<"zero1", "zero1", "bool", "false",
           "Shard optimizer state over dp (ZeRO stage 1)">,
  ];
}

def MappPipelineSchedule : Pass<"mapp-pipeline-schedule", "::mlir::ModuleOp"> {
  let summary = "Pipeline task tables (gpipe, 1f1b, interleaved, dfc, bfc, zb-h1, adaptive) as mapp.schedule";
  let description = [{
    Emits `mapp.schedule` ops with a task table per pipeline rank
    (replacing any existing ones). With p stages, v chunks per stage
    (chunk c on rank r is virtual stage c·p + r) and m microbatches:

    * `gpipe`: every forward, then every backward;
    * `1f1b`: rank r runs min(p − r − 1, m) warm-up forwards, then one
      forward / one backward, then the remaining backwards (p − r
      microbatches in flight on rank r);
    * `interleaved` with `group=N` (Megatron's
      microbatch_group_size_per_vp_stage, default p; p ≤ N ≤ m and
      m % N == 0): forwards walk groups of N microbatches, each group
      through chunk 0 … v − 1, backwards the same order with the chunks
      reversed; rank r warms up with 2(p − r − 1) + (v − 1)·N forwards
      (capped at m·v);
    * `dfc` (depth-first chunks): interleaved with N = p, m % p == 0;
    * `bfc` (breadth-first chunks): interleaved with N = m — every
      microbatch through a chunk before the next chunk (the order of
      PyTorch's ScheduleLoopedBFS, with a 1F1B steady state);
    * `zb-h1` (one chunk): 1F1B with the backward split into input-gradient
      (Bi) and weight-gradient (W) tasks; rank r defers up to r W tasks,
      which fill the cool-down: bubble (p − 1)(F + Bi − W) instead of
      (p − 1)(F + Bi + W). Needs split backward blocks
      (--mapp-split-backward) before the plan is built;
    * `adaptive`: two ops, `dfc` (the static fallback, the plan's task
      table) then `bfc` (same tasks, breadth-first), and the module's
      `mapp.adaptive = {mem_cap_bytes, slow_link_ratio,
      bandwidth_smoothing}`: the runtime runs breadth-first while a link is
      slow and the extra activations fit under the cap, depth-first
      otherwise (plan.fbs AdaptivePolicy).

    With one chunk per stage, interleaved, dfc and bfc give the 1F1B
    order. `pp` and `chunks` default to the module's `mapp.pp` /
    `mapp.chunks` (set by --mapp-pipeline-partition), else 1. An
    infeasible combination (group outside [p, m], a microbatch count the
    schedule cannot take, a bad policy option) is an error naming the
    constraint. The generated tables go through the schedule verifier.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"schedule", "schedule", "std::string", "\"1f1b\"",
           "gpipe | 1f1b | interleaved | dfc | bfc | zb-h1 | adaptive">,
    Option<"microbatches", "microbatches", "int64_t", "1",
           "Microbatches per step">,
    Option<"pp", "pp", "int64_t", "0",
           "Pipeline stages (0: the module's mapp.pp, else 1)">,
    Option<"chunks", "chunks", "int64_t", "0",
           "Virtual chunks per stage (0: the module's mapp.chunks, else 1)">,
    Option<"group", "group", "int64_t", "0",
           "interleaved: microbatches per group N, p <= N <= m (0: p)">,
    Option<"memCap", "mem-cap", "std::string", "\"\"",
           "adaptive: device memory cap in bytes (K/M/G suffixes; empty or 0: the free memory)">,
    Option<"slowLinkRatio", "slow-link-ratio", "double", "1.5",
           "adaptive: a link is slow when its bandwidth is this many times below its best (> 1)">,
    Option<"bandwidthSmoothing", "bandwidth-smoothing", "double", "0.25",
           "adaptive: EMA weight of the newest transfer's bandwidth, in (0, 1]">,
  ];
}

def MappAutoParallel : Pass<"mapp-auto-parallel", "::mlir::ModuleOp"> {
  let summary = "Choose the parallel layout, then compile it as --mapp-train-pipeline";
  let description = [{
    Reads the model from the forward graph (`mapp.model`, the importer's
    config), prices every layout of `world` devices for a step of
    `global-batch` sequences with the cost model that mapp-sim shares
    (lib runtime/src/cost: tp, pp, dp, ep, chunks, micro-batch size and
    count, schedule, recomputation, ZeRO-1, compute precision and
    activation storage), and prints the `top` best as plain lines on
    stderr (predicted step time, tokens/s, peak memory per device, bubble,
    exposed communication, MFU; the rejected layouts by reason). Then it
    compiles the best through --mapp-train-pipeline (with `pipeline`'s
    extra options: optimizer, lr, ...), re-importing the graph when the
    chosen micro-batch size differs, and checks the memory planner's peak
    of every stage against the cap: a layout the planner puts over the cap
    is dropped for the next (the planner, not the formula, decides).
    `search-only` prints the ranking and leaves the module as it was.
    docs/auto-parallel.md.
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"world", "world", "int64_t", "0", "Devices (ranks)">,
    Option<"globalBatch", "global-batch", "int64_t", "0",
           "Sequences per step (micro-batch x microbatches x dp)">,
    Option<"memCapGib", "mem-cap-gib", "double", "0",
           "Memory per device in GiB (0: the device's)">,
    Option<"cluster", "cluster", "std::string", "\"\"",
           "Cluster description (JSON; empty: one node of world CPU ranks)">,
    Option<"profile", "profile", "std::string", "\"\"",
           "Measured profile (mapp-run --calibrate; empty: the device's default)">,
    Option<"top", "top", "int64_t", "5", "Candidates printed">,
    Option<"pipeline", "pipeline", "std::string", "\"\"",
           "Further --mapp-train-pipeline options for the winner, e.g. 'optimizer=sgd lr=0.01'">,
    Option<"searchOnly", "search-only", "bool", "false",
           "Print the ranking, leave the module unchanged">,
    Option<"schedules", "schedules", "std::string", "\"\"",
           "Restrict the space: schedules, comma-separated (empty: all)">,
    Option<"recomputes", "recompute", "std::string", "\"\"",
           "Restrict the space: none,selective,full (empty: all)">,
    Option<"microBatches", "micro-batches", "std::string", "\"\"",
           "Restrict the space: micro-batch sizes (empty: divisors <= 16)">,
    Option<"chunkChoices", "chunks", "std::string", "\"\"",
           "Restrict the space: chunks per stage (empty: 1,2,4)">,
    Option<"zero1", "zero1", "bool", "true", "Consider ZeRO-1">,
    Option<"storages", "activation-storage", "std::string", "\"\"",
           "Restrict the space: f32,bf16 (empty: what the backend stores)">,
    Option<"report", "report", "std::string", "\"\"",
           "Write the top candidates as JSON to this file (bench/autopar)">,
    Option<"claimSamplesPerS", "check-samples-per-s", "double", "0",
           "Check a throughput claim (samples/s on world devices) against the peak">,
  ];
}

def MappVerifySchedule : Pass<"mapp-verify-schedule", "::mlir::ModuleOp"> {
  let summary = "Check and simulate every mapp.schedule; pair sends with recvs";
  let description = [{
    Every rank must run each (chunk, microbatch) forward and backward (or
    backward-input and backward-weight) exactly once, a backward after its
    forward on the same rank, and the tables are simulated with
    non-blocking sends and blocking receives (virtual stage s = chunk·p +
    rank receives F's input from s − 1 and B's output gradient from s + 1):
    a deadlock is an error naming every stuck rank, its task and the peer
    it waits for. In the pipeline stage functions (`mapp.stage`), every
    `mapp.send` must have exactly one `mapp.recv` on its peer stage with
    the same tag and type, and vice versa. With `report`, a remark gives
    the simulated makespan,
    the bubble fraction (idle / total rank time) and per rank the bubble
    fraction (idle / makespan), the number of warm-up forwards and the
    peak of (chunk, microbatch) activations in flight (a forward's
    activations are held until its B, or its W when the backward is
    split), under the cost model's per-chunk F, B, Bi and W durations
    (the options, or with `cost-model` the mean FLOPs of the module's
    forward, backward and split backward functions relative to the
    forward). Every `mapp.schedule` op is checked (an adaptive module has
    two).
  }];
  let dependentDialects = ["::mapp::MappDialect"];
  let options = [
    Option<"report", "report", "bool", "false",
           "Emit a remark with the simulated statistics">,
    Option<"forwardCost", "forward-cost", "double", "1.0",
           "Duration of a forward task (one chunk)">,
    Option<"backwardCost", "backward-cost", "double", "2.0",
           "Duration of a fused backward task">,
    Option<"backwardInputCost", "backward-input-cost", "double", "1.0",
           "Duration of a backward-input (Bi) task">,
    Option<"backwardWeightCost", "backward-weight-cost", "double", "1.0",
           "Duration of a backward-weight (W) task">,
    Option<"costModel", "cost-model", "bool", "false",
           "Take F, B, Bi, W from the IR's cost model (mean FLOPs of the forward / backward / split functions, F = 1) instead of the options">,
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
    Reads a JSON or YAML spec (docs/megascope.md) naming values by their `mapp.name`
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
           "Path of the probes/perturbations spec (JSON, or YAML by .yaml/.yml)">,
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

    `activation-storage=bf16` records `mapp.activation_storage = "bf16"` on
    the module: activations (f32 arena values of rank ≥ 2, apart from
    parameter-gradient contributions) are then planned at 2 bytes an
    element and marked `storage_bf16` in the plan, as the CUDA backend
    stores them — half the arena of an fp32 plan. A backend that stores
    fp32 (the CPU) runs such a plan with the arena doubled.
  }];
  let options = [
    Option<"activationStorage", "activation-storage", "std::string", "\"\"",
           "Storage of activations: f32 or bf16 (empty: the module's "
           "mapp.activation_storage, else f32)">,
  ];
}

include "mapp/Transforms/FusionPasses.td"

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


//===----------------------------------------------------------------------===//
// MegaFBD
//===----------------------------------------------------------------------===//

def MappFbdKeepSource : Pass<"mapp-fbd-keep-source", "::mlir::ModuleOp"> {
  let summary = "Keep a copy of the forward graph for a forward side of another tp";
  let description = [{
    Runs on the forward graph, before --mapp-tensor-parallel. Copies the
    whole module (parameters, @forward, module attributes) into a nested
    `module @fbd_source` that the other passes do not look into, so that
    --mapp-split-fwd-bwd can tensor-parallelize the forward side with its
    own degree (fwd-tp ≠ bwd-tp). --mapp-train-pipeline with fbd=true runs
    it first. Running it twice is an error.
  }];
  let dependentDialects = ["::mapp::MappDialect", "::mlir::func::FuncDialect"];
}

def MappSplitFwdBwd : Pass<"mapp-split-fwd-bwd", "::mlir::ModuleOp"> {
  let summary = "MegaFBD: forward and backward of each stage as separately placed subgraphs";
  let description = [{
    Runs on a training step (after autodiff, the optimizer, data parallelism
    and the schedule; chunks = 1). Each pipeline stage s becomes a forward
    subgraph on its own ranks and a backward subgraph on the module's ranks:

    - `mapp.subgraph @fbd_forward_s<s> "forward" stage s at #mapp.placement<
      rank = first global rank, device, index, tp = fwd-tp, dp, pp>` holds a
      nested module with the stage's forward (its parameters at fwd-tp).
      The forward ranks follow the backward ranks: global rank =
      tp·dp·pp + s·fwd-tp·dp + d·fwd-tp + j.
    - `mapp.subgraph @fbd_backward_s<s> "backward" ...` marks the placement of
      the stage's top-level functions (forward block, backward, optimizer),
      which keep the module's tp (= bwd-tp) on ranks [0, tp·dp·pp).

    `transfer=activations`: the forward side sends the loss and every saved
    activation the backward reads (`fbd_cross` sends, tags 1000 + i), the
    backward side's forward block only receives them. With fwd-tp ≠ bwd-tp
    (one dividing the other) each value is resharded: the forward rank that
    holds a backward rank's piece sends that slice (`fbd_from`/`fbd_to`),
    or the backward rank concatenates several forward pieces (`fbd_src`);
    values TP built differently on the two sides are recomputed from the
    received ones (docs/megafbd.md, "Resharding").
    `transfer=recompute` (MegatronApp's way): the forward side sends only
    the stage input (stage > 0); the backward side re-runs the forward on
    it instead of receiving it from the previous backward stage. With
    fwd-tp ≠ bwd-tp the forward side is built from `module @fbd_source`
    (--mapp-fbd-keep-source) by --mapp-tensor-parallel and
    --mapp-pipeline-partition at fwd-tp; the stage input is replicated over
    tp, so forward rank j sends it to backward ranks j, j + fwd-tp, ...
    The backward side's schedule tables then run each microbatch's forward
    right before its backward (the backwards keep their order), so a
    backward rank holds one microbatch's activations, not the schedule's
    warm-up depth.

    Parameters stay exact: the backward ranks own them and update them;
    after every step's update the runtime copies them to the forward ranks
    (resharded from bwd-tp to fwd-tp), so step k+1's forward uses step k's
    update (docs/megafbd.md). The module gets `mapp.fbd` (the options and
    the rank counts); --mapp-lower-to-plan emits one Program per rank of
    both sides with its Placement.
  }];
  let dependentDialects = ["::mapp::MappDialect", "::mlir::func::FuncDialect"];
  let options = [
    Option<"fwdTp", "fwd-tp", "int64_t", "0",
           "Tensor-parallel degree of the forward side (0: the module's tp)">,
    Option<"bwdTp", "bwd-tp", "int64_t", "0",
           "Tensor-parallel degree of the backward side (0: the module's tp; "
           "must equal it)">,
    Option<"fwdDevice", "fwd-device", "std::string", "\"cpu\"",
           "Device kind of the forward ranks: cpu | cuda">,
    Option<"bwdDevice", "bwd-device", "std::string", "\"cpu\"",
           "Device kind of the backward ranks: cpu | cuda">,
    Option<"fwdIndex", "fwd-index", "int64_t", "0",
           "Device index of the forward ranks">,
    Option<"bwdIndex", "bwd-index", "int64_t", "0",
           "Device index of the backward ranks">,
    Option<"transfer", "transfer", "std::string", "\"recompute\"",
           "activations | recompute">,
  ];
}

#endif // MAPP_TRANSFORMS_PASSES_TD
