//===- trace_fuzz.cpp - fuzz mapp-scan's reader, alignment and diagnosis --===//
//
//   mapp-fuzz-trace [--time S] [--iters N] [--seed X] [--work DIR]
//                   [--artifact-prefix P] [--watchdog S] [-q] [SEEDDIR...]
//   mapp-fuzz-trace --repro BUNDLE|DIR...
//
// Seeds: trace sets simulated in-process (mapp-sim's job model, several
// shapes, schedules, clock errors and faults) plus any SEEDDIR holding
// rank-*.trace.jsonl files. Each iteration mutates a set -- lines deleted,
// duplicated, swapped or borrowed from other files; JSON numbers and strings
// replaced with boundary values and other fields' values; keys dropped;
// files cut, deleted, renamed to other ranks; raw byte mutations -- writes
// it to DIR/cur/ and runs what mapp-scan runs: readTraceDir, matchEvents,
// alignClocks, diagnose, whatIf, the report JSON, the text summary, the
// Chrome trace and the HTML report.
//
// Failures are crashes, sanitizer reports and watchdog timeouts; the set is
// written as a bundle (P crash-<pid>: "#FILE name size\n" + bytes per file)
// that --repro accepts. A clean error (bad input named by file and line) is
// the expected outcome.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "mapp/scan/Report.h"
#include "mapp/scan/Sim.h"

#include <climits>
#include <cmath>
#include <dirent.h>
#include <sys/stat.h>

using namespace mappfuzz;
using namespace mapp::scan;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-trace [--time S] [--iters N] [--seed X] [--work DIR]\n"
    "                       [--artifact-prefix P] [--watchdog S] [-q]\n"
    "                       [SEEDDIR...]\n"
    "       mapp-fuzz-trace --repro BUNDLE|DIR...\n";

using Set = FileSet; // rank-*.trace.jsonl files

// Small jobs covering the shapes mapp-scan distinguishes: TP/DP collectives,
// pipeline p2p only, interleaving, one rank, faults, clock errors.
const char *kConfigs[] = {
    R"({"tp":2,"pp":2,"dp":1,"microbatches":2,"steps":2,"schedule":"1f1b",
        "layers":2,"layer_forward_us":100,"embedding_us":10,"loss_us":20,
        "optimizer_us":50,"data_us":5,"activation_bytes":65536,
        "tp_allreduce_bytes":65536,"dp_allreduce_bytes":1048576,
        "clock":{"offset_ms":50,"drift_ppm":100,"wall_error_ms":2},
        "jitter":0.03,"exit_skew_us":2,"seed":1,
        "faults":["slow-compute:rank=3,factor=1.5"]})",
    R"({"tp":1,"pp":2,"dp":2,"microbatches":4,"steps":2,"schedule":"gpipe",
        "layers":2,"layer_forward_us":80,"activation_bytes":131072,
        "dp_allreduce_bytes":1048576,"network":{"gpus_per_node":2},
        "clock":{"offset_ms":20,"drift_ppm":50,"wall_error_ms":1},
        "jitter":0.02,"seed":2,
        "faults":["link-bandwidth:src=0,dst=2,gbps=10"]})",
    R"({"tp":1,"pp":2,"dp":1,"microbatches":4,"steps":2,
        "schedule":"interleaved","chunks":2,"layers":4,
        "layer_forward_us":50,"activation_bytes":65536,
        "grad_norm_allreduce":false,"optimizer_us":20,
        "clock":{"offset_ms":5,"drift_ppm":20},"seed":3,
        "faults":["link-delay:src=1,dst=0,us=200"]})",
    R"({"tp":2,"pp":1,"dp":2,"microbatches":2,"steps":3,"layers":2,
        "layer_forward_us":60,"tp_allreduce_bytes":32768,
        "dp_allreduce_bytes":262144,"jitter":0.05,"exit_skew_us":1,
        "clock":{"offset_ms":1,"drift_ppm":10,"wall_error_ms":0.5},
        "seed":4})",
    R"({"tp":1,"pp":1,"dp":1,"microbatches":2,"steps":2,"layers":1,
        "layer_forward_us":30,"optimizer_us":10,"seed":5})",
    R"({"tp":1,"pp":4,"dp":1,"microbatches":4,"steps":1,"layers":4,
        "layer_forward_us":40,"activation_bytes":16384,
        "grad_norm_allreduce":false,"clock":{"offset_ms":30,"drift_ppm":80},
        "seed":6})",
};

