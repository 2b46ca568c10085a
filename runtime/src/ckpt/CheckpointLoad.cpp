//===- CheckpointLoad.cpp - load a checkpoint into an Executor ------------===//
//
// The same layout loads each rank's own shard; another tp/pp/dp layout
// assembles full tensors from every shard and reshards them.
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

namespace {

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
