//===- Checkpoint.cpp - sharded checkpoints: save and find ----------------===//
//
// Format: docs/checkpoints.md. The manifest is built by rank 0 from the plan
// (every rank's program is in it), so it describes each shard exactly; the
// ranks only send rank 0 their shard's size and CRC-32. The manifest is
// sealed (a CRC-32 over every field, the plan seal's hashing) and every field
// is validated on load: an edited step, layout or shard entry would resume
// silently into wrong state (CheckpointManifest.cpp; loading:
// CheckpointLoad.cpp). Who may delete what in the save directory:
// SaveDir.cpp.
//
//===----------------------------------------------------------------------===//
#include "CheckpointInternal.h"

#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/rt/Shard.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

using namespace mapp::rt;
using namespace mapp::rt::ckpt;
namespace fs = std::filesystem;

std::string mapp::rt::ckpt::stepFolderName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string mapp::rt::ckpt::temporaryName(const std::string &stepFolder,
                                          const std::string &runId, bool old) {
  return stepFolder + "." + runId + (old ? ".old.tmp" : ".tmp");
}

int64_t mapp::rt::ckpt::stepOfFolder(const std::string &name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0)
    return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9')
      return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

std::string mapp::rt::ckpt::planHashText(uint32_t checksum) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", checksum);
  return buf;
}

namespace {

// Above the pipeline (plan tags) and gatherParams (1 << 29) tag ranges.
constexpr int64_t kCrcTag = int64_t(1) << 30;

} // namespace

namespace mapp::rt::ckpt {

std::string shardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

uint32_t crcOf(const uint8_t *p, size_t n) { return sealCrc32(p, n); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

/// The seal of a parsed manifest: every field but "seal", in nlohmann's
/// compact dump (object keys sorted), through the plan seal's CRC-32.
std::string sealOf(const json &m) {
  json body = m;
  body.erase("seal");
  std::string text = body.dump();
  return hex32(sealCrc32(reinterpret_cast<const uint8_t *>(text.data()),
                         text.size()));
}

bool isHex(const std::string &s, size_t n) {
  if (s.size() != n)
    return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  return true;
}

int shardCountOf(const Plan &plan, const Value &owner) {
  if (owner.shardDim < 0)
    return 1;
  if (owner.shardGroup == "ep")
    return expertDegree(plan);
  return owner.shardGroup == "tp" ? plan.tp : plan.dp;
}

static int shardIndexOf(const Plan &plan, const Program &q, const Value &owner) {
  return shardGroupIndex(plan, q, owner);
}

/// ZeRO-1: the element range [lo, hi) of OptState value `v` that program
/// `q`'s optimizer updates; {0, numel} without zero_begin/zero_end.
static std::pair<int64_t, int64_t> zeroRangeOf(const Program &q, int v) {
  int64_t n = q.values[v].type.numel();
  for (const Block &b : q.blocks) {
    if (b.kind != BlockKind::Optimizer)
      continue;
    for (const Instr &in : b.instrs)
      for (size_t i = 2; i < in.inputs.size(); ++i)
        if (in.inputs[i] == v && in.attrs.has("zero_begin")) {
          int64_t lo = std::clamp<int64_t>(in.attrs.getInt("zero_begin", 0), 0, n);
          int64_t hi = std::clamp<int64_t>(in.attrs.getInt("zero_end", n), lo, n);
          return {lo, hi};
        }
  }
  return {0, n};
}

/// The manifest entries of program `q`'s stored state (saveState's tensors).
json tensorsOf(const Plan &plan, const Program &q) {
  json out = json::array();
  for (size_t v = 0; v < q.values.size(); ++v) {
    const Value &val = q.values[v];
    if (val.kind != ValueKind::Param && val.kind != ValueKind::OptState)
      continue;
    const Value &owner = val.param >= 0 ? q.values[val.param] : val;
    int n = shardCountOf(plan, owner);
    json e = {{"name", val.name},
              {"kind", val.kind == ValueKind::Param ? "param" : "opt_state"},
              {"param", owner.name},
              {"dtype", "F32"},
              {"shape", val.type.shape},
              {"full_shape", fullShapeOf(owner, n)},
              {"shard_dim", owner.shardDim},
              {"shard_group", owner.shardGroup},
              {"shard_blocks", owner.shardBlocks},
              {"shard_count", n},
              {"shard_index", shardIndexOf(plan, q, owner)}};
    if (val.kind == ValueKind::OptState) {
      auto [lo, hi] = zeroRangeOf(q, static_cast<int>(v));
      if (lo != 0 || hi != val.type.numel())
        e["zero_range"] = {lo, hi};
    }
    out.push_back(std::move(e));
  }
  return out;
}

int64_t samplesPerStep(const Plan &plan) {
  return static_cast<int64_t>(plan.dp) * plan.numMicrobatches *
         plan.microBatchSize;
}

std::vector<uint8_t> readBytes(const std::string &path, const std::string &what) {
  std::vector<uint8_t> bytes;
  std::string why;
  bool notRegular = false;
  if (!readRegularFile(path, bytes, why, &notRegular))
    fail(what, ": ",
         notRegular ? openFailure("", path, why, true)
                    : "missing (cannot open '" + path + "': " + why + ")");
  return bytes;
}

} // namespace mapp::rt::ckpt

std::string mapp::rt::firstNonFiniteTensor(const Safetensors &st) {
  for (const auto &[name, t] : st.tensors) {
    if (t.dtype != DType::F32)
      continue;
    const float *f = reinterpret_cast<const float *>(t.data.data());
    for (size_t i = 0, n = t.data.size() / 4; i < n; ++i)
      if (!std::isfinite(f[i]))
        return name;
  }
  return "";
}

std::string mapp::rt::manifestSeal(const std::string &manifestText) {
  json m = json::parse(manifestText, nullptr, false);
  if (!m.is_object())
    fail("manifestSeal: not a JSON object");
  return sealOf(m);
}

std::string mapp::rt::saveCheckpoint(Executor &exec, const std::string &dir,
                                     const CheckpointMeta &meta, int keep,
                                     const std::vector<std::string> &replace) {
  const Plan &plan = exec.plan();
  Communicator &comm = exec.comm();
  const int rank = comm.rank(), world = plan.worldSize;
  const int64_t step = exec.stepsDone();
  if (!isHex(meta.runId, 16))
    fail("saveCheckpoint: run id '", meta.runId, "' is not 16 hex digits");
  const std::string final = dir + "/" + stepFolderName(step);
  // Every rank knows the temporary's name: a function of (step, run id).
  const std::string tmp = dir + "/" + temporaryName(stepFolderName(step), meta.runId);
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      fail("--save-dir: cannot create '", dir, "': ", ec.message());
    beginTemporary(dir, step, meta);
  }
  comm.barrier();