bool simulate(const std::string &json, const std::string &dir, Set &out,
              std::string *err);

bool readSetDir(const std::string &dir, Set &out) {
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return false;
  std::vector<std::string> names;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("rank-", 0) == 0)
      names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (auto &n : names) {
    File f{n, {}};
    if (!readFile(dir + "/" + n, f.data))
      return false;
    out.push_back(std::move(f));
  }
  return !out.empty();
}

bool simulate(const std::string &json, const std::string &dir, Set &out,
              std::string *err) {
  SimConfig c;
  SimJob job;
  SimTimes times;
  if (!parseSimConfig(json, c, err) || !buildSimJob(c, job, err) ||
      !runSim(job, makeNetwork(c), times, err) ||
      !writeSimTraces(dir, c, job, times, err))
    return false;
  return readSetDir(dir, out);
}

// ---- mutations -------------------------------------------------------------

/// a + b, or a * f, clamped to long long (the fuzzer itself must not overflow).
long long addClamp(long long a, long long b) {
  long long r;
  if (__builtin_add_overflow(a, b, &r))
    return b > 0 ? LLONG_MAX : LLONG_MIN;
  return r;
}
long long scaleClamp(long long a, double f) {
  double r = static_cast<double>(a) * f;
  if (!(r < 9.2e18))
    return LLONG_MAX;
  if (!(r > -9.2e18))
    return LLONG_MIN;
  return static_cast<long long>(r);
}

std::vector<std::string> splitLines(const Bytes &b) {
  std::vector<std::string> lines;
  std::string cur;
  for (uint8_t c : b) {
    if (c == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else
      cur += static_cast<char>(c);
  }
  if (!cur.empty())
    lines.push_back(cur + "\x01"); // marks "no final newline"
  return lines;
}

Bytes joinLines(const std::vector<std::string> &lines) {
  Bytes b;
  for (const std::string &l : lines) {
    if (!l.empty() && l.back() == '\x01') {
      b.insert(b.end(), l.begin(), l.end() - 1);
    } else {
      b.insert(b.end(), l.begin(), l.end());
      b.push_back('\n');
    }
  }
  return b;
}

const char *kNumbers[] = {"0",
                          "-1",
                          "1",
                          "2",
                          "7",
                          "-2147483648",
                          "2147483647",
                          "2147483648",
                          "4294967296",
                          "9223372036854775807",
                          "-9223372036854775808",
                          "18446744073709551615",
                          "99999999999999999999999",
                          "1e308",
                          "-1e308",
                          "1.5",
                          "-0",
                          "0.0",
                          "1e-9",
                          "NaN",
                          "null",
                          "true",
                          "\"3\"",
                          "[]",
                          "{}",
                          "[0]",
                          "[0,0]",
                          "[1,0]",
                          "[0,1,2,3]",
                          "[-1]",
                          "[0,99]"};
const char *kStrings[] = {
    "\"header\"",   "\"group\"",      "\"footer\"",     "\"compute\"",
    "\"comm\"",     "\"memcpy\"",     "\"data\"",       "\"optimizer\"",
    "\"send\"",     "\"recv\"",       "\"all_reduce\"", "\"all_gather\"",
    "\"reduce_scatter\"", "\"all_to_all\"", "\"broadcast\"", "\"barrier\"",
    "\"tp\"",       "\"dp\"",         "\"pp\"",         "\"mp\"",
    "\"mapp-trace\"", "\"\"",         "\"\\u0000\"",    "\"fwd.attn\"",
    "\"steady\"",   "\"x\\\"y\""};
const char *kKeys[] = {"id",    "name",  "cat",     "op",       "b",
                       "e",     "step",  "mb",      "layer",    "chunk",
                       "peer",  "group", "tag",     "seq",      "bytes",
                       "type",  "rank",  "world",   "dp_size",  "pp_size",
                       "tp_size", "members", "kind", "version", "format",
                       "dropped", "events", "mono_start_ns", "wall_start_ns",
                       "stream", "dp", "pp", "tp"};

/// Spans of JSON scalar/array values after a ':' in one line.
std::vector<std::pair<size_t, size_t>> valueSpans(const std::string &l) {
  std::vector<std::pair<size_t, size_t>> v;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] != ':')
      continue;
    size_t s = i + 1, e = s;
    if (e < l.size() && l[e] == '"') {
      ++e;
      while (e < l.size() && l[e] != '"')
        e += l[e] == '\\' ? 2 : 1;
      ++e;
    } else if (e < l.size() && l[e] == '[') {
      while (e < l.size() && l[e] != ']')
        ++e;
      ++e;
    } else
      while (e < l.size() && l[e] != ',' && l[e] != '}')
        ++e;
    if (e <= l.size() && e > s)
      v.push_back({s, e});
  }
  return v;
}

