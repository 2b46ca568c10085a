//===- tokenizer_fuzz.cpp - fuzz the GPT-2 BPE vocab.json / merges.txt ----===//
//
//   mapp-fuzz-tokenizer --vocab VOCAB.json --merges MERGES.txt [--text F]
//                       [--time S] [--iters N] [--seed X] [--work DIR]
//                       [common options]
//   mapp-fuzz-tokenizer --repro FILE...
//
// An input is a bundle of vocab.json, merges.txt and a text. It goes through
// createGpt2Tokenizer (the loader `--tokenizer gpt2:VOCAB,MERGES` uses,
// runtime/src/data/Bpe.cpp) and, when that accepts the files, encode and
// decode of the text. Byte-level BPE is lossless, so an accepted tokenizer
// must give decode(encode(text)) == text with every id below vocabSize();
// and corpora are encoded in chunks cut at cutPoint, so cutting the text at
// cutPoint(prefix) of a prefix must not change its ids. Anything else is a
// silent wrong answer (abort). Memory is capped
// (--rss-limit-mb): a small file must not make the loader allocate without
// bound.
//
// Seeds: smaller GPT-2 tokenizers cut from the real files (the 256 byte
// tokens, the first K merges and their results, <|endoftext|>; K = 0, 40,
// 400, 2000; ids renumbered densely), with texts from --text (the first
// lines of a corpus) or built in. Mutations: vocab ids replaced by boundary
// and other entries' ids, entries dropped or duplicated, JSON bytes; merges
// lines dropped, duplicated, swapped, split or joined, bytes; text bytes.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "mapp/rt/Error.h"
#include "mapp/rt/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <sstream>

using namespace mappfuzz;
using namespace mapp::rt;
using json = nlohmann::json;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-tokenizer --vocab VOCAB.json --merges MERGES.txt\n"
    "         [--text FILE] [--time S] [--iters N] [--seed X] [--work DIR]\n"
    "         [--artifact-prefix P] [--watchdog S] [--rss-limit-mb M] [-q]\n"
    "       mapp-fuzz-tokenizer --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;

std::vector<std::string> lines(const Bytes &b) {
  std::vector<std::string> out;
  std::string cur;
  for (uint8_t c : b) {
    if (c == '\n') {
      out.push_back(cur);
      cur.clear();
    } else
      cur += static_cast<char>(c);
  }
  if (!cur.empty())
    out.push_back(cur);
  return out;
}

Bytes joined(const std::vector<std::string> &ls) {
  Bytes b;
  for (const std::string &l : ls) {
    b.insert(b.end(), l.begin(), l.end());
    b.push_back('\n');
  }
  return b;
}

/// The real tokenizer cut to its first `k` merges, ids renumbered densely.
FileSet cutTokenizer(const json &vocab, const std::vector<std::string> &merges,
                     size_t k, const std::string &text) {
  // The byte tokens are the vocab's first 256 ids in GPT-2's file.
  std::vector<std::pair<int64_t, std::string>> byId;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    byId.push_back({it.value().get<int64_t>(), it.key()});
  std::sort(byId.begin(), byId.end());
  json v = json::object();
  int64_t next = 0;
  for (size_t i = 0; i < 256 && i < byId.size(); ++i)
    v[byId[i].second] = next++;
  std::vector<std::string> kept = {"#version: 0.2"};
  for (const std::string &m : merges) {
    if (kept.size() > k)
      break;
    if (m.rfind("#", 0) == 0)
      continue;
    size_t sp = m.find(' ');
    if (sp == std::string::npos)
      continue;
    std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    if (!v.contains(a) || !v.contains(b))
      continue;
    if (!v.contains(a + b))
      v[a + b] = next++;
    kept.push_back(m);
  }
  v["<|endoftext|>"] = next++;
  std::string vs = v.dump(), t = text;
  return {{"vocab.json", Bytes(vs.begin(), vs.end())},
          {"merges.txt", joined(kept)},
          {"text.txt", Bytes(t.begin(), t.end())}};
}

void mutateVocab(Rng &r, Bytes &b) {
  json v;
  try {
    v = json::parse(b.begin(), b.end());
  } catch (const std::exception &) {
    return mutateBytes(r, b, {}, kMaxLen);
  }
  if (!v.is_object() || v.empty() || r.chance(25))
    return mutateBytes(r, b, {}, kMaxLen);
  std::vector<std::string> keys;
  for (auto it = v.begin(); it != v.end(); ++it)
    keys.push_back(it.key());
  const std::string &key = r.pick(keys);
  switch (r.below(5)) {
  case 0: // a boundary id
    v[key] = interestingInt(r);
    break;
  case 1: // another entry's id (two tokens, one id)
    v[key] = v[r.pick(keys)];
    break;
  case 2: // a type other than an integer
    v[key] = r.chance(50) ? json(1.5) : json("7");
    break;
  case 3: // dropped
    v.erase(key);
    break;
  case 4: // a new token
    v[key + key] = static_cast<int64_t>(r.below(keys.size() + 4));
    break;
  }
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  b.assign(s.begin(), s.end());
}

