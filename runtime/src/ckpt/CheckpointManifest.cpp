//===- CheckpointManifest.cpp - a checkpoint's manifest and shards, read --===//
//
// Every field of a manifest is validated (docs/checkpoints.md): an edited
// step, layout or shard entry would resume silently into wrong state. Each
// error names the field, and where the shards tell, which edit it was.
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

} // namespace

std::string mapp::rt::ckpt::briefJson(const json &v) {
  std::string t = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

/// Seal, then every field: the format's reference is docs/checkpoints.md.
Manifest mapp::rt::ckpt::readManifest(const json &m, const std::string &ckpt,
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
Safetensors mapp::rt::ckpt::readShard(const std::string &ckpt, const Shard &s,
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
