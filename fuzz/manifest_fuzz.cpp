//===- manifest_fuzz.cpp - fuzz the sealed checkpoint manifest ------------===//
//
//   mapp-fuzz-manifest [--time S] [--iters N] [--seed X] [--work DIR]
//                      [common options] [SEED...]
//   mapp-fuzz-manifest --repro FILE...
//
// An input is a checkpoint folder as a bundle ("#FILE manifest.json ...",
// "#FILE rank-0000R.safetensors ..."), loaded as mapp-run --resume loads it
// (loadCheckpoint) into a one-rank MLP plan: a one-rank checkpoint takes the
// same-layout path, a tp=2 one the reshard path (every shard read). Seeds:
// saveCheckpoint after one step of the one-rank plan and of the tp=2 plan
// (two rank threads).
//
// Mutations, each either leaving the seal as it was or recomputing it:
// manifest text edits; structured edits of the parsed manifest (a leaf set
// to a boundary value, nudged, deleted, two shards' fields swapped, an
// unknown field added); a step edited with the fields that follow it; shard
// bytes or headers edited (size and CRC-32 refreshed or not); shard files
// swapped, dropped or renamed.
//
// Oracles (a violation aborts and writes the input as an artifact):
//   * a mutation that changed a sealed manifest's fields without recomputing
//     the seal is never accepted;
//   * an accepted manifest's seal matches its fields (computed here with
//     zlib, independently of the runtime's code);
//   * an accepted checkpoint agrees with its shards' own metadata: step,
//     rank (shard i is rank i), world/tp/pp/dp and run id;
//   * the step loadCheckpoint returns is the manifest's, and its layout
//     numbers are positive.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "mapp/rt/Backend.h"
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"

#include "TestPlans.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <thread>

using namespace mappfuzz;
using namespace mapp::rt;
using json = nlohmann::json;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-manifest [--time S] [--iters N] [--seed X] [--work DIR]\n"
    "         [--artifact-prefix P] [--watchdog S] [--rss-limit-mb M] [-q]\n"
    "         [SEED...]\n"
    "       mapp-fuzz-manifest --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;
const char *kManifest = "manifest.json";
const char *kRunId = "00c0ffee00c0ffee";

// ---- the independent seal ----------------------------------------------------

/// The fields a seal covers, as text: compact, keys sorted, no "seal".
std::string bodyOf(const json &m) {
  json body = m;
  body.erase("seal");
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// zlib's CRC-32 of the body, 8 hex digits (docs/checkpoints.md).
std::string sealOf(const json &m) {
  std::string t = bodyOf(m);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08lx",
                crc32(0L, reinterpret_cast<const Bytef *>(t.data()),
                      static_cast<uInt>(t.size())));
  return buf;
}

bool sealHolds(const json &m) {
  return m.is_object() && m.contains("seal") && m["seal"].is_object() &&
         m["seal"].value("crc32", json()) == sealOf(m);
}

json parseManifest(const FileSet &s) {
  for (const File &f : s)
    if (f.name == kManifest)
      return json::parse(f.data.begin(), f.data.end(), nullptr, false);
  return json(json::value_t::discarded);
}

void storeManifest(FileSet &s, const json &m) {
  std::string t = m.dump(1, ' ', false, json::error_handler_t::replace);
  if (File *f = fileNamed(s, kManifest))
    f->data.assign(t.begin(), t.end());
}

// ---- mutations ---------------------------------------------------------------

/// What the last mutation did, for the refusal oracle: a sealed manifest
/// whose fields changed while the seal was left alone must be refused.
struct LastMutation {
  bool active = false;
  bool mustRefuse = false;
  std::string what;
} gLast;

const char *kValues[] = {
    "0", "1", "-1", "2", "3", "99999999", "4294967296", "9223372036854775807",
    "18446744073709551615", "-9223372036854775808", "1e308", "1.5", "null",
    "true", "false", "\"\"", "[]", "{}", "[0]", "[0,0]", "[1,0]", "[2,3]",
    "[-1,4]", "\"F32\"", "\"sgd\"", "\"adamw\"", "\"tp\"", "\"dp\"",
    "\"rank-00000.safetensors\"", "\"rank-00001.safetensors\"",
    "\"../rank-00000.safetensors\"", "\"00000000\"", "\"0123456789abcdef\"",
    "\"mapp-checkpoint\"", "{\"run\":\"0123456789abcdef\",\"step\":0}"};

/// Every leaf (and container) of `j` as JSON pointers.
void pointersOf(const json &j, const json::json_pointer &at,
                std::vector<json::json_pointer> &out) {
  out.push_back(at);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      pointersOf(it.value(), at / it.key(), out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i)
      pointersOf(j[i], at / i, out);
}

