//===- MappCommOps.td - comm, structure, trace ops --------*- tablegen -*-===//
//
// The ops that move tensors between ranks (collectives, point to point,
// the tensor-parallel copies, gradient sync), those that structure a
// program (stages, subgraphs, the pipeline schedule) and MegaScan's trace
// markers. Included by MappOps.td in place, after the compute ops.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_COMM_OPS_TD
#define MAPP_COMM_OPS_TD

//===----------------------------------------------------------------------===//
// Communication
//===----------------------------------------------------------------------===//

class Mapp_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : Mapp_Op<mnemonic, !listconcat(traits, [
        MemoryEffects<[MemRead, MemWrite]>,
        DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>])> {
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The parallel group ("tp", "dp", "pp", "ep") or "" when explicit ranks.
    ::llvm::StringRef getGroupName() {
      return getGroup() ? *getGroup() : ::llvm::StringRef();
    }
  }];
}

def Mapp_AllReduceOp : Mapp_CollectiveOp<"all_reduce", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let summary = "reduce over a group, every member gets the result";
  let description = [{
    `group` names a parallel group of the rank's coordinates ("tp", "dp",
    "pp", "ep", or "edp": the dp ranks holding the same experts under
    expert parallelism); alternatively `ranks` lists the members explicitly.
  }];
  let arguments = (ins Mapp_FloatTensor:$x, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks,
                       DefaultValuedStrAttr<StrAttr, "sum">:$reduction);
  let results = (outs Mapp_FloatTensor:$result);
}

def Mapp_AllGatherOp : Mapp_CollectiveOp<"all_gather", [
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let summary = "concatenate every member's tensor along dim";
  let arguments = (ins Mapp_FloatTensor:$x, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks, I64Attr:$dim);
  let results = (outs Mapp_FloatTensor:$result);
}

def Mapp_ReduceScatterOp : Mapp_CollectiveOp<"reduce_scatter", [
    DeclareOpInterfaceMethods<Mapp_GradientOpInterface>]> {
  let summary = "sum over the group, each member keeps its slice along dim";
  let arguments = (ins Mapp_FloatTensor:$x, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks, I64Attr:$dim);
  let results = (outs Mapp_FloatTensor:$result);
}

def Mapp_AllToAllOp : Mapp_CollectiveOp<"all_to_all"> {
  let summary = "split along split_dim, exchange, concatenate along concat_dim";
  let arguments = (ins Mapp_FloatTensor:$x, OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks,
                       I64Attr:$split_dim, I64Attr:$concat_dim);
  let results = (outs Mapp_FloatTensor:$result);
}

def Mapp_SendOp : Mapp_Op<"send", [MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let summary = "send a tensor to a peer rank";
  let arguments = (ins Mapp_FloatTensor:$x, I64Attr:$peer, I64Attr:$tag);
  let assemblyFormat = "$x `to` $peer `tag` $tag attr-dict `:` type($x)";
  let hasVerifier = 1;
}

def Mapp_RecvOp : Mapp_Op<"recv", [MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let summary = "receive a tensor from a peer rank";
  let arguments = (ins I64Attr:$peer, I64Attr:$tag);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "`from` $peer `tag` $tag attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mapp_CopyToGroupOp : Mapp_DiffOp<"copy_to_group", [SameOperandsAndResultType]> {
  let summary = "identity forward, all_reduce(sum) of the gradient over group";
  let description = [{
    Megatron's `f` operator: marks where a value replicated over `group`
    enters a region computed in shards (a column-parallel linear), so that
    autodiff sums the partial input gradients of the shards. The forward is
    the identity (lowered to no instruction or a copy).
  }];
  let arguments = (ins Mapp_FloatTensor:$x, StrAttr:$group);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

def Mapp_ScatterToGroupOp : Mapp_DiffOp<"scatter_to_group"> {
  let summary = "keep this rank's slice along dim (gradient: all_gather)";
  let description = [{
    Megatron's scatter into the sequence-parallel region: `x` is replicated
    over `group`; rank r keeps slice r of `size/group-size` along `dim`. The
    gradient all-gathers along `dim`.
  }];
  let arguments = (ins Mapp_FloatTensor:$x, StrAttr:$group, I64Attr:$dim);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mapp_GradSyncOp : Mapp_Op<"grad_sync", [MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "bucketed collective over accumulated gradient buffers";
  let description = [{
    Marks a gradient bucket: once the `grad_accumulate` of every listed
    parameter before it has run on the step's LAST microbatch, the
    parameters' gradient buffers are flattened in list order into one buffer
    and reduced over `group` (`ranks`, pipeline stages, instead of a group:
    the replicas of a parameter tied across stages). `mode` "all_reduce":
    every rank gets the reduced buffer; "reduce_scatter" (ZeRO-1): rank r
    only needs elements [r·n/g, (r+1)·n/g) of the flat bucket. `reduction`
    is "avg" (data parallel) or "sum". On earlier microbatches the op does
    nothing. See docs/plan-lowering.md.
  }];
  let arguments = (ins TypedArrayAttrBase<FlatSymbolRefAttr, "parameters">:$params,
                       OptionalAttr<StrAttr>:$group,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks,
                       DefaultValuedStrAttr<StrAttr, "all_reduce">:$mode,
                       DefaultValuedStrAttr<StrAttr, "avg">:$reduction,
                       I64Attr:$bucket);
  let assemblyFormat = "$params attr-dict";
  let hasVerifier = 1;
}

def Mapp_ParamGatherOp : Mapp_Op<"param_gather", [MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "all-gather the updated shards of a ZeRO-1 bucket's parameters";
  let description = [{
    After the optimizer updated this rank's slice [r·n/g, (r+1)·n/g) of the
    flattened bucket (the update ops carry `mapp.zero_shard`), every member
    of `group` receives the whole updated bucket.
  }];
  let arguments = (ins TypedArrayAttrBase<FlatSymbolRefAttr, "parameters">:$params,
                       StrAttr:$group, I64Attr:$bucket);
  let assemblyFormat = "$params attr-dict";
}

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Mapp_YieldOp : Mapp_Op<"yield", [Pure, Terminator, ReturnLike,
    ParentOneOf<["StageOp"]>]> {
  let summary = "values a stage region hands to its parent";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, {}); }]>];
}