void mutateLine(Rng &r, std::string &l, const std::vector<std::string> &pool) {
  auto spans = valueSpans(l);
  switch (r.below(6)) {
  case 0:
  case 1: { // replace a value
    if (spans.empty())
      break;
    auto [s, e] = r.pick(spans);
    std::string v;
    if (r.chance(50))
      v = kNumbers[r.below(sizeof(kNumbers) / sizeof(*kNumbers))];
    else if (r.chance(60))
      v = kStrings[r.below(sizeof(kStrings) / sizeof(*kStrings))];
    else { // a value from another line
      const std::string &o = r.pick(pool);
      auto os = valueSpans(o);
      if (os.empty())
        break;
      auto [a, b] = r.pick(os);
      v = o.substr(a, b - a);
    }
    l = l.substr(0, s) + v + l.substr(std::min(e, l.size()));
    break;
  }
  case 2: { // small change of a number
    if (spans.empty())
      break;
    auto [s, e] = r.pick(spans);
    std::string v = l.substr(s, e - s);
    char *end;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str())
      break;
    x = addClamp(x, static_cast<long long>(r.below(2001)) - 1000);
    l = l.substr(0, s) + std::to_string(x) + l.substr(std::min(e, l.size()));
    break;
  }
  case 3: { // drop a key
    if (spans.empty())
      break;
    auto [s, e] = r.pick(spans);
    size_t ks = l.rfind(',', s);
    if (ks == std::string::npos)
      ks = l.find('{');
    if (ks == std::string::npos || ks + 1 > s)
      break;
    std::string rest = l.substr(std::min(e, l.size()));
    l = l.substr(0, ks + 1) +
        (rest.size() && rest[0] == ',' ? rest.substr(1) : rest);
    break;
  }
  case 4: { // add or duplicate a key
    size_t close = l.rfind('}');
    if (close == std::string::npos)
      break;
    std::string k = kKeys[r.below(sizeof(kKeys) / sizeof(*kKeys))];
    std::string v = r.chance(60)
                        ? kNumbers[r.below(sizeof(kNumbers) / sizeof(*kNumbers))]
                        : kStrings[r.below(sizeof(kStrings) / sizeof(*kStrings))];
    l = l.substr(0, close) + ",\"" + k + "\":" + v + l.substr(close);
    break;
  }
  case 5: { // byte-level
    Bytes b(l.begin(), l.end());
    mutateBytes(r, b, {}, 4096);
    l.assign(b.begin(), b.end());
    break;
  }
  }
}