void editStructure(Rng &r, json &m) {
  std::vector<json::json_pointer> ptrs;
  pointersOf(m, json::json_pointer(), ptrs);
  if (ptrs.size() < 2)
    return;
  const json::json_pointer p = ptrs[1 + r.below(ptrs.size() - 1)];
  switch (r.below(7)) {
  case 0:
  case 1: // a boundary value
    m[p] = json::parse(kValues[r.below(sizeof kValues / sizeof *kValues)]);
    break;
  case 2: // a number nudged
    if (m[p].is_number_integer())
      m[p] = static_cast<int64_t>(static_cast<uint64_t>(m[p].get<int64_t>()) +
                                  r.below(9) - 4);
    else
      m[p] = interestingInt(r);
    break;
  case 3: { // deleted
    json &parent = m[p.parent_pointer()];
    if (parent.is_object())
      parent.erase(p.back());
    else if (parent.is_array() && !parent.empty())
      parent.erase(parent.begin() + static_cast<long>(r.below(parent.size())));
    break;
  }
  case 4: { // the same field of two shards swapped (rank, file, crc, coords)
    if (!m.contains("shards") || !m["shards"].is_array() || m["shards"].size() < 2)
      break;
    static const char *keys[] = {"rank", "file", "bytes", "crc32", "coords",
                                 "tensors"};
    const char *k = keys[r.below(6)];
    json &a = m["shards"][0], &b = m["shards"][1];
    if (a.is_object() && b.is_object() && a.contains(k) && b.contains(k))
      std::swap(a[k], b[k]);
    break;
  }
  case 5: // an unknown field
    if (m[p.parent_pointer()].is_object())
      m[p.parent_pointer()]["extra"] = interestingInt(r);
    break;
  case 6: { // the step, with the fields that follow it
    int64_t n = r.chance(50) ? interestingInt(r) : static_cast<int64_t>(r.below(8));
    m["step"] = n;
    if (m.contains("rng") && m["rng"].is_object())
      m["rng"]["step"] = n;
    if (m.contains("data") && m["data"].is_object() &&
        m["data"].contains("samples_per_step") &&
        m["data"]["samples_per_step"].is_number_integer())
      m["data"]["samples_consumed"] = static_cast<int64_t>(
          static_cast<uint64_t>(n) *
          static_cast<uint64_t>(m["data"]["samples_per_step"].get<int64_t>()));
    break;
  }
  }
}

/// Text edits of the manifest (may leave it not JSON).
void editText(Rng &r, Bytes &b) {
  std::string s(b.begin(), b.end());
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == ':' || s[i] == '[' || s[i] == ',') {
      size_t v = i + 1;
      while (v < s.size() && s[v] == ' ')
        ++v;
      size_t e = jsonValueEnd(s, v, ",}]{[\n");
      if (e > v && e <= s.size())
        spans.push_back({v, e});
    }
  if (!spans.empty() && r.chance(70)) {
    auto [v, e] = r.pick(spans);
    s = s.substr(0, v) + kValues[r.below(sizeof kValues / sizeof *kValues)] +
        s.substr(e);
    b.assign(s.begin(), s.end());
  } else {
    mutateBytes(r, b, {}, kMaxLen);
  }
}

std::vector<File *> shardsOf(FileSet &s) {
  std::vector<File *> out;
  for (File &f : s)
    if (f.name != kManifest)
      out.push_back(&f);
  return out;
}

/// The manifest's sizes and CRC-32s made to match the shard files.
void refreshSums(FileSet &s, json &m) {
  if (!m.is_object() || !m.contains("shards") || !m["shards"].is_array())
    return;
  for (json &e : m["shards"]) {
    if (!e.is_object() || !e.contains("file") || !e["file"].is_string())
      continue;
    File *f = fileNamed(s, e["file"].get<std::string>());
    if (!f)
      continue;
    e["bytes"] = f->data.size();
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08lx",
                  crc32(0L, f->data.data(), static_cast<uInt>(f->data.size())));
    e["crc32"] = buf;
  }
}

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  gLast = {};
  FileSet s;
  if (!unbundle(b, s) || s.empty()) {
    mutateBytes(r, b, corpus, kMaxLen);
    return;
  }
  json before = parseManifest(s);
  bool wasSealed = sealHolds(before);
  bool reseal = r.chance(50);
  unsigned what = static_cast<unsigned>(r.below(100));
  json m = before;
  if (what < 55 && m.is_object()) { // structured edits
    int n = 1 + static_cast<int>(r.below(3));
    for (int k = 0; k < n; ++k)
      editStructure(r, m);
    gLast.what = "fields";
  } else if (what < 70) { // the manifest's text
    if (File *f = fileNamed(s, kManifest))
      editText(r, f->data);
    m = parseManifest(s);
    gLast.what = "text";
  } else if (what < 90) { // a shard's bytes, sums refreshed (mostly)
    std::vector<File *> sh = shardsOf(s);
    if (!sh.empty())
      mutateBytes(r, sh[r.below(sh.size())]->data, {}, kMaxLen);
    if (r.chance(80))
      refreshSums(s, m);
    gLast.what = "shard";
  } else { // shard files swapped, dropped or renamed
    std::vector<File *> sh = shardsOf(s);
    if (sh.size() >= 2 && r.chance(50))
      std::swap(sh[0]->data, sh[1]->data);
    else if (!s.empty() && r.chance(50))
      s.erase(s.begin() + static_cast<long>(r.below(s.size())));
    else if (!sh.empty())
      sh[r.below(sh.size())]->name = r.chance(50) ? "rank-00002.safetensors"
                                                  : "step.tmp";
    if (r.chance(70))
      refreshSums(s, m);
    gLast.what = "files";
  }
  if (m.is_object()) {
    if (reseal)
      m["seal"] = {{"crc32", sealOf(m)}};
    if (gLast.what != "text" || reseal)
      storeManifest(s, m);
  }
  json after = parseManifest(s);
  gLast.active = true;
  gLast.mustRefuse = wasSealed && !reseal && after.is_object() &&
                     bodyOf(after) != bodyOf(before) &&
                     after.value("seal", json()) == before["seal"];
  b = bundle(s);
}

