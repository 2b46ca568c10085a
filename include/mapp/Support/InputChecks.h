//===- InputChecks.h - what the tools check before parsing --*- C++ -*-===//
//
// Checks the compiler's tools make on an input before a parser sees it:
// that a named input is a regular file (mapp/rt/RegularFile.h: a FIFO would
// block the read forever), and that its brackets do not nest deeper than
// kMaxInputNesting (mapp/Support/Nesting.h).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SUPPORT_INPUTCHECKS_H
#define MAPP_SUPPORT_INPUTCHECKS_H

#include "mapp/Support/Nesting.h"

#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <memory>
#include <string>

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace mapp {

/// A located error (through `ctx`'s diagnostics) when the main buffer of
/// `sourceMgr` nests beyond kMaxInputNesting: translations check their
/// input with it before they parse.
mlir::LogicalResult checkInputNesting(llvm::SourceMgr &sourceMgr,
                                      mlir::MLIRContext *ctx);

/// mapp-opt's input: `path` ("-": stdin) read whole if a regular file and
/// nested within kMaxInputNesting (MLIR bytecode is not scanned); nullptr
/// after printing a located error to llvm::errs() otherwise.
std::unique_ptr<llvm::MemoryBuffer> openCheckedInput(llvm::StringRef path);

/// mapp-translate reads its input before any translation runs, so its
/// main checks the command line first: every argument that names an
/// existing file, other than the value of -o, must name a regular file.
/// False after printing the reason to llvm::errs() otherwise.
bool checkInputArguments(int argc, char **argv);

} // namespace mapp

#endif // MAPP_SUPPORT_INPUTCHECKS_H