/// Replaces the value of "key": in a line (numbers only); false if absent.
bool setKey(std::string &l, const std::string &key, const std::string &v) {
  size_t k = l.find("\"" + key + "\":");
  if (k == std::string::npos)
    return false;
  size_t s = k + key.size() + 3, e = s;
  while (e < l.size() && l[e] != ',' && l[e] != '}')
    ++e;
  l = l.substr(0, s) + v + l.substr(e);
  return true;
}
long long getKey(const std::string &l, const std::string &key, bool *ok) {
  size_t k = l.find("\"" + key + "\":");
  *ok = k != std::string::npos;
  return *ok ? std::strtoll(l.c_str() + k + key.size() + 3, nullptr, 10) : 0;
}

/// Edits that keep every record well-formed and mostly plausible, so the
/// set gets past the reader and exercises matching, alignment, diagnosis
/// and replay: shifted or stretched times, other seq/tag/peer/step values,
/// events dropped, duplicated, reordered or copied from another rank.
void gentleMutate(Rng &r, Set &s) {
  File &f = s[r.below(s.size())];
  std::vector<std::string> lines = splitLines(f.data);
  if (lines.size() < 2)
    return;
  int n = 1 + static_cast<int>(r.below(r.chance(60) ? 2 : 12));
  for (int k = 0; k < n && lines.size() >= 2; ++k) {
    size_t i = 1 + r.below(lines.size() - 1);
    std::string &l = lines[i];
    bool isEvent = l.find("\"type\"") == std::string::npos;
    switch (r.below(9)) {
    case 0:
    case 1: { // move or stretch an event in time
      if (!isEvent)
        break;
      bool okb, oke;
      long long b = getKey(l, "b", &okb), e = getKey(l, "e", &oke);
      if (!okb || !oke)
        break;
      long long d = static_cast<long long>(r.below(2000001)) - 1000000;
      if (r.chance(50)) {
        b = addClamp(b, d);
        e = addClamp(e, d);
      } else
        e = std::max(b, addClamp(e, d));
      setKey(l, "b", std::to_string(b));
      setKey(l, "e", std::to_string(e));
      break;
    }
    case 2: { // comm fields
      static const char *keys[] = {"seq", "tag", "peer", "bytes", "group"};
      const char *key = keys[r.below(5)];
      bool ok;
      long long v = getKey(l, key, &ok);
      if (ok)
        setKey(l, key,
               std::to_string(std::max(0LL, addClamp(v, (long long)r.below(5) - 2))));
      break;
    }
    case 3: { // step / microbatch / layer / chunk
      static const char *keys[] = {"step", "mb", "layer", "chunk"};
      const char *key = keys[r.below(4)];
      bool ok;
      long long v = getKey(l, key, &ok);
      if (ok)
        setKey(l, key,
               std::to_string(std::max(-1LL, addClamp(v, (long long)r.below(3) - 1))));
      break;
    }
    case 4:
      if (isEvent)
        lines.erase(lines.begin() + i);
      break;
    case 5:
      lines.insert(lines.begin() + 1 + r.below(lines.size() - 1), l);
      break;
    case 6:
      std::swap(l, lines[1 + r.below(lines.size() - 1)]);
      break;
    case 7: { // an event from another rank
      const File &o = s[r.below(s.size())];
      std::vector<std::string> ol = splitLines(o.data);
      if (ol.size() >= 2)
        lines.insert(lines.begin() + 1 + r.below(lines.size() - 1),
                     ol[1 + r.below(ol.size() - 1)]);
      break;
    }
    case 8: { // scale all times of the file (a clock running at another rate)
      double f = 1 + (static_cast<double>(r.below(2001)) - 1000) * 1e-6;
      for (size_t j = 1; j < lines.size(); ++j) {
        bool okb, oke;
        long long b = getKey(lines[j], "b", &okb), e = getKey(lines[j], "e", &oke);
        if (okb && oke) {
          setKey(lines[j], "b", std::to_string(scaleClamp(b, f)));
          setKey(lines[j], "e", std::to_string(scaleClamp(e, f)));
        }
      }
      break;
    }
    }
  }
  f.data = joinLines(lines);
}

