#ifndef MAPP_ATTRS_TD
#define MAPP_ATTRS_TD

include "mapp/Dialect/Mapp/IR/MappDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

class Mapp_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Mapp_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Mapp_TaskKind : I32EnumAttr<"TaskKind", "pipeline task kind", [
    I32EnumAttrCase<"Forward", 0, "F">,
    I32EnumAttrCase<"Backward", 1, "B">,
    I32EnumAttrCase<"BackwardInput", 2, "Bi">,
    I32EnumAttrCase<"BackwardWeight", 3, "W">,
  ]> {
  let cppNamespace = "::mapp";
  let genSpecializedAttr = 0;
}

def Mapp_TaskAttr : Mapp_Attr<"Task", "task"> {
  let summary = "one entry of a schedule table: (kind, chunk, microbatch)";
  let parameters = (ins "TaskKind":$kind, "int64_t":$chunk,
                        "int64_t":$microbatch);
  let assemblyFormat = "`<` $kind `,` $chunk `,` $microbatch `>`";
}

def Mapp_PlacementAttr : Mapp_Attr<"Placement", "placement"> {
  let summary = "where a subgraph runs and with which parallel degrees";
  let description = [{
    `virtual_rank` names the subgraph's rank in the logical plan; `device` is
    the physical device kind ("cpu", "gpu") and `index` its index on the
    host; `tp`, `dp` and `pp` are the parallel degrees this subgraph uses,
    which may differ between the forward and the backward of one stage.
  }];
  let parameters = (ins "int64_t":$virtual_rank, "::mlir::StringAttr":$device,
                        "int64_t":$index, "int64_t":$tp, "int64_t":$dp,
                        "int64_t":$pp);
  let assemblyFormat = [{
    `<` `rank` `=` $virtual_rank `,` `device` `=` $device `,` `index` `=` $index
    `,` `tp` `=` $tp `,` `dp` `=` $dp `,` `pp` `=` $pp `>`
  }];
  let genVerifyDecl = 1;
}

#endif // MAPP_ATTRS_TD