  // A non-finite state is never checkpointed (the optimizer's own float
  // arithmetic can overflow, e.g. AdamW's exp_avg_sq, while the loss and
  // gradient norm are still finite). All ranks agree before anyone writes.
  Safetensors state = exec.saveState();
  std::string bad = firstNonFiniteTensor(state);
  double anyBad = bad.empty() ? 0 : 1;
  if (world > 1)
    comm.allReduce(&anyBad, 1, ReduceOp::Sum, comm.group(Group::World));
  if (anyBad > 0)
    fail("refusing to checkpoint step ", step, ": non-finite state on ",
         bad.empty() ? std::string("another rank")
                     : "rank " + std::to_string(rank) + ": " +
                           exec.describeNonFinite(bad),
         " (the previous checkpoint is kept)");
  // The shard's own record of where it belongs, compared with the manifest
  // on load ("step" comes from saveState).
  state.metadata["rank"] = std::to_string(rank);
  state.metadata["world"] = std::to_string(world);
  state.metadata["tp"] = std::to_string(plan.tp);
  state.metadata["pp"] = std::to_string(plan.pp);
  state.metadata["dp"] = std::to_string(plan.dp);
  state.metadata["run"] = meta.runId;
  std::vector<uint8_t> bytes = serializeSafetensors(state);
  state = {};
  writeFileAtomic(tmp + "/" + shardFileName(rank), bytes.data(), bytes.size());
  uint64_t mine[2] = {bytes.size(), crcOf(bytes.data(), bytes.size())};
  bytes = {};

  if (rank != 0) {
    comm.send(mine, sizeof mine, 0, kCrcTag + rank);
    comm.barrier();
    return final;
  }
  std::vector<std::array<uint64_t, 2>> sums(world);
  sums[0] = {mine[0], mine[1]};
  for (int r = 1; r < world; ++r)
    comm.recv(sums[r].data(), sizeof(uint64_t) * 2, r, kCrcTag + r);