void mutateSet(Rng &r, Set &s, const std::vector<Set> &seeds) {
  if (s.empty())
    return;
  if (r.chance(50)) {
    gentleMutate(r, s);
    return;
  }
  int n = 1 + static_cast<int>(r.below(r.chance(70) ? 2 : 6));
  for (int k = 0; k < n && !s.empty(); ++k) {
    File &f = s[r.below(s.size())];
    unsigned what = static_cast<unsigned>(r.below(100));
    if (what < 45) { // line-level edit of one file
      std::vector<std::string> lines = splitLines(f.data);
      if (lines.empty()) {
        lines.push_back("{}");
      }
      // Lines from the same set for borrowing values.
      std::vector<std::string> pool = lines;
      const File &other = s[r.below(s.size())];
      for (auto &l : splitLines(other.data))
        pool.push_back(l);
      size_t i = r.chance(25) ? r.below(std::min<size_t>(lines.size(), 4))
                              : r.below(lines.size());
      switch (r.below(8)) {
      case 0:
      case 1:
      case 2:
      case 3:
        mutateLine(r, lines[i], pool);
        break;
      case 4:
        lines.erase(lines.begin() + i);
        break;
      case 5:
        lines.insert(lines.begin() + r.below(lines.size() + 1), lines[i]);
        break;
      case 6:
        std::swap(lines[i], lines[r.below(lines.size())]);
        break;
      case 7:
        lines.insert(lines.begin() + r.below(lines.size() + 1),
                     r.pick(pool));
        break;
      }
      f.data = joinLines(lines);
    } else if (what < 60) { // raw bytes
      std::vector<Bytes> others;
      for (const File &o : s)
        others.push_back(o.data);
      mutateBytes(r, f.data, others, 1 << 22);
    } else if (what < 68) { // cut the file
      if (!f.data.empty())
        f.data.resize(r.below(f.data.size()));
    } else if (what < 76) { // delete a rank file
      s.erase(s.begin() + r.below(s.size()));
    } else if (what < 86) { // rename: duplicate rank, other rank, odd names
      static const char *names[] = {
          "rank-0.trace.jsonl",  "rank-1.trace.jsonl",
          "rank-2.trace.jsonl",  "rank-7.trace.jsonl",
          "rank-01.trace.jsonl", "rank-99.trace.jsonl",
          "rank-2147483648.trace.jsonl",
          "rank-99999999999999999999.trace.jsonl",
          "rank-.trace.jsonl",   "rank-1.trace.json"};
      File copy = f;
      copy.name = names[r.below(sizeof(names) / sizeof(*names))];
      if (r.chance(50))
        f = copy;
      else
        s.push_back(copy);
    } else if (what < 94) { // take a file from another seed set
      const Set &o = r.pick(seeds);
      const File &g = o[r.below(o.size())];
      if (r.chance(50))
        f.data = g.data;
      else
        s.push_back(g);
    } else { // empty file or header only
      std::vector<std::string> lines = splitLines(f.data);
      f.data = r.chance(50) || lines.empty()
                   ? Bytes()
                   : joinLines({lines[0]});
    }
  }
  // Identical names would overwrite each other on disk; keep the last.
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < s.size(); ++i)
    last[s[i].name] = i;
  Set uniq;
  for (auto &[name, i] : last)
    uniq.push_back(s[i]);
  s = std::move(uniq);
}

// ---- running a set ----------------------------------------------------------

