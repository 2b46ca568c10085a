#ifndef MAPP_DIALECT_TD
#define MAPP_DIALECT_TD

include "mlir/IR/OpBase.td"

def Mapp_Dialect : Dialect {
  let name = "mapp";
  let cppNamespace = "::mapp";
  let summary = "Distributed LLM training graphs: compute, communication and structure";
  let description = [{
    The `mapp` dialect describes one training step of a transformer model:
    compute ops on ranked tensors (with their gradient ops and optimizer
    updates), communication between ranks, and the structure that parallel
    passes add (pipeline stages, placed forward/backward subgraphs and
    per-rank schedule tables). Parameters are module-level symbols carrying
    their PyTorch `state_dict` names. Kernel semantics are specified in
    docs/semantics.md; every compute op lowers to one plan instruction.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 0;
}

class Mapp_Op<string mnemonic, list<Trait> traits = []>
    : Op<Mapp_Dialect, mnemonic, traits>;

#endif // MAPP_DIALECT_TD
