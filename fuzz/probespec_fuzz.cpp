//===- probespec_fuzz.cpp - fuzz the MegaScope probe spec parsers ---------===//
//
//   mapp-fuzz-probespec [--time S] [--iters N] [--seed X] [common options]
//                       SEED.json|SEED.yaml|DIR...
//   mapp-fuzz-probespec --repro FILE...
//
// Every input goes through both readers of `-mapp-insert-probes=spec=FILE`
// (lib/Transforms/Scope/ProbeSpec*.cpp, compiled into this driver from the
// compiler's sources with LLVM's Support library only): parseProbeSpec (the
// JSON reader) and parseProbeSpecYaml (the YAML reader, LLVM's YAML parser
// into the same validator). Errors come back as llvm::Error, so only
// crashes, sanitizer reports, hangs and escaping exceptions count.
//
// Seeds: the specs of the examples and tests (examples/probes.*,
// test/Transforms/Scope/Inputs/*.json|yaml). Mutations: values after ':'
// or in lists replaced by boundary numbers, other types, glob patterns,
// token selectors and reduction names; keys duplicated or dropped; YAML
// indentation and flow/block markers changed; bytes.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "Scope/ProbeSpec.h"

using namespace mappfuzz;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-probespec [--time S] [--iters N] [--seed X]\n"
    "         [--artifact-prefix P] [--watchdog S] [--rss-limit-mb M] [-q]\n"
    "         SEED.json|SEED.yaml|DIR...\n"
    "       mapp-fuzz-probespec --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 18;

const char *kValues[] = {
    "0", "1", "-1", "2", "1024", "-9223372036854775808",
    "9223372036854775807", "18446744073709551616", "1e308", "-1e308", "1.5",
    "nan", ".inf", "-.inf", "null", "~", "true", "false", "\"\"", "[]", "{}",
    "\"*\"", "\"**\"", "\"[\"", "\"layers.*.mlp.fc1\"", "\"layers.[0-9]*\"",
    "\"-1\"", "\"-4:0\"", "\"0:-1\"", "\"5:2\"", "\"::\"", "\"1:2:3\"",
    "[\"-1\", \"0:4\"]", "[-1, 3]", "\"max\"", "\"hist\"", "\"topk\"",
    "\"sketch\"", "\"raw\"", "\"attn\"", "\"lens\"", "[\"hist\",\"hist\"]",
    "\"gaussian\"", "\"bitflip\"", "\"fp8\"", "\"storage\"", "\"system\"",
    "&a x", "*a", "!!str 3", "|\n  block", ">-\n  folded", "'it''s'",
    "\"\\ud800\"", "\"\\u0000\""};

const char *kKeys[] = {"name",  "reduce", "every",      "tokens", "bins",
                       "lo",    "hi",     "k",          "sketch_dim",
                       "seed",  "eps",    "raw_cap",    "kind",   "target",
                       "magnitude", "p",  "enabled",    "switch", "channels",
                       "heads", "probes", "perturbations", "extra"};

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  std::string s(b.begin(), b.end());
  int n = 1 + static_cast<int>(r.below(3));
  for (int k = 0; k < n; ++k) {
    unsigned what = static_cast<unsigned>(r.below(100));
    // Value positions: after ": " / ":" / "- " / "[" / ",".
    std::vector<size_t> at;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] == ':' || s[i] == '[' || s[i] == ',' ||
          (s[i] == '-' && i + 1 < s.size() && s[i + 1] == ' '))
        at.push_back(i + 1);
    if (what < 45 && !at.empty()) { // replace the value there
      size_t b0 = r.pick(at);
      while (b0 < s.size() && s[b0] == ' ')
        ++b0;
      size_t e = std::min(jsonValueEnd(s, b0, ",}]\n"), s.size());
      s = s.substr(0, b0) + kValues[r.below(sizeof kValues / sizeof *kValues)] +
          s.substr(e);
    } else if (what < 60 && !at.empty()) { // a key inserted
      size_t p = r.pick(at);
      std::string key = kKeys[r.below(sizeof kKeys / sizeof *kKeys)];
      bool json = !s.empty() && s.find('{') != std::string::npos;
      std::string ins = json ? " \"" + key + "\": " +
                                   kValues[r.below(sizeof kValues /
                                                   sizeof *kValues)] + ","
                             : "\n  " + key + ": " +
                                   kValues[r.below(sizeof kValues /
                                                   sizeof *kValues)];
      s.insert(std::min(p, s.size()), ins);
    } else if (what < 72) { // indentation / structure characters
      if (s.empty())
        break;
      size_t p = r.below(s.size());
      static const char *marks[] = {"  ", "\t", "\n", "- ", "{", "}", "[",
                                    "]",  ":",  "#",  "\"", "'", "---\n"};
      if (r.chance(50))
        s.insert(p, marks[r.below(sizeof marks / sizeof *marks)]);
      else
        s.erase(p, 1 + r.below(3));
    } else if (what < 80) { // a line duplicated (duplicate keys, entries)
      size_t p = s.empty() ? 0 : r.below(s.size());
      size_t ls = s.rfind('\n', p), le = s.find('\n', p);
      ls = ls == std::string::npos ? 0 : ls + 1;
      le = le == std::string::npos ? s.size() : le + 1;
      s.insert(le, s.substr(ls, le - ls));
    } else {
      Bytes x(s.begin(), s.end());
      mutateBytes(r, x, corpus, kMaxLen);
      s.assign(x.begin(), x.end());
    }
  }
  if (s.size() > kMaxLen)
    s.resize(kMaxLen);
  b.assign(s.begin(), s.end());
}

/// What a parse gave, for the outcome signature.
std::string describe(llvm::Expected<mapp::scope::ProbeSpec> spec) {
  if (!spec)
    return llvm::toString(spec.takeError());
  return "ok " + std::to_string(spec->probes.size()) + " probes " +
         std::to_string(spec->perturbations.size()) + " perturbations";
}

/// The error type of this driver's loop: the readers throw nothing.
struct NoError : std::exception {};

} // namespace

int main(int argc, char **argv) {
  Options o = parseCommon(argc, argv, kUsage);
  installCrashHandlers(o.artifactPrefix);
  std::vector<Bytes> seeds;
  if (!o.repro)
    for (const std::string &in : o.inputs)
      if (!addSeedPath(in, seeds)) {
        std::fprintf(stderr, "mapp-fuzz-probespec: cannot read '%s'\n",
                     in.c_str());
        return 2;
      }
  auto run = [](const Bytes &b) -> std::string {
    llvm::StringRef text(reinterpret_cast<const char *>(b.data()), b.size());
    std::string j = describe(mapp::scope::parseProbeSpec(text, "spec.json"));
    std::string y =
        describe(mapp::scope::parseProbeSpecYaml(text, "spec.yaml"));
    // "ok..." when either reader accepts it; both readers' outcomes share
    // the signature's 72 characters.
    bool ok = j.rfind("ok", 0) == 0 || y.rfind("ok", 0) == 0;
    return std::string(ok ? "ok " : "") + "J " + signature(j).substr(0, 34) +
           "|Y " + signature(y).substr(0, 30);
  };
  return corpusLoop<NoError>({"mapp-fuzz-probespec"}, o, std::move(seeds),
                             run, mutate);
}