void clearDir(const std::string &dir) {
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d))
      if (e->d_name[0] != '.')
        ::unlink((dir + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  ::mkdir(dir.c_str(), 0755);
}

struct Result {
  std::string msg;
  bool read = false;
  size_t findings = 0;
};

Result analyze(Rng &r, const std::string &work, const Set &s) {
  std::string dir = work + "/cur";
  clearDir(dir);
  for (const File &f : s)
    writeFile(dir + "/" + f.name, f.data);
  Result res;
  ScanResult sr;
  ReadOptions ro;
  ro.allowTruncated = r.chance(30);
  std::string err;
  if (!readTraceDir(dir, ro, sr.trace, &err)) {
    // Paths differ per run; keep the part after the directory.
    size_t at = err.find(dir);
    res.msg = at == std::string::npos ? err : err.substr(at + dir.size());
    return res;
  }
  res.read = true;
  sr.matches = matchEvents(sr.trace);
  AlignOptions ao;
  ao.enabled = !r.chance(10);
  ao.fitDrift = !r.chance(20);
  sr.align = alignClocks(sr.trace, sr.matches, ao);
  DiagnoseOptions dopt;
  if (r.chance(20)) {
    dopt.rankThreshold = r.chance(50) ? 0.01 : 5.0;
    dopt.linkThreshold = r.chance(50) ? 0.01 : 0.99;
  }
  sr.diag = diagnose(sr.trace, sr.matches, dopt);
  res.findings = sr.diag.findings.size();
  if (r.chance(40)) {
    if (whatIf(sr.trace, sr.matches, sr.diag, sr.whatIf, &err))
      sr.haveWhatIf = true;
    else
      res.msg = "what-if: " + err;
  }
  (void)reportJson(sr).dump(1);
  (void)textSummary(sr);
  if (r.chance(50)) {
    ChromeOptions co;
    if (r.chance(30)) {
      co.stepBegin = static_cast<int>(r.below(3)) - 1;
      co.stepEnd = static_cast<int>(r.below(4)) - 1;
    }
    if (r.chance(20))
      co.ranks = {0, static_cast<int>(r.below(8))};
    if (r.chance(20))
      co.maxMb = r.chance(50) ? 1e-6 : 0.05;
    std::string note;
    if (!writeChromeTrace(sr, co, work + "/merged.json", &note, &err))
      res.msg = "chrome: " + err;
  }
  if (r.chance(20) && !writeHtmlReport(sr, work + "/report.html", &err))
    res.msg = "html: " + err;
  if (res.msg.empty()) {
    // Shape of a successful analysis, so the corpus keeps varied valid sets.
    std::string kinds;
    for (const Finding &f : sr.diag.findings)
      if (kinds.find(f.kind) == std::string::npos)
        kinds += f.kind + " ";
    res.msg = "ok: findings " + kinds + "| align " + sr.align.method +
              (sr.align.components > 1 ? " split" : "") +
              (sr.align.violationsAfter ? " violations" : "") +
              (sr.matches.unmatchedSends + sr.matches.unmatchedRecvs
                   ? " unmatched-p2p"
                   : "") +
              (sr.matches.incompleteColls ? " incomplete-colls" : "") +
              (sr.trace.warnings.empty() ? "" : " warnings") +
              (sr.haveWhatIf ? " what-if" : "");
  }
  return res;
}

} // namespace

