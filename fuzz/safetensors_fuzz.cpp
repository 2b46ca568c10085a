//===- safetensors_fuzz.cpp - fuzz --weights and --resume readers ---------===//
//
//   mapp-fuzz-safetensors [--time S] [--iters N] [--seed X] [--plan P.mplan]
//                         [--work DIR] [common options] [SEED...]
//   mapp-fuzz-safetensors --repro FILE...
//
// Two kinds of input, told apart by their first bytes:
//   * a safetensors file, run as mapp-run --weights runs it
//     (runtime/src/run/RunIO.cpp readWeights): parseSafetensors, checkFinite,
//     CheckpointNaming::toMapp for the plan (HF names detected), then
//     Executor::loadParams. An accepted file must survive
//     serialize -> parse unchanged (else: abort, a silent wrong answer);
//   * a bundle ("#FILE manifest.json ..." + "#FILE rank-00000.safetensors
//     ..."), a checkpoint folder as --resume reads it: loadCheckpoint.
//
// Seeds come from the real writers: Executor::saveParams of the plan's
// initial weights (mapp names), mappToHf of them where the plan is a GPT or
// LLaMA, and saveCheckpoint after one step. Mutations: bytes; the JSON
// header's values (dtype names, shapes, data_offsets, boundary numbers,
// duplicated or dropped keys) with the length prefix fixed up; for
// checkpoints the manifest's values, or the shard's bytes with the
// manifest's size and CRC-32 re-computed (as a buggy writer would leave
// them), so the checks behind the checksum are reached.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "mapp/rt/Backend.h"
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/HfNames.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"

#ifdef MAPP_FUZZ_HAVE_TEST_PLANS
#include "TestPlans.h"
#endif

#include <nlohmann/json.hpp>
#include <zlib.h>

using namespace mappfuzz;
using namespace mapp::rt;
using json = nlohmann::json;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-safetensors [--time S] [--iters N] [--seed X]\n"
    "         [--plan P.mplan] [--work DIR] [--artifact-prefix P]\n"
    "         [--watchdog S] [--rss-limit-mb M] [-q] [SEED...]\n"
    "       mapp-fuzz-safetensors [--plan P.mplan] --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;
const char *kManifest = "manifest.json";
const char *kShard = "rank-00000.safetensors";

// ---- JSON-aware edits --------------------------------------------------------

const char *kValues[] = {
    "0", "1", "-1", "2", "7", "8", "4294967295", "4294967296",
    "9223372036854775807", "18446744073709551615", "-9223372036854775808",
    "1e308", "1.5", "null", "true", "\"\"", "[]", "{}", "[0]", "[0,0]",
    "[1,0]", "[0,4]", "[4,0]", "[0,18446744073709551615]", "[2,3]",
    "[1048576,1048576]", "[-1,4]", "\"F32\"", "\"BF16\"", "\"F16\"",
    "\"I32\"", "\"I64\"", "\"F64\"", "\"U8\"", "\"mapp-checkpoint\"",
    "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"};

/// Spans of JSON values after ':' or inside arrays (numbers, strings,
/// short arrays): where a replacement keeps the text mostly JSON.
std::vector<std::pair<size_t, size_t>> valueSpans(const std::string &s) {
  std::vector<std::pair<size_t, size_t>> v;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != ':' && s[i] != '[' && s[i] != ',')
      continue;
    size_t b = i + 1, e = jsonValueEnd(s, b, ",}]{[");
    if (e > b && e <= s.size())
      v.push_back({b, e});
  }
  return v;
}

void mutateJsonText(Rng &r, std::string &s) {
  auto spans = valueSpans(s);
  int n = 1 + static_cast<int>(r.below(3));
  for (int k = 0; k < n; ++k) {
    switch (r.below(5)) {
    case 0:
    case 1: { // replace a value
      if (spans.empty())
        break;
      auto [b, e] = r.pick(spans);
      if (e > s.size())
        break;
      s = s.substr(0, b) + kValues[r.below(sizeof kValues / sizeof *kValues)] +
          s.substr(e);
      spans = valueSpans(s);
      break;
    }
    case 2: { // a number a little off
      if (spans.empty())
        break;
      auto [b, e] = r.pick(spans);
      if (e > s.size())
        break;
      char *end;
      long long x = std::strtoll(s.c_str() + b, &end, 10);
      if (end == s.c_str() + b)
        break;
      // Wrapping, not signed overflow (the mutator itself runs under UBSan).
      x = static_cast<long long>(static_cast<unsigned long long>(x) +
                                 r.below(17) - 8);
      s = s.substr(0, b) + std::to_string(x) + s.substr(e);
      spans = valueSpans(s);
      break;
    }
    case 3: { // duplicate a span elsewhere (keys, entries)
      if (spans.size() < 2)
        break;
      auto [b, e] = r.pick(spans);
      auto [b2, e2] = r.pick(spans);
      if (e > s.size() || e2 > s.size())
        break;
      s = s.substr(0, b2) + s.substr(b, e - b) + s.substr(e2);
      spans = valueSpans(s);
      break;
    }
    case 4: { // bytes
      Bytes x(s.begin(), s.end());
      mutateBytes(r, x, {}, kMaxLen);
      s.assign(x.begin(), x.end());
      spans = valueSpans(s);
      break;
    }
    }
  }
}