void mutateMerges(Rng &r, Bytes &b) {
  std::vector<std::string> ls = lines(b);
  if (ls.empty() || r.chance(25))
    return mutateBytes(r, b, {}, kMaxLen);
  size_t i = r.below(ls.size());
  switch (r.below(6)) {
  case 0:
    ls.erase(ls.begin() + i);
    break;
  case 1:
    ls.insert(ls.begin() + r.below(ls.size() + 1), ls[i]);
    break;
  case 2:
    std::swap(ls[i], ls[r.below(ls.size())]);
    break;
  case 3: { // split or join the symbols
    size_t sp = ls[i].find(' ');
    if (sp != std::string::npos)
      ls[i] = r.chance(50) ? ls[i].substr(0, sp) + ls[i].substr(sp + 1)
                           : ls[i].substr(0, sp) + "  " + ls[i].substr(sp + 1);
    break;
  }
  case 4: { // a line of other bytes
    static const char *odd[] = {"", "#version: 0.2", "\r", " ", "a", "a b c",
                                "\xc4\xa0 t", "\xff \xfe", "<|endoftext|> a"};
    ls.insert(ls.begin() + i, odd[r.below(sizeof odd / sizeof *odd)]);
    break;
  }
  case 5:
    ls.resize(i);
    break;
  }
  b = joined(ls);
}

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &) {
  FileSet s;
  if (!unbundle(b, s) || s.size() != 3)
    return mutateBytes(r, b, {}, kMaxLen);
  unsigned what = static_cast<unsigned>(r.below(100));
  if (what < 35)
    mutateVocab(r, s[0].data);
  else if (what < 70)
    mutateMerges(r, s[1].data);
  else
    mutateBytes(r, s[2].data, {}, 8192);
  b = bundle(s);
}

struct Target {
  std::string work;
  std::string run(const Bytes &b) {
    FileSet s;
    if (!unbundle(b, s) || s.size() != 3)
      return "not a bundle";
    writeSet(work + "/tok", s);
    std::unique_ptr<Tokenizer> tok = createGpt2Tokenizer(
        work + "/tok/" + s[0].name, work + "/tok/" + s[1].name);
    std::string text(s[2].data.begin(), s[2].data.end());
    std::vector<int32_t> ids = tok->encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocabSize()) {
        std::fprintf(stderr, "mapp-fuzz-tokenizer: WRONG: id %d outside the "
                             "vocabulary of %d\n",
                     id, tok->vocabSize());
        std::abort();
      }
    if (tok->eot() < 0 || tok->eot() >= tok->vocabSize())
      std::abort();
    if (tok->decode(ids) != text) {
      std::fprintf(stderr, "mapp-fuzz-tokenizer: WRONG: decode(encode(text)) "
                           "differs from the text\n");
      std::abort();
    }
    // The cut of a prefix (two thirds: what follows is unknown to it).
    size_t cut = tok->cutPoint(std::string_view(text).substr(0, text.size() * 2 / 3));
    std::vector<int32_t> left = tok->encode(text.substr(0, cut)),
                         right = tok->encode(text.substr(cut));
    left.insert(left.end(), right.begin(), right.end());
    if (left != ids) {
      std::fprintf(stderr, "mapp-fuzz-tokenizer: WRONG: cut at byte %zu of "
                           "%zu changes the encoding\n",
                   cut, text.size());
      std::abort();
    }
    return "ok: " + std::to_string(ids.size() > 0) + " round trip" +
           (cut ? ", cut" : "");
  }
};

} // namespace

int main(int argc, char **argv) {
  ExtraArgs extra(argc, argv, {"--vocab", "--merges", "--text", "--work"});
  Options o = parseCommon(extra.argc(), extra.argv(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  Target t;
  t.work = extra.get("--work").empty() ? "mapp-fuzz-tokenizer-work"
                                       : extra.get("--work");
  ::mkdir(t.work.c_str(), 0755);
  std::vector<Bytes> seeds;
  if (!o.repro) {
    Bytes vb, mb, tb;
    if (!readFile(extra.get("--vocab"), vb) ||
        !readFile(extra.get("--merges"), mb)) {
      std::fprintf(stderr, "mapp-fuzz-tokenizer: cannot read --vocab / "
                           "--merges\n%s", kUsage);
      return 2;
    }
    std::vector<std::string> texts = {
        "Hello world! It's 2026 -- caf\xc3\xa9 \xe2\x98\x83 naive   spaces\n",
        " the the the, and 12345 don't"};
    if (!extra.get("--text").empty() && readFile(extra.get("--text"), tb)) {
      std::vector<std::string> ls = lines(tb);
      for (size_t i = 0; i < ls.size() && i < 3; ++i)
        texts.push_back(ls[i].substr(0, 2000));
    }
    json vocab = json::parse(vb.begin(), vb.end());
    std::vector<std::string> merges = lines(mb);
    size_t n = 0;
    for (size_t k : {0, 40, 400, 2000})
      seeds.push_back(bundle(cutTokenizer(vocab, merges, k,
                                          texts[n++ % texts.size()])));
    for (size_t i = 0; i < texts.size(); ++i)
      seeds.push_back(bundle(cutTokenizer(vocab, merges, 400, texts[i])));
  }
  return corpusLoop<Error>({"mapp-fuzz-tokenizer"}, o, std::move(seeds),
                           [&](const Bytes &b) { return t.run(b); }, mutate);
}