int main(int argc, char **argv) {
  // --work is specific to this driver; take it out before the common parser.
  std::string work = "mapp-fuzz-trace-work";
  std::vector<char *> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--work" && i + 1 < argc) {
      work = argv[++i];
      continue;
    }
    args.push_back(argv[i]);
  }
  Options o = parseCommon(static_cast<int>(args.size()), args.data(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  ::mkdir(work.c_str(), 0755);
  static std::string note;
  note = "mapp-fuzz: the failing trace set is also in " + work +
         "/cur (reproduce: mapp-fuzz-trace --repro " + work + "/cur)";
  crashState().note = note.c_str();

  Rng rng(o.seed);
  Outcomes outcomes;
  uint64_t contract = 0;
  auto runOne = [&](const Set &s) -> Result {
    Bytes b = bundle(s);
    setCurrentInput(b);
    alarm(o.watchdog);
    Result res;
    try {
      res = analyze(rng, work, s);
    } catch (const std::exception &e) {
      // mapp-scan has no catch-all: an exception out of the library ends
      // the process (std::terminate), so it is a crash here too.
      ++contract;
      std::fprintf(stderr, "mapp-fuzz-trace: CRASH: uncaught exception: %s",
                   e.what());
      writeArtifact(crashState().crashPath);
      std::exit(1);
    }
    alarm(0);
    setCurrentInput(Bytes());
    return res;
  };

  if (o.repro) {
    for (const std::string &in : o.inputs) {
      Set s;
      struct stat st;
      Bytes b;
      bool ok = ::stat(in.c_str(), &st) == 0 && S_ISDIR(st.st_mode)
                    ? readSetDir(in, s)
                    : readFile(in, b) && unbundle(b, s);
      if (!ok) {
        std::fprintf(stderr, "mapp-fuzz-trace: cannot read '%s'\n", in.c_str());
        return 2;
      }
      std::printf("%s: %s\n", in.c_str(), runOne(s).msg.c_str());
    }
    return 0;
  }

  std::vector<Set> seeds;
  for (size_t i = 0; i < sizeof(kConfigs) / sizeof(*kConfigs); ++i) {
    Set s;
    std::string err, dir = work + "/seed-" + std::to_string(i);
    clearDir(dir);
    if (!simulate(kConfigs[i], dir, s, &err)) {
      std::fprintf(stderr, "mapp-fuzz-trace: simulating seed %zu: %s\n", i,
                   err.c_str());
      return 2;
    }
    seeds.push_back(std::move(s));
  }
  for (const std::string &in : o.inputs) {
    Set s;
    if (!readSetDir(in, s)) {
      std::fprintf(stderr, "mapp-fuzz-trace: no rank-* files in '%s'\n",
                   in.c_str());
      return 2;
    }
    seeds.push_back(std::move(s));
  }
  std::vector<Set> corpus = seeds;
  for (const Set &s : seeds) {
    Result r = runOne(s);
    outcomes.add(signature(r.msg), r.msg);
  }
  std::printf("mapp-fuzz-trace: %zu seed sets, seed %llu, %s build, %s%.0f s\n",
              seeds.size(), static_cast<unsigned long long>(o.seed),
              sanitized() ? "ASan+UBSan" : "unsanitized",
              o.iters ? "iteration-bounded, " : "", o.seconds);
  std::fflush(stdout);

  Clock clock;
  uint64_t iters = 0, read = 0, added = 0;
  double lastReport = 0;
  while (true) {
    if (o.iters ? iters >= o.iters : clock.seconds() >= o.seconds)
      break;
    ++iters;
    Set s = rng.pick(corpus);
    mutateSet(rng, s, seeds);
    Result r = runOne(s);
    read += r.read;
    if (outcomes.add(signature(r.msg), r.msg) && corpus.size() < 1000) {
      corpus.push_back(std::move(s));
      ++added;
    }
    double t = clock.seconds();
    if (!o.quiet && t - lastReport >= 30) {
      lastReport = t;
      std::printf("  %6.0f s  %9llu iters  %6.0f/s  read %llu  outcomes %zu  "
                  "corpus %zu\n",
                  t, static_cast<unsigned long long>(iters), iters / t,
                  static_cast<unsigned long long>(read), outcomes.seen.size(),
                  corpus.size());
      std::fflush(stdout);
    }
  }
  double t = clock.seconds();
  std::printf("mapp-fuzz-trace: done: %llu iterations in %.1f s (%.0f/s); "
              "%llu read and analyzed; %zu distinct outcomes; corpus %zu "
              "(+%llu); no crash\n",
              static_cast<unsigned long long>(iters), t, iters / t,
              static_cast<unsigned long long>(read), outcomes.seen.size(),
              corpus.size(), static_cast<unsigned long long>(added));
  if (!o.quiet) {
    std::printf("most frequent outcomes:\n");
    outcomes.print(stdout, 25);
  }
  return 0;
}