// ---- running an input ----------------------------------------------------------

[[noreturn]] void wrong(const std::string &why) {
  std::fprintf(stderr, "mapp-fuzz-manifest: WRONG: %s\n", why.c_str());
  std::abort();
}

struct Target {
  Plan plan;
  std::unique_ptr<Backend> backend = createCpuBackend(1);
  std::unique_ptr<Communicator> comm = createComm("local");
  std::unique_ptr<Executor> exec;
  CheckpointMeta meta;
  std::string work;
  uint64_t collisions = 0;
  uint64_t unsealedEdits = 0; // inputs the refusal oracle applied to

  std::string run(const Bytes &b) {
    LastMutation last = gLast;
    gLast = {};
    unsealedEdits += last.active && last.mustRefuse;
    FileSet s;
    if (!unbundle(b, s))
      return "not a bundle";
    std::string dir = work + "/ckpt";
    writeSet(dir, s);
    int64_t step = loadCheckpoint(*exec, dir, meta);
    check(s, step, last);
    return "ok: resumed at step " + std::to_string(step);
  }

  /// The oracles of an accepted input.
  void check(const FileSet &s, int64_t step, const LastMutation &last) {
    try {
      checkFields(s, step, last);
    } catch (const json::exception &e) {
      wrong(std::string("accepted a manifest missing what the format "
                        "requires (") + e.what() + ")");
    }
  }

  void checkFields(const FileSet &s, int64_t step, const LastMutation &last) {
    const json m = parseManifest(s);
    if (!m.is_object())
      wrong("accepted a manifest that is not a JSON object");
    if (!sealHolds(m)) {
      if (last.active && last.mustRefuse)
        wrong("accepted a manifest whose fields a mutation (" + last.what +
              ") changed without recomputing the seal");
      wrong("accepted a manifest whose seal does not match its fields");
    }
    if (last.active && last.mustRefuse) {
      ++collisions; // the edit kept the CRC-32: 1 in 2^32
      return;
    }
    if (m.at("step") != step)
      wrong("loadCheckpoint returned step " + std::to_string(step) +
            ", the manifest says " + m.at("step").dump());
    const json &l = m.at("layout");
    for (const char *k : {"world", "tp", "pp", "dp", "ep", "chunks"})
      if (!l.at(k).is_number_integer() || l.at(k).get<int64_t>() < 1)
        wrong(std::string("accepted layout.") + k + " = " + l.at(k).dump());
    const json &shards = m.at("shards");
    if (!shards.is_array() || shards.size() != l.at("world").get<size_t>())
      wrong("accepted a shard list that does not match the world");
    for (size_t i = 0; i < shards.size(); ++i) {
      const json &e = shards[i];
      const File *f = nullptr;
      for (const File &x : s)
        if (x.name == e.at("file"))
          f = &x;
      if (!f)
        wrong("accepted a manifest naming a shard file the folder lacks");
      Safetensors st = parseSafetensors(f->data, f->name);
      auto own = [&](const char *k) {
        auto it = st.metadata.find(k);
        return it == st.metadata.end() ? std::string("(none)") : it->second;
      };
      if (e.at("rank") != i || own("rank") != std::to_string(i) ||
          own("step") != std::to_string(step) ||
          own("run") != m.at("run").at("id").get<std::string>())
        wrong("accepted shard entry " + std::to_string(i) +
              " whose file says rank " + own("rank") + " step " + own("step"));
      for (const char *k : {"world", "tp", "pp", "dp"})
        if (own(k) != l.at(k).dump())
          wrong(std::string("accepted layout.") + k + " " + l.at(k).dump() +
                ", shard says " + own(k));
    }
  }
};

