//===- CheckpointInternal.h - pieces shared by Checkpoint.cpp, SaveDir.cpp -===//
#ifndef MAPP_RT_CKPT_CHECKPOINT_INTERNAL_H
#define MAPP_RT_CKPT_CHECKPOINT_INTERNAL_H

#include "mapp/rt/Checkpoint.h"

#include <cstdint>
#include <string>

namespace mapp::rt::ckpt {

constexpr const char *kManifest = "manifest.json";

/// "step-NNNNNNNN".
std::string stepFolderName(int64_t step);
/// This run's temporary of a step folder: "step-NNNNNNNN.RUNID.tmp" (being
/// written) or, `old`, "step-NNNNNNNN.RUNID.old.tmp" (being removed).
std::string temporaryName(const std::string &stepFolder,
                          const std::string &runId, bool old = false);
/// N of a complete step folder's name "step-NNNNNNNN", -1 otherwise.
int64_t stepOfFolder(const std::string &name);
/// "0x%08x" of the plan seal's checksum (as in trace headers).
std::string planHashText(uint32_t checksum);

/// Who wrote a step folder, from its manifest (seal checked).
struct FolderOwner {
  bool known = false;  // a sealed manifest naming its run
  std::string runId;
  int64_t step = -1;
  std::string problem; // why not known ("no manifest.json", ...)
};
FolderOwner ownerOfCheckpoint(const std::string &folder);

// SaveDir.cpp (rank 0 of a save):
/// Removes this run's leftover temporaries and those provably abandoned by
/// a job of this plan, then creates DIR/step-N.RUNID.tmp with its owner file
/// and returns its path.
std::string beginTemporary(const std::string &dir, int64_t step,
                           const CheckpointMeta &meta);
/// Takes a complete step folder out of DIR: owner file, rename to a
/// temporary of this run, fsync, remove. A kill leaves either the folder
/// whole or a temporary a later save of this plan cleans.
void retireFolder(const std::string &dir, const std::string &folder,
                  const CheckpointMeta &meta);
/// Keeps the newest `keep` step folders of this run's lineage.
void pruneLineage(const std::string &dir, const CheckpointMeta &meta, int keep);

} // namespace mapp::rt::ckpt

#endif
