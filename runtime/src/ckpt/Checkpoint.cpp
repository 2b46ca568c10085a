//===- Checkpoint.cpp - sharded checkpoints: save, find, verify, load -----===//
//
// Format: docs/checkpoints.md. The manifest is built by rank 0 from the plan
// (every rank's program is in it), so it describes each shard exactly; the
// ranks only send rank 0 their shard's size and CRC-32. The manifest is
// sealed (a CRC-32 over every field, the plan seal's hashing) and every field
// is validated on load: an edited step, layout or shard entry would resume
// silently into wrong state. Who may delete what in the save directory:
// SaveDir.cpp.
//
//===----------------------------------------------------------------------===//
#include "CheckpointInternal.h"

#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/rt/Shard.h"

#include <nlohmann/json.hpp>

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
using json = nlohmann::json;
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

// Version 2: the manifest is sealed and names its run and lineage.
constexpr int kFormatVersion = 2;
// Above the pipeline (plan tags) and gatherParams (1 << 29) tag ranges.
constexpr int64_t kCrcTag = int64_t(1) << 30;
// Bounds of a manifest's numbers (far beyond any real run, far below
// overflow in the products the loader forms).
constexpr int64_t kMaxStep = int64_t(1) << 40;
constexpr int64_t kMaxDegree = 1 << 20;
constexpr int64_t kMaxElements = int64_t(1) << 40;

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

int shardIndexOf(const Plan &plan, const Program &q, const Value &owner) {
  return shardGroupIndex(plan, q, owner);
}

/// ZeRO-1: the element range [lo, hi) of OptState value `v` that program
/// `q`'s optimizer updates; {0, numel} without zero_begin/zero_end.
std::pair<int64_t, int64_t> zeroRangeOf(const Program &q, int v) {
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

} // namespace

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