/// A checkpoint of `spec` (its world as rank threads) after one step.
FileSet saveOne(const mapp::rt::test::MultiPlanSpec &spec,
                const std::string &dir, const CheckpointMeta &meta) {
  std::vector<uint8_t> bytes = spec.build();
  Plan plan = parsePlan(bytes.data(), bytes.size());
  (void)!std::system(("rm -rf '" + dir + "'").c_str());
  std::unique_ptr<LocalWorld> world = createLocalWorld(plan.worldSize);
  std::vector<std::string> errors(plan.worldSize);
  std::string folder;
  std::vector<std::thread> threads;
  for (int r = 0; r < plan.worldSize; ++r)
    threads.emplace_back([&, r, c = world->connect(r)]() mutable {
      try {
        std::unique_ptr<Backend> be = createCpuBackend(1);
        Executor exec(plan, *be, *c);
        exec.initParams(7);
        Executor::BatchFn batches = [&](int64_t, int, int32_t *tok,
                                        int32_t *tgt) {
          size_t n = size_t(plan.microBatchSize) * size_t(plan.seqLength);
          for (size_t i = 0; i < n; ++i) {
            tok[i] = static_cast<int32_t>(i % plan.vocabSize);
            tgt[i] = static_cast<int32_t>((i + 1) % plan.vocabSize);
          }
        };
        exec.step(batches, nullptr);
        std::string f = saveCheckpoint(exec, dir, meta, 0);
        if (r == 0)
          folder = f;
      } catch (const std::exception &e) {
        errors[r] = e.what();
        world->abort(r, e.what());
      }
    });
  for (std::thread &t : threads)
    t.join();
  for (const std::string &e : errors)
    if (!e.empty()) {
      std::fprintf(stderr, "mapp-fuzz-manifest: seed: %s\n", e.c_str());
      std::exit(2);
    }
  FileSet s;
  Bytes b;
  if (!readFile(folder + "/" + kManifest, b))
    std::exit(2);
  s.push_back({kManifest, b});
  for (int r = 0; r < plan.worldSize; ++r) {
    char name[32];
    std::snprintf(name, sizeof name, "rank-%05d.safetensors", r);
    if (!readFile(folder + "/" + name, b))
      std::exit(2);
    s.push_back({name, b});
  }
  return s;
}

mapp::rt::test::MultiPlanSpec planOf(int tp) {
  mapp::rt::test::MlpOptions m;
  m.optimizer = "adamw";
  mapp::rt::test::ParallelOptions p;
  p.tp = tp;
  return mapp::rt::test::parallelMlpPlan(m, p);
}

} // namespace

int main(int argc, char **argv) {
  ExtraArgs extra(argc, argv, {"--work"});
  Options o = parseCommon(extra.argc(), extra.argv(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  Target t;
  t.work = extra.get("--work").empty() ? "mapp-fuzz-manifest-work"
                                       : extra.get("--work");
  ::mkdir(t.work.c_str(), 0755);
  t.meta.seed = 7;
  t.meta.runId = kRunId;
  try {
    std::vector<uint8_t> b = planOf(1).build();
    t.plan = parsePlan(b.data(), b.size());
    t.exec = std::make_unique<Executor>(t.plan, *t.backend, *t.comm);
  } catch (const Error &e) {
    std::fprintf(stderr, "mapp-fuzz-manifest: %s\n", e.what());
    return 2;
  }
  std::vector<Bytes> seeds;
  if (!o.repro) {
    for (int tp : {1, 2})
      seeds.push_back(
          bundle(saveOne(planOf(tp), t.work + "/save-tp" + std::to_string(tp),
                         t.meta)));
    for (const std::string &in : o.inputs)
      if (!addSeedPath(in, seeds)) {
        std::fprintf(stderr, "mapp-fuzz-manifest: cannot read '%s'\n",
                     in.c_str());
        return 2;
      }
  }
  int status = corpusLoop<Error>({"mapp-fuzz-manifest"}, o, std::move(seeds),
                                 [&](const Bytes &b) { return t.run(b); },
                                 mutate);
  if (!o.repro)
    std::printf("mapp-fuzz-manifest: %llu inputs changed a sealed manifest's "
                "fields without recomputing the seal: %llu accepted\n",
                static_cast<unsigned long long>(t.unsealedEdits),
                static_cast<unsigned long long>(t.collisions));
  if (t.collisions)
    std::printf("mapp-fuzz-manifest: %llu unsealed edits kept the CRC-32 "
                "(collisions, accepted as sealed)\n",
                static_cast<unsigned long long>(t.collisions));
  return status;
}