/// A safetensors image's header edited as text, the length prefix fixed.
void mutateHeader(Rng &r, Bytes &b) {
  if (b.size() < 8)
    return mutateBytes(r, b, {}, kMaxLen);
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  if (n > b.size() - 8)
    return mutateBytes(r, b, {}, kMaxLen);
  std::string h(b.begin() + 8, b.begin() + 8 + n);
  Bytes data(b.begin() + 8 + n, b.end());
  mutateJsonText(r, h);
  if (r.chance(20) && !data.empty())
    mutateBytes(r, data, {}, kMaxLen);
  uint64_t m = h.size();
  Bytes out(8);
  std::memcpy(out.data(), &m, 8);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  b.swap(out);
}

/// The manifest's size and CRC-32 of the shard made to match the shard, and
/// the manifest resealed, so the checks behind both are reached
/// (mapp-fuzz-manifest fuzzes the seal itself).
void refreshManifest(FileSet &s) {
  File *m = fileNamed(s, kManifest), *sh = fileNamed(s, kShard);
  if (!m || !sh)
    return;
  try {
    json j = json::parse(m->data.begin(), m->data.end());
    for (json &e : j.at("shards")) {
      e["bytes"] = sh->data.size();
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08lx",
                    crc32(0L, sh->data.data(),
                          static_cast<uInt>(sh->data.size())));
      e["crc32"] = buf;
    }
    j["seal"] = {{"crc32", manifestSeal(j.dump())}};
    std::string t = j.dump(1);
    m->data.assign(t.begin(), t.end());
  } catch (const std::exception &) {
  }
}

bool isBundle(const Bytes &b) {
  return b.size() >= 6 && std::memcmp(b.data(), "#FILE ", 6) == 0;
}

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  if (!isBundle(b)) {
    if (r.chance(60))
      mutateHeader(r, b);
    else
      mutateBytes(r, b, corpus, kMaxLen);
    return;
  }
  FileSet s;
  if (!unbundle(b, s) || s.empty())
    return mutateBytes(r, b, corpus, kMaxLen);
  File *m = fileNamed(s, kManifest), *sh = fileNamed(s, kShard);
  unsigned what = static_cast<unsigned>(r.below(100));
  if (what < 45 && m) { // the manifest's values
    std::string t(m->data.begin(), m->data.end());
    mutateJsonText(r, t);
    m->data.assign(t.begin(), t.end());
  } else if (what < 85 && sh) { // the shard, then (mostly) a fresh CRC
    if (r.chance(60))
      mutateHeader(r, sh->data);
    else
      mutateBytes(r, sh->data, {}, kMaxLen);
    if (r.chance(80))
      refreshManifest(s);
  } else if (what < 92) { // a file missing or renamed
    File &f = s[r.below(s.size())];
    if (r.chance(50))
      s.erase(s.begin() + r.below(s.size()));
    else
      f.name = r.chance(50) ? "rank-00001.safetensors" : "step.tmp";
  } else { // raw bytes of the bundle's files
    File &f = s[r.below(s.size())];
    mutateBytes(r, f.data, {}, kMaxLen);
  }
  b = bundle(s);
}

// ---- running an input ----------------------------------------------------------

bool sameTensors(const Safetensors &a, const Safetensors &b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata)
    return false;
  for (const auto &[name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.dtype != t.dtype ||
        it->second.shape != t.shape || it->second.data != t.data)
      return false;
  }
  return true;
}

struct Target {
  Plan plan;
  std::unique_ptr<Backend> backend = createCpuBackend(1);
  std::unique_ptr<Communicator> comm = createComm("local");
  std::unique_ptr<Executor> exec;
  CheckpointMeta meta;
  std::string work;

  std::string run(const Bytes &b) {
    if (isBundle(b))
      return resume(b);
    return weights(b);
  }

