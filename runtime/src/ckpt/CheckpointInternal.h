//===- CheckpointInternal.h - pieces shared by the ckpt/ sources -*- C++ -*-===//
//
// Checkpoint.cpp saves and finds checkpoints, CheckpointManifest.cpp reads
// and validates a manifest and its shards, CheckpointLoad.cpp loads them
// into an Executor, SaveDir.cpp owns the save directory.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CKPT_CHECKPOINT_INTERNAL_H
#define MAPP_RT_CKPT_CHECKPOINT_INTERNAL_H

#include "mapp/rt/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

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

// The manifest's format (docs/checkpoints.md), shared by save and load.
using json = nlohmann::json;

// Version 2: the manifest is sealed and names its run and lineage.
constexpr int kFormatVersion = 2;
// Bounds of a manifest's numbers (far beyond any real run, far below
// overflow in the products the loader forms).
constexpr int64_t kMaxStep = int64_t(1) << 40;
constexpr int64_t kMaxDegree = 1 << 20;
constexpr int64_t kMaxElements = int64_t(1) << 40;

/// "rank-NNNNN.safetensors".
std::string shardFileName(int rank);
/// CRC-32 of a shard's bytes (the plan seal's).
uint32_t crcOf(const uint8_t *p, size_t n);
/// "%08x".
std::string hex32(uint32_t v);
/// The seal of a parsed manifest: every field but "seal", in nlohmann's
/// compact dump (object keys sorted), through the plan seal's CRC-32.
std::string sealOf(const json &m);
/// `s` is `n` lowercase hex digits.
bool isHex(const std::string &s, size_t n);
/// Pieces a value owned by `owner` is cut into (tp, dp or ep degree; 1).
int shardCountOf(const Plan &plan, const Value &owner);
/// The manifest entries of program `q`'s stored state (saveState's tensors).
json tensorsOf(const Plan &plan, const Program &q);
int64_t samplesPerStep(const Plan &plan);
/// A file's bytes; fails naming `what` when it is missing or not regular.
std::vector<uint8_t> readBytes(const std::string &path, const std::string &what);

// CheckpointManifest.cpp:
struct Shard {
  int rank = 0;
  std::string file, what;
  uint64_t bytes = 0;
  std::string crc;
  json tensors;
};

/// A manifest's values, every one validated (readManifest).
struct Manifest {
  int64_t step = 0;
  int64_t world = 0, tp = 0, pp = 0, dp = 0;
  std::string runId;
  std::vector<LineageLink> ancestors;
  json data, lossScale;
  std::vector<Shard> shards;
};

/// A JSON value in an error message, cut to 40 characters.
std::string briefJson(const json &v);
/// Seal, then every field of manifest `m` of checkpoint folder `ckpt`,
/// against `plan`; each error names the field.
Manifest readManifest(const json &m, const std::string &ckpt,
                      const Plan &plan);
/// Reads and checks one shard against its manifest entry: size, CRC-32,
/// the shard's own step/rank/layout/run metadata, its tensors.
Safetensors readShard(const std::string &ckpt, const Shard &s, const json &m);

} // namespace mapp::rt::ckpt

#endif