def Mapp_StageOp : Mapp_Op<"stage", [SingleBlockImplicitTerminator<"YieldOp">,
    RecursiveMemoryEffects]> {
  let summary = "the ops of one pipeline stage and virtual chunk";
  let description = [{
    A region holding the ops that run on pipeline stage `stage` as virtual
    chunk `chunk`. Values leave the region through `mapp.yield`; values that
    cross stages travel by explicit send/recv once the pipeline is lowered.
  }];
  let arguments = (ins I64Attr:$stage, DefaultValuedAttr<I64Attr, "0">:$chunk);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$stage `chunk` $chunk attr-dict-with-keyword (`:` type($results)^)? $body";
  let hasVerifier = 1;
}

def Mapp_SubgraphOp : Mapp_Op<"subgraph", [Symbol, IsolatedFromAbove,
    NoTerminator, SingleBlock, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a placed forward or backward subgraph (MegaFBD)";
  let description = [{
    The forward or backward of one stage as a separately placed program:
    `phase` is "forward" or "backward"; `placement` gives its virtual rank,
    device and its own parallel degrees. All traffic in and out is explicit
    send/recv, so the region is isolated from above.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$phase,
                       I64Attr:$stage, Mapp_PlacementAttr:$placement);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name $phase `stage` $stage `at` $placement attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Mapp_ScheduleOp : Mapp_Op<"schedule", [HasParent<"::mlir::ModuleOp">]> {
  let summary = "per-rank pipeline task tables";
  let description = [{
    `tables[r]` is the ordered list of tasks pipeline rank r runs in one
    step. Each (kind, chunk, microbatch) appears exactly once per rank for
    forward and once for backward (or once each for backward-input and
    backward-weight when the backward is split).
  }];
  let arguments = (ins StrAttr:$kind, I64Attr:$microbatches, I64Attr:$chunks,
                       TypedArrayAttrBase<ArrayAttr, "per-rank task lists">:$tables);
  let assemblyFormat = "$kind attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// MegaScan
//===----------------------------------------------------------------------===//

def Mapp_TraceBeginOp : Mapp_Op<"trace_begin", [MemoryEffects<[MemWrite]>]> {
  let summary = "start of a traced region (MegaScan)";
  let description = [{
    Records the start time of region `id` on the rank's trace clock (a
    monotonic clock on CPU, a pooled CUDA event on GPU). `category` is
    compute, comm, memcpy, data or optimizer; `layer` and `chunk` place the
    region in the model; `bytes`, `peer` and `group` describe communication.
    Step and microbatch are filled in at run time.
  }];
  let arguments = (ins I64Attr:$id, StrAttr:$name, StrAttr:$category,
                       DefaultValuedAttr<I64Attr, "-1">:$layer,
                       DefaultValuedAttr<I64Attr, "0">:$bytes,
                       DefaultValuedAttr<I64Attr, "-1">:$peer,
                       DefaultValuedStrAttr<StrAttr, "">:$group);
  let assemblyFormat = "$id $name $category attr-dict";
  let hasVerifier = 1;
}

def Mapp_TraceEndOp : Mapp_Op<"trace_end", [MemoryEffects<[MemWrite]>]> {
  let summary = "end of the traced region with the same id";
  let arguments = (ins I64Attr:$id);
  let assemblyFormat = "$id attr-dict";
}

#endif // MAPP_COMM_OPS_TD