  std::string weights(const Bytes &b) {
    Safetensors st = parseSafetensors(b, "fuzz.safetensors");
    Safetensors again =
        parseSafetensors(serializeSafetensors(st), "round trip");
    if (!sameTensors(st, again)) {
      std::fprintf(stderr, "mapp-fuzz-safetensors: WRONG: serialize(parse(x)) "
                           "does not parse back to the same tensors\n");
      std::abort();
    }
    checkFinite(st, "--weights fuzz.safetensors");
    CheckpointNaming naming;
    Safetensors mapp = naming.toMapp(std::move(st), plan, "--weights fuzz");
    exec->loadParams(mapp, "fuzz.safetensors");
    return naming.loadedHf() ? "ok: loaded (HF names)" : "ok: loaded";
  }

  std::string resume(const Bytes &b) {
    FileSet s;
    if (!unbundle(b, s))
      return "not a bundle";
    std::string dir = work + "/ckpt";
    writeSet(dir, s);
    int64_t step = loadCheckpoint(*exec, dir, meta);
    return "ok: resumed at step " + std::to_string(step);
  }
};

Bytes fileBytes(const std::string &path) {
  Bytes b;
  if (!readFile(path, b)) {
    std::fprintf(stderr, "mapp-fuzz-safetensors: cannot read '%s'\n",
                 path.c_str());
    std::exit(2);
  }
  return b;
}

/// The seeds the real writers produce for the target's plan.
void writerSeeds(Target &t, std::vector<Bytes> &out) {
  t.exec->initParams(7);
  Safetensors params = t.exec->saveParams();
  out.push_back(serializeSafetensors(params));
  try {
    out.push_back(serializeSafetensors(mappToHf(params)));
  } catch (const Error &) {
    // Not a GPT/LLaMA plan: no HF names for it.
  }
  // A checkpoint after one step: manifest + shard.
  std::string dir = t.work + "/save";
  std::string cmd = "rm -rf '" + dir + "'";
  (void)!std::system(cmd.c_str());
  Executor::BatchFn batches = [&](int64_t, int, int32_t *tok, int32_t *tgt) {
    size_t n = size_t(t.plan.microBatchSize) * size_t(t.plan.seqLength);
    for (size_t i = 0; i < n; ++i) {
      tok[i] = static_cast<int32_t>(i % t.plan.vocabSize);
      tgt[i] = static_cast<int32_t>((i + 1) % t.plan.vocabSize);
    }
  };
  t.exec->step(batches, nullptr);
  t.meta.seed = 7;
  t.meta.runId = "00c0ffee00c0ffee";
  std::string ckpt = saveCheckpoint(*t.exec, dir, t.meta, 0);
  FileSet s = {{kManifest, fileBytes(ckpt + "/" + kManifest)},
               {kShard, fileBytes(ckpt + "/" + kShard)}};
  out.push_back(bundle(s));
}

} // namespace

int main(int argc, char **argv) {
  ExtraArgs extra(argc, argv, {"--plan", "--work"});
  Options o = parseCommon(extra.argc(), extra.argv(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  Target t;
  t.work = extra.get("--work").empty() ? "mapp-fuzz-safetensors-work"
                                       : extra.get("--work");
  ::mkdir(t.work.c_str(), 0755);
  try {
    if (!extra.get("--plan").empty())
      t.plan = loadPlan(extra.get("--plan"));
    else {
#ifdef MAPP_FUZZ_HAVE_TEST_PLANS
      test::MlpOptions m;
      m.optimizer = "adamw";
      std::vector<uint8_t> b = test::mlpPlan(m).build();
      t.plan = parsePlan(b.data(), b.size());
#else
      std::fprintf(stderr, "mapp-fuzz-safetensors: needs --plan\n%s", kUsage);
      return 2;
#endif
    }
    t.exec = std::make_unique<Executor>(t.plan, *t.backend, *t.comm);
  } catch (const Error &e) {
    std::fprintf(stderr, "mapp-fuzz-safetensors: %s\n", e.what());
    return 2;
  }
  std::vector<Bytes> seeds;
  if (!o.repro) {
    writerSeeds(t, seeds);
    for (const std::string &in : o.inputs)
      if (!addSeedPath(in, seeds)) {
        std::fprintf(stderr, "mapp-fuzz-safetensors: cannot read '%s'\n",
                     in.c_str());
        return 2;
      }
  }
  return corpusLoop<Error>({"mapp-fuzz-safetensors"}, o, std::move(seeds),
                           [&](const Bytes &b) { return t.run(b); }, mutate);
}