namespace {

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

std::string briefJson(const json &v) {
  std::string t = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

/// Reads a manifest's fields; each error names the field ("layout.tp",
/// "shards[1].rank") and what is wrong with it.
class FieldReader {
public:
  explicit FieldReader(std::string mpath) : mpath_(std::move(mpath)) {}

  [[noreturn]] void bad(const std::string &field, const std::string &why) const {
    fail(mpath_, ": field '", field, "' ", why);
  }
  static std::string join(const std::string &prefix, const std::string &key) {
    return prefix.empty() ? key : prefix + "." + key;
  }
  const json &object(const json &v, const std::string &field) const {
    if (!v.is_object())
      bad(field, "is " + briefJson(v) + ", not an object");
    return v;
  }
  const json &array(const json &v, const std::string &field) const {
    if (!v.is_array())
      bad(field, "is " + briefJson(v) + ", not an array");
    return v;
  }
  const json &at(const json &obj, const std::string &prefix,
                 const char *key) const {
    auto it = obj.find(key);
    if (it == obj.end())
      bad(join(prefix, key), "is missing");
    return *it;
  }
  int64_t integer(const json &v, const std::string &field, int64_t lo,
                  int64_t hi) const {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      bad(field, "is " + briefJson(v) + ", not an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      bad(field, "is " + std::to_string(x) + ", outside [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  int64_t integer(const json &obj, const std::string &prefix, const char *key,
                  int64_t lo, int64_t hi) const {
    return integer(at(obj, prefix, key), join(prefix, key), lo, hi);
  }
  uint64_t unsignedInt(const json &obj, const std::string &prefix,
                       const char *key) const {
    const json &v = at(obj, prefix, key);
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      bad(join(prefix, key), "is " + briefJson(v) + ", not an unsigned integer");
    return v.get<uint64_t>();
  }
  std::string string(const json &obj, const std::string &prefix,
                     const char *key) const {
    const json &v = at(obj, prefix, key);
    if (!v.is_string())
      bad(join(prefix, key), "is " + briefJson(v) + ", not a string");
    return v.get<std::string>();
  }
  bool boolean(const json &obj, const std::string &prefix,
               const char *key) const {
    const json &v = at(obj, prefix, key);
    if (!v.is_boolean())
      bad(join(prefix, key), "is " + briefJson(v) + ", not true or false");
    return v.get<bool>();
  }
  /// An object holding exactly `keys` (unknown fields are refused: a
  /// manifest is written by mapp alone).
  const json &fields(const json &v, const std::string &field,
                     std::initializer_list<const char *> keys,
                     std::initializer_list<const char *> optional = {}) const {
    object(v, field);
    for (auto it = v.begin(); it != v.end(); ++it) {
      bool known = false;
      for (const char *k : keys)
        known |= it.key() == k;
      for (const char *k : optional)
        known |= it.key() == k;
      if (!known)
        bad(join(field, it.key()), "is not a field of a mapp checkpoint manifest");
    }
    for (const char *k : keys)
      at(v, field, k);
    return v;
  }
  /// A shape: integers >= 0 whose product is at most kMaxElements.
  Shape shape(const json &obj, const std::string &prefix, const char *key) const {
    std::string field = join(prefix, key);
    const json &v = array(at(obj, prefix, key), field);
    if (v.size() > 16)
      bad(field, "has " + std::to_string(v.size()) + " dimensions (at most 16)");
    Shape s;
    int64_t n = 1;
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t d = integer(v[i], field + "[" + std::to_string(i) + "]", 0,
                          kMaxElements);
      s.push_back(d);
      if (d != 0 && n > kMaxElements / d)
        bad(field, "has more than 2^40 elements");
      n *= d;
    }
    return s;
  }

private:
  std::string mpath_;
};

/// The shard metadata saveCheckpoint writes, against the manifest's value.
struct ShardMark {
  const char *key;    // in the shard's metadata
  std::string field;  // the manifest's field
  std::string value;  // the manifest's value
};

std::vector<ShardMark> expectedMarks(const json &m, const json &entry,
                                     size_t index) {
  auto text = [](const json &v) {
    return v.is_number_integer() ? std::to_string(v.get<int64_t>())
                                 : briefJson(v);
  };
  std::vector<ShardMark> marks;
  if (m.contains("step"))
    marks.push_back({"step", "step", text(m["step"])});
  if (entry.is_object() && entry.contains("rank"))
    marks.push_back({"rank", "shards[" + std::to_string(index) + "].rank",
                     text(entry["rank"])});
  if (m.contains("layout") && m["layout"].is_object())
    for (const char *k : {"world", "tp", "pp", "dp"})
      if (m["layout"].contains(k))
        marks.push_back({k, std::string("layout.") + k, text(m["layout"][k])});
  if (m.contains("run") && m["run"].is_object() && m["run"].contains("id") &&
      m["run"]["id"].is_string())
    marks.push_back({"run", "run.id", m["run"]["id"].get<std::string>()});
  return marks;
}

/// "" when the shard's own metadata agrees with the manifest, else what
/// differs first, naming the manifest's field.
std::string markMismatch(const Safetensors &st,
                         const std::vector<ShardMark> &marks) {
  for (const ShardMark &k : marks) {
    auto it = st.metadata.find(k.key);
    std::string own = it == st.metadata.end() ? "nothing" : it->second;
    if (own != k.value)
      return "the manifest's field '" + k.field + "' says " + k.value +
             ", the shard's own metadata says " + k.key + " " + own;
  }
  return "";
}

/// Which field an edit of a manifest changed, where the shards tell (read
/// only on the way to an error): "; shard F: the manifest's field ...".
std::string diagnoseEdit(const json &m, const std::string &ckpt) {
  try {
    if (!m.contains("shards") || !m["shards"].is_array())
      return "";
    for (size_t i = 0; i < m["shards"].size(); ++i) {
      const json &e = m["shards"][i];
      if (!e.is_object() || !e.contains("file") || !e["file"].is_string())
        continue;
      std::string file = e["file"].get<std::string>();
      if (file.empty() || file[0] == '.' || file.find('/') != std::string::npos)
        continue;
      std::error_code ec;
      if (!fs::is_regular_file(ckpt + "/" + file, ec))
        continue;
      Safetensors st =
          parseSafetensors(readBytes(ckpt + "/" + file, file), file);
      std::string why = markMismatch(st, expectedMarks(m, e, i));
      if (!why.empty())
        return "; shard " + file + ": " + why;
    }
  } catch (const std::exception &) {
  }
  return "";
}

/// Every number of a manifest is an integer except loss_scale's "scale":
/// nlohmann casts a float to the integer a field is read as, which out of
/// range is undefined behaviour and in range a silent truncation (found by
/// mapp-fuzz-safetensors under UBSan).
void requireIntegers(const json &j, const std::string &mpath,
                            const std::string &key) {
  if (j.is_number_float() && key != "scale")
    fail(mpath, ": malformed manifest (\"", key, "\" holds ", j.dump(),
         " where an integer belongs)");
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      requireIntegers(it.value(), mpath, it.key());
  else if (j.is_array())
    for (const json &e : j)
      requireIntegers(e, mpath, key);
}

/// Seal, then every field: the format's reference is docs/checkpoints.md.
Manifest readManifest(const json &m, const std::string &ckpt,
                      const Plan &plan) {
  const std::string mpath = ckpt + "/" + kManifest;
  FieldReader f(mpath);
  if (!m.is_object())
    fail(mpath, ": not a mapp checkpoint manifest (not a JSON object)");
  std::string format = f.string(m, "", "format");
  if (format != "mapp-checkpoint")
    f.bad("format", "is '" + format + "', not 'mapp-checkpoint'");
  int64_t version = f.integer(m, "", "version", 0, INT64_MAX);
  if (version != kFormatVersion)
    fail(mpath, ": checkpoint format version ", version,
         ", this mapp reads version ", kFormatVersion,
         " (sealed manifests; docs/checkpoints.md)");
  if (!m.contains("seal"))
    fail(mpath, ": the manifest is not sealed (no field 'seal'): not as "
                "mapp wrote it");
  const json &seal = f.fields(m["seal"], "seal", {"crc32"});
  std::string sealed = f.string(seal, "seal", "crc32");
  std::string actual = sealOf(m);
  if (sealed != actual)
    fail(mpath, ": the manifest's seal does not match its contents (CRC-32 ",
         actual, ", sealed ", sealed,
         "): it was changed after it was written", diagnoseEdit(m, ckpt));
  requireIntegers(m, mpath, "");

  f.fields(m, "", {"format", "version", "step", "layout", "model", "data",
                   "rng", "loss_scale", "run", "shards", "seal"});
  Manifest man;
  man.step = f.integer(m, "", "step", 0, kMaxStep);

  const json &l = f.fields(m["layout"], "layout",
                           {"world", "tp", "pp", "dp", "ep", "chunks"});
  man.world = f.integer(l, "layout", "world", 1, kMaxDegree);
  man.tp = f.integer(l, "layout", "tp", 1, kMaxDegree);
  man.pp = f.integer(l, "layout", "pp", 1, kMaxDegree);
  man.dp = f.integer(l, "layout", "dp", 1, kMaxDegree);
  f.integer(l, "layout", "ep", 1, man.world);
  f.integer(l, "layout", "chunks", 1, kMaxDegree);
  if (man.tp * man.pp > man.world || man.tp * man.pp * man.dp > man.world)
    f.bad("layout.world", "is " + std::to_string(man.world) +
                              ", less than tp x pp x dp = " +
                              std::to_string(man.tp * man.pp * man.dp));

  // The model fields name what a resume needs equal.
  const json &model = f.fields(m["model"], "model",
                               {"vocab_size", "seq_length", "optimizer"});
  auto planMismatch = [&](const char *field, const std::string &was,
                          const std::string &is) {
    fail("checkpoint ", ckpt, " does not match the plan: field '", field,
         "' of its manifest is ", was, ", the plan's is ", is);
  };
  int64_t vocab = f.integer(model, "model", "vocab_size", 1, INT32_MAX);
  int64_t seq = f.integer(model, "model", "seq_length", 1, INT32_MAX);
  std::string optimizer = f.string(model, "model", "optimizer");
  if (vocab != plan.vocabSize)
    planMismatch("model.vocab_size", std::to_string(vocab),
                 std::to_string(plan.vocabSize));
  if (seq != plan.seqLength)
    planMismatch("model.seq_length", std::to_string(seq),
                 std::to_string(plan.seqLength));
  if (optimizer != plan.optimizer)
    planMismatch("model.optimizer", "'" + optimizer + "'",
                 "'" + plan.optimizer + "'");

  const json &d = f.fields(m["data"], "data",
                           {"seed", "shuffle", "tokens", "samples_per_step",
                            "samples_consumed"});
  uint64_t seed = f.unsignedInt(d, "data", "seed");
  f.boolean(d, "data", "shuffle");
  f.integer(d, "data", "tokens", -1, INT64_MAX);
  int64_t perStep = f.integer(d, "data", "samples_per_step", 1, kMaxStep);
  int64_t consumed = f.integer(d, "data", "samples_consumed", 0, INT64_MAX);
  int64_t want = 0;
  if (__builtin_mul_overflow(man.step, perStep, &want) || consumed != want)
    f.bad("data.samples_consumed",
          "is " + std::to_string(consumed) + ", step x samples_per_step is " +
              std::to_string(man.step) + " x " + std::to_string(perStep));
  man.data = d;

  const json &rng = f.fields(m["rng"], "rng", {"kind", "note", "seed", "step"});
  if (f.string(rng, "rng", "kind") != "counter")
    f.bad("rng.kind", "is not 'counter'");
  f.string(rng, "rng", "note");
  if (f.unsignedInt(rng, "rng", "seed") != seed)
    f.bad("rng.seed", "differs from data.seed");
  if (f.integer(rng, "rng", "step", 0, kMaxStep) != man.step)
    f.bad("rng.step", "differs from step");

  const json &ls = f.fields(m["loss_scale"], "loss_scale",
                            {"mode", "scale", "good_steps"});
  std::string mode = f.string(ls, "loss_scale", "mode");
  if (mode != "none" && mode != "static" && mode != "dynamic")
    f.bad("loss_scale.mode", "is '" + mode + "', not none, static or dynamic");
  if (!ls["scale"].is_number() || !std::isfinite(ls["scale"].get<double>()) ||
      ls["scale"].get<double>() <= 0)
    f.bad("loss_scale.scale", "is " + briefJson(ls["scale"]) +
                                  ", not a finite number > 0");
  f.integer(ls, "loss_scale", "good_steps", 0, kMaxStep);
  man.lossScale = ls;

  const json &run = f.fields(m["run"], "run", {"id", "plan", "lineage"});
  man.runId = f.string(run, "run", "id");
  if (!isHex(man.runId, 16))
    f.bad("run.id", "is '" + man.runId + "', not 16 hex digits");
  std::string planHash = f.string(run, "run", "plan");
  if (planHash.size() != 10 || planHash.rfind("0x", 0) != 0 ||
      !isHex(planHash.substr(2), 8))
    f.bad("run.plan", "is '" + planHash + "', not 0x and 8 hex digits");
  const json &lineage = f.array(run["lineage"], "run.lineage");
  std::set<std::string> runsSeen = {man.runId};
  int64_t lastStep = 0;
  for (size_t i = 0; i < lineage.size(); ++i) {
    std::string field = "run.lineage[" + std::to_string(i) + "]";
    const json &e = f.fields(lineage[i], field, {"run", "step"});
    LineageLink link{f.string(e, field, "run"),
                     f.integer(e, field, "step", lastStep, man.step)};
    if (!isHex(link.runId, 16) || !runsSeen.insert(link.runId).second)
      f.bad(field + ".run", "is '" + link.runId +
                                "', not the 16 hex digits of another run");
    lastStep = link.step;
    man.ancestors.push_back(link);
  }

  const json &shards = f.array(m["shards"], "shards");
  if (static_cast<int64_t>(shards.size()) != man.world)
    fail(mpath, ": lists ", shards.size(), " shards for a world of ",
         man.world);
  Layout layout{static_cast<int>(man.tp), static_cast<int>(man.dp),
                static_cast<int>(man.pp)};
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string field = "shards[" + std::to_string(i) + "]";
    const json &s = f.fields(shards[i], field,
                             {"rank", "file", "bytes", "crc32", "coords",
                              "tensors"});
    Shard sh;
    sh.rank = static_cast<int>(f.integer(s, field, "rank", 0, man.world - 1));
    if (sh.rank != static_cast<int>(i))
      f.bad(field + ".rank", "is " + std::to_string(sh.rank) +
                                 ", but the shards are listed by rank: entry " +
                                 std::to_string(i) + " is rank " +
                                 std::to_string(i) + "'s");
    sh.file = f.string(s, field, "file");
    if (sh.file != shardFileName(sh.rank))
      f.bad(field + ".file", "is '" + sh.file + "', rank " +
                                 std::to_string(sh.rank) + "'s shard is '" +
                                 shardFileName(sh.rank) + "'");
    sh.what = "checkpoint " + ckpt + ": shard " + sh.file;
    sh.bytes = static_cast<uint64_t>(
        f.integer(s, field, "bytes", 0, int64_t(1) << 50));
    sh.crc = f.string(s, field, "crc32");
    if (!isHex(sh.crc, 8))
      f.bad(field + ".crc32", "is '" + sh.crc + "', not 8 hex digits");
    std::string cf = field + ".coords";
    const json &c = f.fields(s["coords"], cf, {"dp", "pp", "tp"});
    int64_t cdp = f.integer(c, cf, "dp", 0, man.dp - 1);
    int64_t cpp = f.integer(c, cf, "pp", 0, man.pp - 1);
    int64_t ctp = f.integer(c, cf, "tp", 0, man.tp - 1);
    if (sh.rank < layout.world() &&
        (cdp != layout.dpOf(sh.rank) || cpp != layout.ppOf(sh.rank) ||
         ctp != layout.tpOf(sh.rank)))
      f.bad(cf, "are (dp " + std::to_string(cdp) + ", pp " +
                    std::to_string(cpp) + ", tp " + std::to_string(ctp) +
                    "), rank " + std::to_string(sh.rank) + " of this layout is (dp " +
                    std::to_string(layout.dpOf(sh.rank)) + ", pp " +
                    std::to_string(layout.ppOf(sh.rank)) + ", tp " +
                    std::to_string(layout.tpOf(sh.rank)) + ")");
    const json &ts = f.array(s["tensors"], field + ".tensors");
    std::set<std::string> names;
    for (size_t k = 0; k < ts.size(); ++k) {
      std::string tf = field + ".tensors[" + std::to_string(k) + "]";
      const json &t = f.fields(ts[k], tf,
                               {"name", "kind", "param", "dtype", "shape",
                                "full_shape", "shard_dim", "shard_group",
                                "shard_blocks", "shard_count", "shard_index"},
                               {"zero_range"});
      std::string name = f.string(t, tf, "name");
      if (name.empty() || !names.insert(name).second)
        f.bad(tf + ".name", "is '" + name + "': empty or listed twice");
      std::string kind = f.string(t, tf, "kind");
      if (kind != "param" && kind != "opt_state")
        f.bad(tf + ".kind", "is '" + kind + "', not param or opt_state");
      if (f.string(t, tf, "param").empty())
        f.bad(tf + ".param", "is empty");
      if (f.string(t, tf, "dtype") != "F32")
        f.bad(tf + ".dtype", "is not F32");
      Shape shape = f.shape(t, tf, "shape"), full = f.shape(t, tf, "full_shape");
      int64_t dim = f.integer(t, tf, "shard_dim", -1,
                              static_cast<int64_t>(shape.size()) - 1);
      std::string group = f.string(t, tf, "shard_group");
      if (group != "" && group != "tp" && group != "dp" && group != "ep")
        f.bad(tf + ".shard_group", "is '" + group + "', not tp, dp, ep or empty");
      int64_t blocks = f.integer(t, tf, "shard_blocks", 1, kMaxDegree);
      int64_t count = f.integer(t, tf, "shard_count", 1, man.world);
      f.integer(t, tf, "shard_index", 0, count - 1);
      bool fits = full.size() == shape.size() && (dim >= 0 || count == 1);
      for (size_t x = 0; fits && x < shape.size(); ++x)
        fits = static_cast<int64_t>(x) == dim
                   ? full[x] == shape[x] * count && shape[x] % blocks == 0
                   : full[x] == shape[x];
      if (!fits)
        f.bad(tf + ".full_shape", "is " + shapeStr(full) + ", not shape " +
                                      shapeStr(shape) + " cut " +
                                      std::to_string(count) + " ways on dim " +
                                      std::to_string(dim) + " in " +
                                      std::to_string(blocks) + " block(s)");
      if (t.contains("zero_range")) {
        std::string zf = tf + ".zero_range";
        const json &z = f.array(t["zero_range"], zf);
        if (z.size() != 2)
          f.bad(zf, "is not [lo, hi]");
        int64_t lo = f.integer(z[0], zf + "[0]", 0, numel(shape));
        f.integer(z[1], zf + "[1]", lo, numel(shape));
      }
    }
    sh.tensors = ts;
    man.shards.push_back(std::move(sh));
  }
  return man;
}

/// Reads and checks one shard against its manifest entry: size, CRC-32,
/// the shard's own step/rank/layout/run metadata, its tensors.
Safetensors readShard(const std::string &ckpt, const Shard &s,
                      const json &m) {
  std::vector<uint8_t> bytes = readBytes(ckpt + "/" + s.file, s.what);
  if (bytes.size() != s.bytes)
    fail(s.what, ": ", bytes.size(), " bytes, the manifest says ", s.bytes,
         bytes.size() < s.bytes ? " (truncated)" : "");
  std::string crc = hex32(crcOf(bytes.data(), bytes.size()));
  if (crc != s.crc)
    fail(s.what, ": checksum mismatch (CRC-32 ", crc, ", the manifest says ",
         s.crc, "): the file is corrupt");
  Safetensors st = parseSafetensors(bytes, s.what);
  std::string why = markMismatch(
      st, expectedMarks(m, m["shards"][static_cast<size_t>(s.rank)],
                        static_cast<size_t>(s.rank)));
  if (!why.empty())
    fail(s.what, ": ", why, " (a manifest resealed after an edit, or shards "
                            "of another checkpoint)");
  for (const json &e : s.tensors) {
    std::string name = e.at("name").get<std::string>();
    auto it = st.tensors.find(name);
    if (it == st.tensors.end())
      fail(s.what, ": tensor '", name, "' listed in the manifest is missing");
    if (it->second.shape != e.at("shape").get<Shape>() ||
        it->second.dtype != DType::F32)
      fail(s.what, ": tensor '", name, "' is ",
           safetensorsDTypeName(it->second.dtype), shapeStr(it->second.shape),
           ", the manifest says F32", shapeStr(e.at("shape").get<Shape>()));
  }
  if (st.tensors.size() != s.tensors.size())
    fail(s.what, ": ", st.tensors.size(), " tensors, the manifest lists ",
         s.tensors.size());
  return st;
}

/// name -> full shape of every Param and OptState of the plan.
std::map<std::string, Shape> planTensors(const Plan &plan) {
  std::map<std::string, Shape> out;
  for (const Program &q : plan.programs)
    for (const Value &v : q.values)
      if (v.kind == ValueKind::Param || v.kind == ValueKind::OptState) {
        const Value &owner = v.param >= 0 ? q.values[v.param] : v;
        out[v.name] = fullShapeOf(owner, shardCountOf(plan, owner));
      }
  return out;
}

/// Full tensors of every name from every shard (the reshard path): pieces
/// placed with copyPiece, ZeRO-1 optimizer state merged from the ranges
/// their owners updated.
Safetensors assembleFull(const std::string &ckpt,
                         const std::vector<Shard> &shards, const json &m) {
  struct Piece {
    Shape shape;
    std::vector<float> data;
  };
  std::map<std::string, std::map<int, Piece>> pieces; // name -> idx -> piece
  std::map<std::string, json> entryOf;
  for (const Shard &s : shards) {
    Safetensors st = readShard(ckpt, s, m);
    for (const json &e : s.tensors) {
      std::string name = e.at("name").get<std::string>();
      int idx = e.at("shard_index").get<int>();
      std::vector<float> f = st.tensors.at(name).toF32(name);
      auto &slot = pieces[name];
      bool first = !slot.count(idx);
      Piece &p = slot[idx];
      if (first) {
        p.shape = e.at("shape").get<Shape>();
        p.data = f;
        entryOf[name] = e;
      } else if (e.contains("zero_range")) {
        int64_t lo = e["zero_range"][0].get<int64_t>(),
                hi = e["zero_range"][1].get<int64_t>();
        if (lo < 0 || hi > static_cast<int64_t>(f.size()) || lo > hi)
          fail(s.what, ": tensor '", name, "' has zero_range [", lo, ", ", hi,
               ") outside its ", f.size(), " elements");
        std::copy(f.begin() + lo, f.begin() + hi, p.data.begin() + lo);
      }
    }
  }
  Safetensors full;
  for (auto &[name, byIdx] : pieces) {
    const json &e = entryOf[name];
    Shape fullShape = e.at("full_shape").get<Shape>();
    int n = e.at("shard_count").get<int>();
    if (static_cast<int>(byIdx.size()) != n)
      fail(ckpt, ": tensor '", name, "' has ", byIdx.size(), " of its ", n,
           " pieces in the shards");
    std::vector<float> buf(static_cast<size_t>(numel(fullShape)));
    for (auto &[idx, p] : byIdx) {
      if (n == 1)
        buf = p.data;
      else
        copyPiece(buf.data(), p.data.data(), p.shape, e.at("shard_dim").get<int>(),
                  e.at("shard_blocks").get<int>(), n, idx, false);
    }
    full.tensors[name] = StTensor::fromF32(fullShape, buf.data());
  }
  return full;
}

} // namespace

static int64_t loadCheckpointFrom(Executor &exec, const std::string &ckpt,
                                  const CheckpointMeta &expect,
                                  std::vector<LineageLink> *lineage) {
  const Plan &plan = exec.plan();
  const Program &prog = exec.program();
  const std::string mpath = ckpt + "/" + kManifest;
  json m;
  try {
    std::vector<uint8_t> raw = readBytes(mpath, mpath);
    m = json::parse(raw.begin(), raw.end());
  } catch (const json::exception &e) {
    fail(mpath, ": not a valid manifest (", e.what(), ")");
  }
  const Manifest man = readManifest(m, ckpt, plan);
  const int64_t step = man.step;
  if (expect.runSteps >= 0 && step > expect.runSteps)
    fail("checkpoint ", ckpt, " is at step ", step, ", past this run's --steps ",
         expect.runSteps, " (--steps counts the whole run): nothing to run");

  // The model: the same tensors by name and full shape; every shard's entry
  // of a name cut the same way (the reshard path assembles from them).
  std::map<std::string, Shape> want = planTensors(plan), have;
  std::map<std::string, const json *> firstEntry;
  for (const Shard &s : man.shards)
    for (const json &e : s.tensors) {
      std::string name = e.at("name").get<std::string>();
      auto [it, fresh] = firstEntry.emplace(name, &e);
      if (!fresh)
        for (const char *k : {"kind", "param", "full_shape", "shard_dim",
                              "shard_group", "shard_blocks", "shard_count"})
          if (e.at(k) != it->second->at(k))
            fail(mpath, ": field '", k, "' of tensor '", name, "' in shard ",
                 s.file, " is ", briefJson(e.at(k)),
                 ", another shard's entry says ", briefJson(it->second->at(k)));
      have[name] = e.at("full_shape").get<Shape>();
    }
  for (const auto &[name, shape] : want) {
    auto it = have.find(name);
    if (it == have.end())
      fail("checkpoint ", ckpt, " does not match the plan (another model?): "
           "it has no tensor '", name, "' ", shapeStr(shape));
    if (it->second != shape)
      fail("checkpoint ", ckpt, " does not match the plan: tensor '", name,
           "' is ", shapeStr(it->second), ", the plan's is ", shapeStr(shape));
  }
  for (const auto &[name, shape] : have)
    if (!want.count(name))
      fail("checkpoint ", ckpt, " does not match the plan (another model?): "
           "tensor '", name, "' ", shapeStr(shape), " is not in the plan");

  // The data position: the loader's order is a function of (seed, shuffle,
  // stream), its position of step x samples per step.
  const json &data = man.data;
  auto mismatch = [&](const char *what, const std::string &was,
                      const std::string &is) {
    fail("checkpoint ", ckpt, ": ", what, " was ", was, ", this run has ", is,
         " (the data position would not continue)");
  };
  if (data["seed"].get<uint64_t>() != expect.seed)
    mismatch("--seed", std::to_string(data["seed"].get<uint64_t>()),
             std::to_string(expect.seed));
  if (data["shuffle"].get<bool>() != expect.shuffle)
    mismatch("shuffling", data["shuffle"].get<bool>() ? "on" : "off (--no-shuffle)",
             expect.shuffle ? "on" : "off (--no-shuffle)");
  // A rank that reads no data (a middle pipeline stage) has no stream to
  // compare; the stages that read it check it.
  if (expect.dataTokens >= 0 &&
      data["tokens"].get<int64_t>() != expect.dataTokens)
    mismatch("the token stream's length",
             std::to_string(data["tokens"].get<int64_t>()),
             std::to_string(expect.dataTokens));
  if (data["samples_per_step"].get<int64_t>() != samplesPerStep(plan))
    mismatch("the global batch (samples per step = dp x microbatches x "
             "micro-batch size)",
             std::to_string(data["samples_per_step"].get<int64_t>()),
             std::to_string(samplesPerStep(plan)));

  // Same layout and this rank's shard holds exactly its values: read it
  // alone. Otherwise reshard through the full named tensors.
  const Shard *own = nullptr;
  if (man.world == plan.worldSize && man.tp == plan.tp && man.pp == plan.pp &&
      man.dp == plan.dp)
    for (const Shard &s : man.shards)
      if (s.rank == prog.rank)
        own = &s;
  if (own) {
    json mine = tensorsOf(plan, prog);
    std::set<std::pair<std::string, Shape>> a, b;
    for (const json &e : mine)
      a.insert({e["name"].get<std::string>(), e["shape"].get<Shape>()});
    for (const json &e : own->tensors)
      b.insert({e.at("name").get<std::string>(), e.at("shape").get<Shape>()});
    if (a != b)
      own = nullptr;
  }
  if (own)
    exec.loadState(readShard(ckpt, *own, m), true, own->what);
  else
    exec.loadState(assembleFull(ckpt, man.shards, m), false,
                   "checkpoint " + ckpt);
  if (exec.lossScaleMode() != "none" &&
      man.lossScale["mode"].get<std::string>() == exec.lossScaleMode())
    exec.setLossScaleState({man.lossScale["scale"].get<double>(),
                            man.lossScale["good_steps"].get<int64_t>()});
  exec.setStepsDone(step);
  if (lineage) {
    *lineage = man.ancestors;
    lineage->push_back({man.runId, step});
  }
  return step;
}

int64_t mapp::rt::loadCheckpoint(Executor &exec, const std::string &ckpt,
                                 const CheckpointMeta &expect,
                                 std::vector<LineageLink> *lineage) {
  // A manifest entry of the wrong JSON type surfaces wherever it is read;
  // the message names the manifest either way (found by mapp-fuzz-safetensors).
  try {
    return loadCheckpointFrom(exec, ckpt, expect, lineage);
  } catch (const json::exception &e) {
    fail(ckpt, "/", kManifest, ": malformed manifest (", e.what(), ")");
  }
}

FolderOwner mapp::rt::ckpt::ownerOfCheckpoint(const std::string &folder) {
  FolderOwner o;
  o.step = stepOfFolder(fs::path(folder).filename().string());
  const std::string mpath = folder + "/" + kManifest;
  std::error_code ec;
  if (!fs::exists(mpath, ec)) {
    o.problem = "no manifest.json";
    return o;
  }
  try {
    std::vector<uint8_t> raw = readBytes(mpath, mpath);
    json m = json::parse(raw.begin(), raw.end());
    if (!m.is_object() || m.value("version", json()) != kFormatVersion) {
      o.problem = "not a sealed manifest of format version " +
                  std::to_string(kFormatVersion);
      return o;
    }
    const json &seal = m.at("seal");
    if (!seal.is_object() || seal.value("crc32", json()) != sealOf(m)) {
      o.problem = "its manifest's seal does not match";
      return o;
    }
    const json &id = m.at("run").at("id");
    const json &step = m.at("step");
    if (!id.is_string() || !isHex(id.get<std::string>(), 16) ||
        !step.is_number_integer() || step.get<int64_t>() != o.step) {
      o.problem = "its manifest names no run or another step";
      return o;
    }
    o.runId = id.get<std::string>();
    o.known = true;
  } catch (const std::exception &) {
    o.problem = "unreadable manifest";
  }
  return o;
}