  std::vector<const Program *> progs;
  for (const Program &q : plan.programs)
    progs.push_back(&q);
  std::sort(progs.begin(), progs.end(),
            [](const Program *a, const Program *b) { return a->rank < b->rank; });
  json shards = json::array();
  for (const Program *q : progs)
    shards.push_back({{"rank", q->rank},
                      {"file", shardFileName(q->rank)},
                      {"bytes", sums[q->rank][0]},
                      {"crc32", hex32(static_cast<uint32_t>(sums[q->rank][1]))},
                      {"coords", {{"dp", q->dp}, {"pp", q->pp}, {"tp", q->tp}}},
                      {"tensors", tensorsOf(plan, *q)}});
  json lineage = json::array();
  for (const LineageLink &l : meta.ancestors)
    lineage.push_back({{"run", l.runId}, {"step", l.step}});
  json m = {{"format", "mapp-checkpoint"},
            {"version", kFormatVersion},
            {"step", step},
            {"layout",
             {{"world", world}, {"tp", plan.tp}, {"pp", plan.pp},
              {"dp", plan.dp}, {"ep", plan.ep > 0 ? plan.ep : 1}, {"chunks", plan.chunks}}},
            {"model",
             {{"vocab_size", plan.vocabSize},
              {"seq_length", plan.seqLength},
              {"optimizer", plan.optimizer}}},
            {"data",
             {{"seed", meta.seed},
              {"shuffle", meta.shuffle},
              {"tokens", meta.dataTokens},
              {"samples_per_step", samplesPerStep(plan)},
              {"samples_consumed", step * samplesPerStep(plan)}}},
            {"rng",
             {{"kind", "counter"},
              {"note", "dropout masks and the data order are functions of "
                       "(seed, step); no generator state to save"},
              {"seed", meta.seed},
              {"step", step}}},
            {"loss_scale",
             {{"mode", exec.lossScaleMode()},
              {"scale", exec.lossScaleState().scale},
              {"good_steps", exec.lossScaleState().goodSteps}}},
            {"run",
             {{"id", meta.runId},
              {"plan", planHashText(meta.planChecksum)},
              {"lineage", lineage}}},
            {"shards", shards}};
  m["seal"] = {{"crc32", sealOf(m)}};
  std::string text = m.dump(1);
  writeFileAtomic(tmp + "/" + kManifest, text.data(), text.size());
  fsyncDir(tmp);

  std::error_code ec;
  if (fs::exists(final)) // re-saving a step (an overwrite the user allowed)
    retireFolder(dir, final, meta);
  fs::rename(tmp, final, ec);
  if (ec)
    fail("--save-dir: cannot rename '", tmp, "' to '", final, "': ",
         ec.message());
  fsyncDir(dir);
  for (const std::string &r : replace)
    if (r != final && fs::exists(r, ec))
      retireFolder(dir, r, meta);
  if (keep > 0)
    pruneLineage(dir, meta, keep);
  comm.barrier();
  return final;
}

std::string mapp::rt::findCheckpoint(const std::string &path,
                                     std::vector<std::string> *incomplete) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifest, ec))
    return path;
  if (!fs::is_directory(path, ec))
    fail("--resume: '", path, "' is not a folder");
  int64_t best = -1;
  std::string found;
  std::vector<std::pair<int64_t, std::string>> without;
  for (const auto &e : fs::directory_iterator(path, ec)) {
    int64_t n = stepOfFolder(e.path().filename().string());
    if (n < 0 || !e.is_directory(ec))
      continue;
    if (!fs::exists(e.path() / kManifest, ec))
      without.emplace_back(n, e.path().string());
    else if (n > best) {
      best = n;
      found = e.path().string();
    }
  }
  if (incomplete) {
    std::sort(without.rbegin(), without.rend());
    for (auto &w : without)
      incomplete->push_back(w.second);
  }
  if (found.empty())
    fail("--resume: no checkpoint in '", path,
         "' (no manifest.json there nor in a step-NNNNNNNN folder",
         without.empty() ? std::string()
                         : "; " + without.front().second +
                               " has no manifest.json",
         ")");
  return found;
}

