//===- Checkpoint.cpp - sharded checkpoints: save, find, verify, load -----===//
//
// Format: docs/checkpoints.md. The manifest is built by rank 0 from the plan
// (every rank's program is in it), so it describes each shard exactly; the
// ranks only send rank 0 their shard's size and CRC-32.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Shard.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

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
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;
constexpr const char *kManifest = "manifest.json";
// Above the pipeline (plan tags) and gatherParams (1 << 29) tag ranges.
constexpr int64_t kCrcTag = int64_t(1) << 30;

std::string stepFolderName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string shardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

/// N of a complete step folder's name "step-NNNNNNNN", -1 otherwise.
int64_t stepOfFolder(const std::string &name) {
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

uint32_t crcOf(const uint8_t *p, size_t n) {
  uLong c = crc32_z(0L, Z_NULL, 0);
  return static_cast<uint32_t>(crc32_z(c, p, n));
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
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
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(what, ": missing (cannot open '", path, "')");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
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

std::string mapp::rt::saveCheckpoint(Executor &exec, const std::string &dir,
                                     const CheckpointMeta &meta, int keep) {
  const Plan &plan = exec.plan();
  Communicator &comm = exec.comm();
  const int rank = comm.rank(), world = plan.worldSize;
  const int64_t step = exec.stepsDone();
  const std::string final = dir + "/" + stepFolderName(step);
  const std::string tmp = final + ".tmp";
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      fail("--save-dir: cannot create '", dir, "': ", ec.message());
    // Leftovers of a save that was killed: never complete, never read.
    for (const auto &e : fs::directory_iterator(dir, ec))
      if (e.is_directory() && e.path().extension() == ".tmp")
        fs::remove_all(e.path(), ec);
    fs::create_directory(tmp, ec);
    if (ec)
      fail("--save-dir: cannot create '", tmp, "': ", ec.message());
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
    fail("refusing to checkpoint step ", step, ": ",
         bad.empty() ? std::string("another rank's state")
                     : "tensor '" + bad + "' (rank " + std::to_string(rank) + ")",
         " holds non-finite values (the previous checkpoint is kept)");
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
            {"shards", shards}};
  std::string text = m.dump(1);
  writeFileAtomic(tmp + "/" + kManifest, text.data(), text.size());
  fsyncDir(tmp);

  std::error_code ec;
  std::string old;
  if (fs::exists(final)) { // re-saving a step (resumed from an older one)
    old = final + ".old.tmp";
    fs::remove_all(old, ec);
    fs::rename(final, old, ec);
    if (ec)
      fail("--save-dir: cannot replace '", final, "': ", ec.message());
  }
  fs::rename(tmp, final, ec);
  if (ec)
    fail("--save-dir: cannot rename '", tmp, "' to '", final, "': ",
         ec.message());
  fsyncDir(dir);
  if (!old.empty())
    fs::remove_all(old, ec);

  if (keep > 0) {
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const auto &e : fs::directory_iterator(dir, ec)) {
      int64_t n = stepOfFolder(e.path().filename().string());
      if (n >= 0 && e.is_directory())
        steps.emplace_back(n, e.path());
    }
    std::sort(steps.rbegin(), steps.rend());
    for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i)
      fs::remove_all(steps[i].second, ec);
  }
  comm.barrier();
  return final;
}

std::string mapp::rt::findCheckpoint(const std::string &path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifest, ec))
    return path;
  if (!fs::is_directory(path, ec))
    fail("--resume: '", path, "' is not a folder");
  int64_t best = -1;
  std::string found;
  for (const auto &e : fs::directory_iterator(path, ec)) {
    int64_t n = stepOfFolder(e.path().filename().string());
    if (n > best && fs::exists(e.path() / kManifest, ec)) {
      best = n;
      found = e.path().string();
    }
  }
  if (found.empty())
    fail("--resume: no checkpoint in '", path,
         "' (no manifest.json there nor in a step-NNNNNNNN folder)");
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

