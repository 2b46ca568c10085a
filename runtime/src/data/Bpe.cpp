//===- Bpe.cpp - GPT-2 byte-level BPE -------------------------------------===//
//
// Same algorithm as OpenAI's encoder.py: pre-tokenize with the GPT-2 pattern,
// map each byte to its printable stand-in (bytes_to_unicode), then merge the
// lowest-ranked adjacent pair until none is in merges.txt.
//
//===----------------------------------------------------------------------===//
#include "data/InputFile.h"
#include "data/Unicode.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <mutex>
#include <unordered_map>

using namespace mapp::rt;

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

class Gpt2Tokenizer final : public Tokenizer {
public:
  Gpt2Tokenizer(const std::string &vocabPath, const std::string &mergesPath) {
    buildByteMap();
    loadVocab(vocabPath);
    loadMerges(mergesPath);
  }

  std::vector<int32_t> encode(const std::string &text) const override {
    std::vector<int32_t> ids;
    for (const std::string &piece : unicode::gpt2PreTokenize(text)) {
      std::lock_guard<std::mutex> lock(cacheMu_);
      auto it = cache_.find(piece);
      if (it == cache_.end()) {
        // Bounded: a large corpus holds millions of distinct pieces.
        if (cache_.size() >= kMaxCachedPieces)
          cache_.clear();
        it = cache_.emplace(piece, bpe(piece)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
    return ids;
  }

  size_t cutPoint(std::string_view text) const override {
    return unicode::gpt2CutPoint(text);
  }

  std::string decode(const std::vector<int32_t> &ids) const override {
    std::string mapped;
    for (int32_t id : ids)
      if (id >= 0 && static_cast<size_t>(id) < idToToken_.size())
        mapped += idToToken_[id];
    // Undo bytes_to_unicode.
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    unicode::decodeUtf8(mapped, cps, off);
    std::string out;
    for (uint32_t cp : cps) {
      auto it = unicodeToByte_.find(cp);
      if (it != unicodeToByte_.end())
        out += static_cast<char>(it->second);
    }
    return out;
  }

  int32_t eot() const override { return eot_; }
  int32_t vocabSize() const override {
    return static_cast<int32_t>(idToToken_.size());
  }

private:
  void buildByteMap() {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b)
      bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b)
      bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b)
      bs.push_back(b);
    std::vector<uint32_t> cs(bs.begin(), bs.end());
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b)
      if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
        bs.push_back(b);
        cs.push_back(256 + n++);
      }
    for (size_t i = 0; i < bs.size(); ++i) {
      byteToUnicode_[bs[i]] = utf8(cs[i]);
      unicodeToByte_[cs[i]] = static_cast<uint8_t>(bs[i]);
    }
  }

  void loadVocab(const std::string &path) {
    std::string text =
        InputFile(path, "tokenizer: ", "vocab ").readAll(kMaxVocabBytes);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception &e) {
      fail("tokenizer: vocab '", path, "' is not valid JSON (", e.what(), ")");
    }
    if (!j.is_object())
      fail("tokenizer: vocab '", path, "' must map tokens to ids");
    // Ids index the decode table: they must be (nearly) dense, or one entry
    // like {"x": 1000000000} would allocate a billion strings; and unique,
    // or decode(encode(text)) would silently differ from the text (both
    // found by mapp-fuzz-tokenizer).
    const int64_t maxId = 2 * static_cast<int64_t>(j.size()) + 1024;
    std::vector<bool> taken;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > INT32_MAX / 2)
        fail("tokenizer: vocab entry '", it.key(), "' has a bad id");
      int64_t id = it.value().get<int64_t>();
      if (id >= maxId)
        fail("tokenizer: vocab '", path, "' entry '", it.key(), "' has id ",
             id, ", far past its ", j.size(),
             " entries (ids must be 0..N-1, nearly dense)");
      if (static_cast<size_t>(id) >= idToToken_.size()) {
        idToToken_.resize(id + 1);
        taken.resize(id + 1);
      }
      if (taken[id])
        fail("tokenizer: vocab '", path, "' gives id ", id, " to both '",
             idToToken_[id], "' and '", it.key(), "'");
      taken[id] = true;
      vocab_[it.key()] = static_cast<int32_t>(id);
      idToToken_[id] = it.key();
    }
    auto eot = vocab_.find("<|endoftext|>");
    if (eot == vocab_.end())
      fail("tokenizer: vocab '", path, "' has no <|endoftext|> token");
    eot_ = eot->second;
    for (int b = 0; b < 256; ++b)
      if (!vocab_.count(byteToUnicode_[b]))
        fail("tokenizer: vocab '", path, "' lacks the token for byte ", b);
  }

  // Bounds on merges.txt: GPT-2's is 456 KB with lines under 40 bytes, so a
  // file past these is not a merges file (and is refused before it is read
  // whole). Devices such as /dev/zero are refused by InputFile.
  static constexpr size_t kMaxMergesBytes = size_t(256) << 20;
  static constexpr size_t kMaxMergeLine = 4096;
  // GPT-2's vocab.json is 1 MB.
  static constexpr size_t kMaxVocabBytes = size_t(256) << 20;
  // GPT-2's own encoder.py caches without bound; this one forgets all when
  // full (each entry is a piece and its ids, ~100 bytes: ~6 MiB).
  static constexpr size_t kMaxCachedPieces = size_t(1) << 16;

  void loadMerges(const std::string &path) {
    InputFile file(path, "tokenizer: ", "merges ");
    if (file.size() > kMaxMergesBytes)
      fail("tokenizer: merges '", path, "' is larger than ",
           kMaxMergesBytes >> 20, " MiB: not a merges file");
    const std::string content = file.readAll(kMaxMergesBytes);
    auto bad = [&](int lineNo, const std::string &why) {
      fail("tokenizer: merges '", path, "' line ", lineNo, ": ", why,
           " (not a GPT-2 merges.txt?)");
    };
    std::string line;
    int rank = 0, lineNo = 0;
    for (size_t pos = 0; pos < content.size();) {
      size_t end = std::min(content.find('\n', pos), content.size());
      ++lineNo;
      if (end - pos > kMaxMergeLine)
        bad(lineNo, "longer than " + std::to_string(kMaxMergeLine) + " bytes");
      line.assign(content, pos, end - pos);
      pos = end + 1;
      if (line.find('\0') != std::string::npos)
        bad(lineNo, "contains a NUL byte");
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0)
        continue;
      size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        fail("tokenizer: merges '", path, "' line ", lineNo,
             ": expected two symbols separated by a space");
      // Both symbols and their merge are tokens: anything else is a file
      // of another tokenizer (or none), which would silently tokenize wrong.
      std::string a = line.substr(0, sp), b = line.substr(sp + 1);
      for (const std::string *sym : {&a, &b})
        if (!vocab_.count(*sym))
          bad(lineNo, "symbol '" + *sym + "' is not in the vocab");
      if (!vocab_.count(a + b))
        bad(lineNo, "the merge '" + a + b + "' is not in the vocab");
      ranks_.emplace(line, rank++);
    }
    if (rank == 0)
      fail("tokenizer: merges '", path, "' holds no merges (",
           lineNo ? "only comments and blank lines" : "empty file",
           "): BPE would silently be byte-level");
  }

  std::vector<int32_t> bpe(const std::string &piece) const {
    std::vector<std::string> word;
    for (unsigned char c : piece)
      word.push_back(byteToUnicode_[c]);
    while (word.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        auto it = ranks_.find(word[i] + " " + word[i + 1]);
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best == INT_MAX)
        break;
      // Merge every occurrence of the best pair, left to right.
      std::string a = word[at], b = word[at + 1];
      std::vector<std::string> next;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
          next.push_back(a + b);
          i += 2;
        } else {
          next.push_back(word[i++]);
        }
      }
      word.swap(next);
    }
    std::vector<int32_t> ids;
    for (const std::string &sym : word) {
      auto it = vocab_.find(sym);
      if (it == vocab_.end())
        fail("tokenizer: BPE produced '", sym, "' which is not in the vocab");
      ids.push_back(it->second);
    }
    return ids;
  }

  std::string byteToUnicode_[256];
  std::unordered_map<uint32_t, uint8_t> unicodeToByte_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> idToToken_;
  std::unordered_map<std::string, int> ranks_;
  int32_t eot_ = 0;
  mutable std::mutex cacheMu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

} // namespace

std::unique_ptr<Tokenizer>
mapp::rt::createGpt2Tokenizer(const std::string &vocabPath,
                              const std::string &mergesPath) {
  return std::make_unique<Gpt2Tokenizer>(vocabPath, mergesPath);
}
