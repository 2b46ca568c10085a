//===- InputChecks.cpp - what the compiler's tools read before parsing ----===//
#include "mapp/Support/InputChecks.h"
#include "mapp/rt/RegularFile.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

using namespace mapp;

/// MLIR bytecode (its magic "ML\xefR") is binary: not scanned.
static bool isBytecode(llvm::StringRef text) {
  return text.starts_with("ML\xefR"); // 'R' is not a hex digit
}

mlir::LogicalResult mapp::checkInputNesting(llvm::SourceMgr &sourceMgr,
                                            mlir::MLIRContext *ctx) {
  const llvm::MemoryBuffer *buf =
      sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  llvm::StringRef text = buf->getBuffer();
  std::optional<size_t> at;
  if (isBytecode(text) || !(at = findNestingBeyond(text)))
    return mlir::success();
  auto [line, col] = sourceMgr.getLineAndColumn(
      llvm::SMLoc::getFromPointer(text.data() + *at));
  return mlir::emitError(mlir::FileLineColLoc::get(
             ctx, buf->getBufferIdentifier(), line, col))
         << nestingMessage();
}

std::unique_ptr<llvm::MemoryBuffer>
mapp::openCheckedInput(llvm::StringRef path) {
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buf =
      std::make_error_code(std::errc::io_error);
  std::string why;
  if (path == "-") {
    buf = llvm::MemoryBuffer::getSTDIN();
  } else {
    // One descriptor for the check and the read: the file checked is the
    // file read.
    bool notRegular = false;
    int fd = rt::openRegularFile(path.str(), why, &notRegular);
    if (fd < 0) {
      llvm::errs() << rt::openFailure("input file ", path.str(), why,
                                      notRegular)
                   << "\n";
      return nullptr;
    }
    buf = llvm::MemoryBuffer::getOpenFile(
        llvm::sys::fs::convertFDToNativeFile(fd), path, /*FileSize=*/-1);
    ::close(fd);
  }
  if (!buf) {
    llvm::errs() << "cannot open input file '" << path << "' ("
                 << buf.getError().message() << ")\n";
    return nullptr;
  }
  llvm::StringRef text = (*buf)->getBuffer();
  std::optional<size_t> at;
  if (isBytecode(text) || !(at = findNestingBeyond(text)))
    return std::move(*buf);
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBuffer((*buf)->getMemBufferRef(),
                                       /*RequiresNullTerminator=*/false),
      llvm::SMLoc());
  sourceMgr.PrintMessage(llvm::errs(),
                         llvm::SMLoc::getFromPointer(text.data() + *at),
                         llvm::SourceMgr::DK_Error, nestingMessage());
  return nullptr;
}

bool mapp::checkInputArguments(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg = argv[i];
    if (arg == "-o" || arg == "--o") {
      ++i; // the output: any file may be written
      continue;
    }
    // Options (and their "=value"s) name no input; "-" is stdin.
    if (arg.starts_with("-") || !llvm::sys::fs::exists(arg))
      continue;
    bool notRegular = false;
    std::string why = rt::whyNotRegularFile(arg.str(), &notRegular);
    if (why.empty())
      continue;
    llvm::errs() << llvm::sys::path::filename(argv[0]) << ": "
                 << rt::openFailure("input file ", arg.str(), why, notRegular)
                 << "\n";
    return false;
  }
  return true;
}