/// Reads and checks one shard against its manifest entry.
Safetensors readShard(const std::string &ckpt, const Shard &s) {
  std::vector<uint8_t> bytes = readBytes(ckpt + "/" + s.file, s.what);
  if (bytes.size() != s.bytes)
    fail(s.what, ": ", bytes.size(), " bytes, the manifest says ", s.bytes,
         bytes.size() < s.bytes ? " (truncated)" : "");
  std::string crc = hex32(crcOf(bytes.data(), bytes.size()));
  if (crc != s.crc)
    fail(s.what, ": checksum mismatch (CRC-32 ", crc, ", the manifest says ",
         s.crc, "): the file is corrupt");
  Safetensors st = parseSafetensors(bytes, s.what);
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
                         const std::vector<Shard> &shards) {
  struct Piece {
    Shape shape;
    std::vector<float> data;
  };
  std::map<std::string, std::map<int, Piece>> pieces; // name -> idx -> piece
  std::map<std::string, json> entryOf;
  for (const Shard &s : shards) {
    Safetensors st = readShard(ckpt, s);
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

/// Every number of a manifest is an integer except loss_scale's "scale":
/// nlohmann casts a float to the integer a field is read as, which out of
/// range is undefined behaviour and in range a silent truncation (found by
/// mapp-fuzz-safetensors under UBSan).
static void requireIntegers(const json &j, const std::string &mpath,
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

static int64_t loadCheckpointFrom(Executor &exec, const std::string &ckpt,
                                  const CheckpointMeta &expect) {
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
  requireIntegers(m, mpath, "");
  std::vector<Shard> shards;
  int64_t step = 0, world = 0, tp = 0, pp = 0, dp = 0;
  json data;
  try {
    if (m.at("format") != "mapp-checkpoint" || m.at("version") != kFormatVersion)
      fail(mpath, ": not a mapp checkpoint of format version ", kFormatVersion);
    step = m.at("step").get<int64_t>();
    const json &l = m.at("layout");
    world = l.at("world").get<int64_t>();
    tp = l.at("tp").get<int64_t>();
    pp = l.at("pp").get<int64_t>();
    dp = l.at("dp").get<int64_t>();
    data = m.at("data");
    for (const json &s : m.at("shards")) {
      Shard sh;
      sh.rank = s.at("rank").get<int>();
      sh.file = s.at("file").get<std::string>();
      if (sh.file.find('/') != std::string::npos || sh.file.empty() ||
          sh.file[0] == '.')
        fail(mpath, ": shard file name '", sh.file, "' is not a plain name");
      sh.what = "checkpoint " + ckpt + ": shard " + sh.file;
      sh.bytes = s.at("bytes").get<uint64_t>();
      sh.crc = s.at("crc32").get<std::string>();
      sh.tensors = s.at("tensors");
      shards.push_back(std::move(sh));
    }
  } catch (const json::exception &e) {
    fail(mpath, ": malformed manifest (", e.what(), ")");
  }
  if (static_cast<int64_t>(shards.size()) != world)
    fail(mpath, ": lists ", shards.size(), " shards for a world of ", world);
  if (step < 0)
    fail(mpath, ": negative step ", step);

  // The model: the same tensors by name and full shape.
  std::map<std::string, Shape> want = planTensors(plan), have;
  for (const Shard &s : shards)
    for (const json &e : s.tensors)
      have[e.at("name").get<std::string>()] = e.at("full_shape").get<Shape>();
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
  auto mismatch = [&](const char *what, const std::string &was,
                      const std::string &is) {
    fail("checkpoint ", ckpt, ": ", what, " was ", was, ", this run has ", is,
         " (the data position would not continue)");
  };
  if (data.value("seed", uint64_t(0)) != expect.seed)
    mismatch("--seed", std::to_string(data.value("seed", uint64_t(0))),
             std::to_string(expect.seed));
  if (data.value("shuffle", true) != expect.shuffle)
    mismatch("shuffling", data.value("shuffle", true) ? "on" : "off (--no-shuffle)",
             expect.shuffle ? "on" : "off (--no-shuffle)");
  if (data.value("tokens", int64_t(-1)) != expect.dataTokens)
    mismatch("the token stream's length",
             std::to_string(data.value("tokens", int64_t(-1))),
             std::to_string(expect.dataTokens));
  if (data.value("samples_per_step", int64_t(0)) != samplesPerStep(plan))
    mismatch("the global batch (samples per step = dp x microbatches x "
             "micro-batch size)",
             std::to_string(data.value("samples_per_step", int64_t(0))),
             std::to_string(samplesPerStep(plan)));

  // Same layout and this rank's shard holds exactly its values: read it
  // alone. Otherwise reshard through the full named tensors.
  const Shard *own = nullptr;
  if (world == plan.worldSize && tp == plan.tp && pp == plan.pp && dp == plan.dp)
    for (const Shard &s : shards)
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
    exec.loadState(readShard(ckpt, *own), true, own->what);
  else
    exec.loadState(assembleFull(ckpt, shards), false, "checkpoint " + ckpt);
  if (m.contains("loss_scale") && exec.lossScaleMode() != "none") {
    const json &ls = m["loss_scale"];
    if (ls.value("mode", std::string("none")) == exec.lossScaleMode())
      exec.setLossScaleState({ls.value("scale", 1.0),
                              ls.value("good_steps", int64_t(0))});
  }
  exec.setStepsDone(step);
  return step;
}

int64_t mapp::rt::loadCheckpoint(Executor &exec, const std::string &ckpt,
                                 const CheckpointMeta &expect) {
  // A manifest entry of the wrong JSON type surfaces wherever it is read;
  // the message names the manifest either way (found by mapp-fuzz-safetensors).
  try {
    return loadCheckpointFrom(exec, ckpt, expect);
  } catch (const json::exception &e) {
    fail(ckpt, "/", kManifest, ": malformed manifest (", e.what(), ")");
  }
}
