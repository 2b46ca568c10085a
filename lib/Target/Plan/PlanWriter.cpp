// Serializes plans with FlatBuffers and registers `--mapp-to-plan`.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Target/Plan/PlanBuilder.h"
#include "mapp/Target/Plan/plan_generated.h"

#include "mapp/Support/InputChecks.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Tools/ParseUtilities.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/CommandLine.h"

#include <cstring>

using namespace mlir;

// For A/B measurements of reshape aliasing (bench/gpu/alias.sh); plans are
// otherwise always built with aliases.
static llvm::cl::opt<bool> copyReshapes(
    "mapp-plan-copy-reshapes",
    llvm::cl::desc("--mapp-to-plan: give every reshape its own storage and "
                   "copy, instead of aliasing its operand"),
    llvm::cl::init(false));

LogicalResult mapp::writePlan(ModuleOp module, llvm::raw_ostream &os,
                              bool aliasReshapes) {
  FailureOr<std::unique_ptr<plan::PlanT>> p = buildPlan(module, aliasReshapes);
  if (failed(p))
    return failure();
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(plan::Plan::Pack(fbb, p->get()), plan::PlanIdentifier());
  llvm::ArrayRef<uint8_t> body(fbb.GetBufferPointer(), fbb.GetSize());
  // The seal (plan.fbs PlanSeal): CRC-32 (llvm::crc32 is zlib's, which the
  // runtime uses) over the body and the seal's first 16 bytes.
  const uint32_t magic = static_cast<uint32_t>(plan::SealMagic::MPSL);
  const uint32_t version = static_cast<uint32_t>(plan::SchemaVersion::Current);
  plan::PlanSeal head(magic, version, body.size(), 0, 0);
  uint8_t raw[sizeof(plan::PlanSeal)];
  std::memcpy(raw, &head, sizeof raw);
  uint32_t crc = llvm::crc32(llvm::crc32(body), llvm::ArrayRef(raw, 16));
  plan::PlanSeal seal(magic, version, body.size(), crc, 0);
  os.write(reinterpret_cast<const char *>(body.data()), body.size());
  os.write(reinterpret_cast<const char *>(&seal), sizeof seal);
  return success();
}

void mapp::registerToPlanTranslation() {
  // Parses the module itself (what TranslateFromMLIRRegistration would do)
  // so that the input's nesting is checked before the parser recurses.
  TranslateRegistration reg(
      "mapp-to-plan", "serialize a training module as a runtime plan (.mplan)",
      [](const std::shared_ptr<llvm::SourceMgr> &sourceMgr,
         llvm::raw_ostream &os, MLIRContext *ctx) -> LogicalResult {
        if (failed(checkInputNesting(*sourceMgr, ctx)))
          return failure();
        DialectRegistry registry;
        registry.insert<MappDialect, func::FuncDialect>();
        ctx->appendDialectRegistry(registry);
        OwningOpRef<Operation *> op =
            parseSourceFileForTool(sourceMgr, ParserConfig(ctx),
                                   /*insertImplicitModule=*/true);
        if (!op || failed(verify(*op)))
          return failure();
        auto module = dyn_cast<ModuleOp>(*op);
        if (!module)
          return op->emitError("mapp-to-plan expects a builtin.module");
        return writePlan(module, os, !copyReshapes);
      });
}
