//===- data_fuzz.cpp - fuzz mapp-run's --data readers ---------------------===//
//
//   mapp-fuzz-data [--time S] [--iters N] [--seed X] [--work DIR]
//                  [common options] [SEED...]
//   mapp-fuzz-data --repro FILE...
//
// Inputs are what `--data` reads, through the runtime's openTokens (the
// function mapp-run calls, runtime/src/data/Corpus.cpp):
//   * a bundle of corpus.idx + corpus.bin, a Megatron-LM indexed dataset
//     (openMegatronTokens);
//   * anything else as a .jsonl corpus with the byte tokenizer
//     (forEachJsonlText, DocumentEncoder), one time in four as a .txt.
// The token stream then feeds a BatchLoader (seq_length 4) for a few
// microbatches, and every id must lie in [0, maxToken()] (maxToken() in
// [0, INT32_MAX]).
//
// Seeds: Megatron files in each integer dtype (u8, i8, i16, i32, i64, u16)
// written by this driver's writer of the documented layout (the repository
// has no C++ writer; the Python test's is test_kernels_e2e.py
// _write_megatron), and JSONL from ../shared/data/gpt/news-1k.jsonl (given
// as SEED) or a built-in sample. Megatron mutations write boundary integers
// exactly into the header fields and the sizes/pointers/doc_idx arrays, or
// change .bin bytes and lengths; JSONL ones edit lines and bytes.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Tokenizer.h"

using namespace mappfuzz;
using namespace mapp::rt;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-data [--time S] [--iters N] [--seed X] [--work DIR]\n"
    "         [--artifact-prefix P] [--watchdog S] [--rss-limit-mb M] [-q]\n"
    "         [SEED.jsonl|DIR...]\n"
    "       mapp-fuzz-data --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;
constexpr size_t kHeader = 34; // magic 9, version 8, code 1, seqs 8, docs 8

template <typename T> void put(Bytes &b, T v) {
  const uint8_t *p = reinterpret_cast<const uint8_t *>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

/// A Megatron MMIDIDX v1 pair for `seqs` in dtype `code`.
FileSet megatron(const std::vector<std::vector<int64_t>> &seqs, uint8_t code) {
  static const int kSizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  int esize = kSizes[code];
  Bytes bin, idx;
  for (const auto &s : seqs)
    for (int64_t t : s)
      for (int i = 0; i < esize; ++i)
        bin.push_back(static_cast<uint8_t>(static_cast<uint64_t>(t) >> (8 * i)));
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  idx.insert(idx.end(), magic, magic + 9);
  put<uint64_t>(idx, 1);
  idx.push_back(code);
  put<uint64_t>(idx, seqs.size());
  put<uint64_t>(idx, seqs.size() + 1);
  for (const auto &s : seqs)
    put<int32_t>(idx, static_cast<int32_t>(s.size()));
  int64_t ptr = 0;
  for (const auto &s : seqs) {
    put<int64_t>(idx, ptr);
    ptr += static_cast<int64_t>(s.size()) * esize;
  }
  for (size_t d = 0; d <= seqs.size(); ++d)
    put<int64_t>(idx, static_cast<int64_t>(d));
  return {{"corpus.idx", idx}, {"corpus.bin", bin}};
}

bool isBundle(const Bytes &b) {
  return b.size() >= 6 && std::memcmp(b.data(), "#FILE ", 6) == 0;
}

/// Boundary integers at the index's own fields.
void mutateIndex(Rng &r, Bytes &idx) {
  if (idx.size() < kHeader)
    return mutateBytes(r, idx, {}, kMaxLen);
  uint64_t seqs;
  std::memcpy(&seqs, idx.data() + 18, 8);
  struct Field {
    size_t at, width;
  };
  std::vector<Field> fields = {{9, 8}, {17, 1}, {18, 8}, {26, 8}};
  if (seqs < 4096 && kHeader + seqs * 12 <= idx.size())
    for (uint64_t s = 0; s < seqs; ++s) {
      fields.push_back({kHeader + 4 * s, 4});
      fields.push_back({kHeader + 4 * seqs + 8 * s, 8});
    }
  int n = 1 + static_cast<int>(r.below(3));
  for (int k = 0; k < n; ++k) {
    Field f = r.pick(fields);
    if (f.at + f.width > idx.size())
      continue;
    int64_t v = r.chance(60) ? interestingInt(r)
                             : static_cast<int64_t>(r.below(64)) - 8;
    if (f.width == 1)
      v = static_cast<int64_t>(r.below(12));
    if (r.chance(30)) { // a small step from the stored value
      int64_t old = 0;
      std::memcpy(&old, idx.data() + f.at, f.width);
      v = static_cast<int64_t>(static_cast<uint64_t>(old) + r.below(9) - 4);
    }
    std::memcpy(idx.data() + f.at, &v, f.width);
  }
}

void mutateJsonl(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  static const char *kLines[] = {
      "{\"text\":\"\"}", "{\"text\":null}", "{\"text\":1}", "{}", "[]",
      "{\"text\":\"a\",\"text\":\"b\"}", "{\"text\":\"\\ud800\"}",
      "{\"text\":\"\\u0000\"}", "   ", "\r", "{\"text\":\"x\"", "\xff\xfe",
      "{\"text\":\"caf\xc3\xa9\"}", "{\"text\":\"\xc3\"}",
      "{\"text\":\"1e999\"}", "{\"text\":\"a\"} trailing", "null"};
  if (r.chance(40)) {
    std::string s(b.begin(), b.end()), line =
        kLines[r.below(sizeof kLines / sizeof *kLines)];
    size_t at = r.below(s.size() + 1);
    at = s.rfind('\n', at);
    at = at == std::string::npos ? 0 : at + 1;
    s.insert(at, line + (r.chance(80) ? "\n" : ""));
    b.assign(s.begin(), s.end());
    return;
  }
  mutateBytes(r, b, corpus, kMaxLen);
}

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  if (!isBundle(b))
    return mutateJsonl(r, b, corpus);
  FileSet s;
  if (!unbundle(b, s))
    return mutateBytes(r, b, corpus, kMaxLen);
  File *idx = fileNamed(s, "corpus.idx"), *bin = fileNamed(s, "corpus.bin");
  unsigned what = static_cast<unsigned>(r.below(100));
  if (idx && what < 55)
    mutateIndex(r, idx->data);
  else if (idx && what < 70)
    mutateBytes(r, idx->data, {}, kMaxLen);
  else if (bin && what < 90)
    mutateBytes(r, bin->data, {}, kMaxLen);
  else if (!s.empty())
    s.erase(s.begin() + r.below(s.size())); // a file missing
  b = bundle(s);
}

