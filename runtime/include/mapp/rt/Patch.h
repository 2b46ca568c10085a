//===- Patch.h - activation patching (mapp-run --patch) ---------*- C++ -*-===//
//
// Runs prompt B, keeps one named activation at one position, runs prompt A
// with that row replaced, and reports how the logit of a target token at
// A's last position moves. Parameters only: the site is resolved against the
// plan's value names, nothing the caller sends is executed.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PATCH_H
#define MAPP_RT_PATCH_H

#include "mapp/rt/Executor.h"
#include "mapp/rt/Tokenizer.h"

#include <string>

namespace mapp::rt {

struct PatchOptions {
  std::string into, from; // prompt A (patched), prompt B (source): texts
  std::string site;       // resid, attn, mlp, or a path under layers.L
  int64_t layer = -1, pos = -1;
  std::string target;     // text of exactly one token
};

/// Parses "into=A.txt,from=B.txt,site=resid,layer=1,pos=3,target=e" (the
/// prompt files are read here); a missing or unknown key, a malformed
/// number or an unreadable file -> Error naming it.
PatchOptions parsePatchSpec(const std::string &spec);

struct PatchResult {
  std::string value;        // the plan value patched
  int32_t target = 0;       // token id
  int64_t lastA = 0;        // A's last position (where the logit is read)
  double cleanLogit = 0, patchedLogit = 0, sourceLogit = 0;
};

/// Single-rank plans; A and B must fit seq_length and pos must be inside
/// both. Batch rows all hold the same prompt and are all patched.
PatchResult runPatch(Executor &exec, const Tokenizer &tok,
                     const PatchOptions &o);

} // namespace mapp::rt

#endif
