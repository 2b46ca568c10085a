//===- RunIO.cpp - a job's inputs and outputs, checked before step 1 ------===//
#include "RunInternal.h"

#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace mapp::rt {
namespace {

/// std::ifstream opens a directory without complaint on Linux and reading it
/// then fails (a stray exception) or yields nothing (an empty merges list
/// was silently accepted), so reject directories by name up front.
void rejectDirectory(const std::string &path, const char *what) {
  struct stat st;
  if (!path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail(what, ": '", path, "' is a directory, not a file");
}

/// A file may exist (it is not touched here) but must be a writable regular
/// file; a new one needs a writable directory.
void checkOutputFile(const std::string &path, const char *flag) {
  if (path.empty())
    return;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      fail(flag, ": '", path, "' is a directory, not a file");
    if (::access(path.c_str(), W_OK) != 0)
      fail(flag, ": cannot write '", path, "' (", std::strerror(errno), ")");
    return;
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "."
                    : slash == 0               ? "/"
                                               : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(flag, ": cannot create '", path, "': directory '", dir,
         "' does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(flag, ": cannot create '", path, "' in '", dir, "' (",
         std::strerror(errno), ")");
}

/// A directory output is created (with its parents).
void checkOutputDir(const std::string &path, const char *flag) {
  if (path.empty())
    return;
  std::string prefix;
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0 &&
        errno != EEXIST)
      fail(flag, ": cannot create directory '", prefix, "' (",
           std::strerror(errno), ")");
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(flag, ": '", path, "' is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    fail(flag, ": cannot write in '", path, "' (", std::strerror(errno), ")");
}

/// Edit distance (insertions, deletions, substitutions) of two names.
size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

} // namespace

/// --inject-nan names an op of the plan that writes an f32 output (an
/// unknown name was silently ignored); the error lists near names.
void checkInjectNan(const RunOptions &o, const Plan &plan) {
  if (o.nanStep < 0)
    return;
  std::set<std::string> names;
  bool f32Output = false, found = false;
  for (const Program &p : plan.programs)
    for (const Block &b : p.blocks)
      for (const Instr &in : b.instrs) {
        names.insert(in.name);
        if (in.name != o.nanOp || in.outputs.empty())
          continue;
        found = true;
        const Value &v = p.values[in.outputs[0]];
        f32Output |= v.type.dtype == DType::F32 && !v.storedBf16;
      }
  if (found && !f32Output)
    fail("--inject-nan: op '", o.nanOp, "' has no f32 output");
  if (found)
    return;
  std::vector<std::pair<size_t, std::string>> near;
  for (const std::string &n : names)
    if (!n.empty() && (n.find(o.nanOp) != std::string::npos ||
                       editDistance(n, o.nanOp) <= 2 + o.nanOp.size() / 4))
      near.push_back({editDistance(n, o.nanOp), n});
  std::sort(near.begin(), near.end());
  std::string list;
  for (size_t i = 0; i < near.size() && i < 8; ++i)
    list += (i ? ", '" : "'") + near[i].second + "'";
  fail("--inject-nan: the plan has no op named '", o.nanOp, "'",
       list.empty() ? std::string(" (ops are named as in the IR)")
                    : "; near: " + list);
}

/// Every output path is checked before the work starts, so that an
/// unwritable --save is not found after the last step.
void checkInputsAndOutputs(const RunOptions &o) {
  checkOutputFile(o.save, "--save");
  checkOutputFile(o.saveGrads, "--save-grads");
  checkOutputFile(o.metrics, "--metrics");
  checkOutputFile(o.dumpBatches, "--dump-batches");
  checkOutputFile(o.generateOut, "--generate-out");
  checkOutputFile(o.probeDb, "--probe-db");
  if (o.monitor != "-")
    checkOutputFile(o.monitor, "--monitor");
  checkOutputDir(o.traceDir, "--trace-dir");
  rejectDirectory(o.plan, "plan");
  rejectDirectory(o.data, "data");
  rejectDirectory(o.weights, "weights");
  if (o.tokenizer.rfind("gpt2:", 0) == 0) {
    std::string files = o.tokenizer.substr(5);
    size_t comma = files.find(',');
    rejectDirectory(files.substr(0, comma), "tokenizer vocab");
    if (comma != std::string::npos)
      rejectDirectory(files.substr(comma + 1), "tokenizer merges");
  }
}

/// --weights, refusing NaN/inf unless --allow-nonfinite-weights: a NaN
/// parameter trains to NaN without a word about where it came from.
Safetensors readWeights(const RunOptions &o, CheckpointNaming &naming,
                        const Plan &plan) {
  Safetensors st = readSafetensors(o.weights);
  if (!o.allowNonfiniteWeights)
    checkFinite(st, "--weights " + o.weights);
  return naming.toMapp(std::move(st), plan, "--weights " + o.weights);
}

std::shared_ptr<const TokenStream> readTokens(const RunOptions &o) {
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer.empty())
    tok = createTokenizer(o.tokenizer);
  return openTokens(o.data, o.dataFormat, tok.get());
}

BatchDump::BatchDump(const std::string &path, bool append)
    : out_(path, append ? std::ios::app : std::ios::out) {
  if (!out_)
    fail("cannot write '", path, "'");
}

void BatchDump::write(int64_t step, int mb, int dpRank, int mbs, int t,
                      const int32_t *tok, const int32_t *tgt) {
  auto rows = [&](const int32_t *p) {
    nlohmann::json r = nlohmann::json::array();
    for (int b = 0; b < mbs; ++b)
      r.push_back(std::vector<int32_t>(p + b * t, p + (b + 1) * t));
    return r;
  };
  nlohmann::json j = {{"step", step},
                      {"microbatch", mb},
                      {"dp_rank", dpRank},
                      {"tokens", rows(tok)},
                      {"targets", rows(tgt)}};
  out_ << j.dump() << "\n";
}

} // namespace mapp::rt