struct Target {
  std::string work;
  std::unique_ptr<Tokenizer> bytes = createByteTokenizer();

  std::string run(const Bytes &b) {
    std::shared_ptr<const TokenStream> tokens;
    std::string kind;
    if (isBundle(b)) {
      FileSet s;
      if (!unbundle(b, s))
        return "not a bundle";
      writeSet(work + "/mm", s);
      tokens = openTokens(work + "/mm/corpus.bin", "auto", nullptr);
      kind = "megatron";
    } else {
      bool asText = b.size() % 4 == 1; // a quarter, reproducibly
      std::string path = work + (asText ? "/corpus.txt" : "/corpus.jsonl");
      writeFile(path, b);
      tokens = openTokens(path, "auto", bytes.get());
      kind = asText ? "text" : "jsonl";
    }
    BatchLoader loader(tokens, 4, 11, true);
    int32_t in[8], tgt[8];
    for (int64_t step = 0; step < 3; ++step) {
      loader.microbatch(step, 0, 1, 1, 0, 2, in, tgt);
      for (int32_t t : in)
        if (t < 0 || t > tokens->maxToken()) {
          std::fprintf(stderr,
                       "mapp-fuzz-data: WRONG: token id %d outside [0, %d]\n",
                       t, tokens->maxToken());
          std::abort();
        }
    }
    return "ok: " + kind + " batches";
  }
};

} // namespace

int main(int argc, char **argv) {
  ExtraArgs extra(argc, argv, {"--work"});
  Options o = parseCommon(extra.argc(), extra.argv(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  Target t;
  t.work = extra.get("--work").empty() ? "mapp-fuzz-data-work"
                                       : extra.get("--work");
  ::mkdir(t.work.c_str(), 0755);
  std::vector<Bytes> seeds;
  if (!o.repro) {
    Rng r(99);
    for (uint8_t code : {8, 4, 1, 2, 3, 5}) {
      std::vector<std::vector<int64_t>> seqs;
      for (int n : {7, 13, 1, 22}) {
        std::vector<int64_t> s;
        for (int i = 0; i < n; ++i)
          s.push_back(static_cast<int64_t>(r.below(code == 2 ? 127 : 200)));
        seqs.push_back(s);
      }
      seeds.push_back(bundle(megatron(seqs, code)));
    }
    std::string jsonl = "{\"text\":\"hello world\"}\n\n"
                        "{\"text\":\"second document, a bit longer\"}\n"
                        "{\"text\":\"caf\\u00e9 \\u2603\",\"id\":3}\n";
    seeds.push_back(Bytes(jsonl.begin(), jsonl.end()));
    for (const std::string &in : o.inputs) {
      std::vector<Bytes> files;
      if (!addSeedPath(in, files)) {
        std::fprintf(stderr, "mapp-fuzz-data: cannot read '%s'\n", in.c_str());
        return 2;
      }
      for (Bytes &f : files) { // the first lines of a large corpus
        size_t cut = 0, lines = 0;
        while (cut < f.size() && lines < 20)
          lines += f[cut++] == '\n';
        f.resize(cut);
        seeds.push_back(std::move(f));
      }
    }
  }
  return corpusLoop<Error>({"mapp-fuzz-data"}, o, std::move(seeds),
                           [&](const Bytes &b) { return t.run(b); }, mutate);
}
