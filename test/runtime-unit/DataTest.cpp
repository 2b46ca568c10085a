//===- DataTest.cpp - packing, shuffle, corpora, weight init --------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

using namespace mapp::rt;

namespace {

std::string tempPath(const std::string &name) {
  return testing::TempDir() + "/mapp_data_" + name;
}

std::vector<int32_t> iota(int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

} // namespace

TEST(Packing, SamplesOverlapByOneToken) {
  // 23 tokens, T = 5: samples start at 0, 5, 10, 15 (the 4th ends at 20).
  BatchLoader l(iota(23), 5, 0, /*shuffle=*/false);
  EXPECT_EQ(l.numSamples(), 4);
  std::vector<int32_t> in(5), tg(5);
  l.sample(2, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(tg, (std::vector<int32_t>{11, 12, 13, 14, 15}));
  l.sample(5, in.data(), tg.data()); // epoch 1, sample 1
  EXPECT_EQ(in[0], 5);
  EXPECT_THROW(BatchLoader(iota(5), 5, 0, false), Error);
}

TEST(Shuffle, DeterministicPermutationPerSeedAndEpoch) {
  std::vector<int64_t> a = epochOrder(100, 42, 0, true);
  EXPECT_EQ(a, epochOrder(100, 42, 0, true));
  EXPECT_NE(a, epochOrder(100, 43, 0, true));
  EXPECT_NE(a, epochOrder(100, 42, 1, true));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> id(100);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_EQ(sorted, id);
  EXPECT_NE(a, id);
  EXPECT_EQ(epochOrder(100, 42, 0, false), id);
  // First draws of the documented generator: SplitMix64(seed).next() is
  // splitmix64(seed), i.e. the reference value for seed 0.
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xE220A8397B1DCDAFULL);
}

TEST(Batches, MicrobatchRowsFollowTheDocumentedIndex) {
  BatchLoader l(iota(1001), 10, 7, true);
  std::vector<int64_t> order = epochOrder(l.numSamples(), 7, 0, true);
  // dp = 2, rank 1, 3 microbatches of 2 rows: step 1, mb 2, row 1 is sample
  // 1*12 + (1*3 + 2)*2 + 1 = 23 of the stream.
  std::vector<int32_t> in(20), tg(20);
  l.microbatch(1, 1, 2, 3, 2, 2, in.data(), tg.data());
  EXPECT_EQ(in[10], order[23] * 10);
  EXPECT_EQ(tg[19], order[23] * 10 + 10);
}

TEST(Jsonl, ReadsTextAndReportsBadLines) {
  std::string p = tempPath("a.jsonl");
  {
    std::ofstream f(p);
    f << R"({"text": "one", "src": "x"})"
      << "\n\n"
      << R"({"text": "two \u00e9"})"
      << "\n";
  }
  EXPECT_EQ(readJsonlTexts(p),
            (std::vector<std::string>{"one", "two \xc3\xa9"}));
  {
    std::ofstream f(p);
    f << R"({"text": "one"})"
      << "\n"
      << R"({"body": "two"})"
      << "\n";
  }
  try {
    readJsonlTexts(p);
    FAIL();
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(":2: no string field \"text\""),
              std::string::npos)
        << e.what();
  }
  auto bytes = createByteTokenizer();
  EXPECT_EQ(tokenizeDocuments({"ab", "c"}, *bytes),
            (std::vector<int32_t>{97, 98, 0, 99, 0}));
}

TEST(Megatron, ReadsIndexedDataset) {
  std::string prefix = tempPath("mm");
  std::vector<std::vector<uint16_t>> seqs = {{1, 2, 3}, {65535, 7}, {}, {9}};
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  auto put = [&](const void *p, size_t n) {
    idx.insert(idx.end(), static_cast<const uint8_t *>(p),
               static_cast<const uint8_t *>(p) + n);
  };
  uint64_t version = 1, count = seqs.size(), docs = seqs.size() + 1;
  uint8_t code = 8; // uint16
  put(&version, 8);
  put(&code, 1);
  put(&count, 8);
  put(&docs, 8);
  int64_t ptr = 0;
  std::vector<int64_t> ptrs;
  for (auto &s : seqs) {
    int32_t n = static_cast<int32_t>(s.size());
    put(&n, 4);
    ptrs.push_back(ptr);
    ptr += 2 * n;
  }
  put(ptrs.data(), 8 * ptrs.size());
  for (int64_t d = 0; d < static_cast<int64_t>(docs); ++d)
    put(&d, 8);
  {
    std::ofstream f(prefix + ".idx", std::ios::binary);
    f.write(reinterpret_cast<const char *>(idx.data()), idx.size());
    std::ofstream b(prefix + ".bin", std::ios::binary);
    for (auto &s : seqs)
      b.write(reinterpret_cast<const char *>(s.data()), 2 * s.size());
  }
  EXPECT_EQ(readMegatronTokens(prefix),
            (std::vector<int32_t>{1, 2, 3, 65535, 7, 9}));
  EXPECT_EQ(loadTokens(prefix + ".idx", "auto", nullptr).size(), 6u);
  // Truncated index and wrong magic are errors, not crashes.
  for (size_t cut : {size_t(5), size_t(30), idx.size() - 1}) {
    std::ofstream f(prefix + ".idx", std::ios::binary);
    f.write(reinterpret_cast<const char *>(idx.data()), cut);
    f.close();
    EXPECT_THROW(readMegatronTokens(prefix), Error) << cut;
  }
}

namespace {

/// A Megatron index of `count` sequences with the given sizes and pointers.
std::vector<uint8_t> megatronIndex(uint8_t code,
                                   const std::vector<int32_t> &sizes,
                                   const std::vector<int64_t> &pointers) {
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  auto put = [&](const void *p, size_t n) {
    idx.insert(idx.end(), static_cast<const uint8_t *>(p),
               static_cast<const uint8_t *>(p) + n);
  };
  uint64_t version = 1, count = sizes.size(), docs = sizes.size() + 1;
  put(&version, 8);
  put(&code, 1);
  put(&count, 8);
  put(&docs, 8);
  put(sizes.data(), 4 * sizes.size());
  put(pointers.data(), 8 * pointers.size());
  for (int64_t d = 0; d < static_cast<int64_t>(docs); ++d)
    put(&d, 8);
  return idx;
}

void writeBytes(const std::string &path, const void *p, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char *>(p), n);
}

std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace

// Every dtype is read where it lies, a window at a time, widened in place.
TEST(Megatron, StreamsEveryDtypeAtAnyOffset) {
  std::string prefix = tempPath("mmdt");
  struct Case {
    uint8_t code;
    int size;
  };
  for (Case c : {Case{1, 1}, Case{2, 1}, Case{3, 2}, Case{4, 4}, Case{5, 8},
                 Case{8, 2}}) {
    // 3 sequences back to back after 2 bytes no sequence holds.
    std::vector<int32_t> sizes = {7, 0, 13};
    std::vector<int64_t> ptrs = {16, 16 + 7 * c.size, 16 + 7 * c.size};
    std::vector<uint8_t> bin(16 + 20 * c.size);
    std::vector<int32_t> expect;
    for (int i = 0; i < 20; ++i) {
      int64_t v = (i * 37) % 120 + 1;
      std::memcpy(bin.data() + 16 + i * c.size, &v, c.size);
      expect.push_back(static_cast<int32_t>(v));
    }
    std::vector<uint8_t> idx = megatronIndex(c.code, sizes, ptrs);
    writeBytes(prefix + ".idx", idx.data(), idx.size());
    writeBytes(prefix + ".bin", bin.data(), bin.size());
    auto s = openMegatronTokens(prefix);
    ASSERT_EQ(s->size(), 20) << int(c.code);
    EXPECT_EQ(s->maxToken(), *std::max_element(expect.begin(), expect.end()));
    for (int first = 0; first < 20; first += 3)
      for (int n : {1, 5, 20 - first}) {
        if (first + n > 20)
          continue;
        std::vector<int32_t> got(n);
        s->read(first, n, got.data());
        EXPECT_EQ(got, std::vector<int32_t>(expect.begin() + first,
                                            expect.begin() + first + n))
            << "code " << int(c.code) << " first " << first << " n " << n;
      }
  }
}

// Issue 43, defect 5: overlapping sequences that fit the .bin (the same
// pointer twice) were accepted; a short index was called "bad magic".
TEST(Megatron, RefusesOverlapsGapsAndShortIndexes) {
  std::string prefix = tempPath("mmbad");
  std::vector<uint8_t> bin(100);
  for (int i = 0; i < 100; ++i)
    bin[i] = static_cast<uint8_t>(i);
  writeBytes(prefix + ".bin", bin.data(), bin.size());
  auto withIndex = [&](const std::vector<int32_t> &sizes,
                       const std::vector<int64_t> &ptrs) {
    std::vector<uint8_t> idx = megatronIndex(1, sizes, ptrs);
    writeBytes(prefix + ".idx", idx.data(), idx.size());
    return errorOf([&] { openMegatronTokens(prefix); });
  };
  EXPECT_NE(withIndex({50, 50}, {0, 0}).find(
                "sequence 1 of '" + prefix +
                ".idx' starts at byte 0 of '" + prefix +
                ".bin', before sequence 0 ends (byte 50): sequences overlap"),
            std::string::npos);
  EXPECT_NE(withIndex({30, 30, 30}, {0, 30, 20}).find("sequences overlap"),
            std::string::npos); // out of order
  EXPECT_NE(withIndex({40, 40}, {0, 60}).find(
                "past the end of sequence 0 (byte 40): Megatron stores "
                "sequences back to back"),
            std::string::npos);
  EXPECT_NE(withIndex({50, 51}, {0, 50}).find("points outside"),
            std::string::npos);
  EXPECT_NE(withIndex({10}, {-8}).find("points outside"), std::string::npos);
  EXPECT_NE(withIndex({-1}, {0}).find("has size -1"), std::string::npos);
  EXPECT_EQ(withIndex({50, 50}, {0, 50}), "(no error)");

  std::vector<uint8_t> idx = megatronIndex(1, {100}, {0});
  for (size_t cut : {size_t(0), size_t(5), size_t(20), size_t(33)}) {
    writeBytes(prefix + ".idx", idx.data(), cut);
    EXPECT_NE(errorOf([&] { openMegatronTokens(prefix); })
                  .find("is too short for a Megatron index: " +
                        std::to_string(cut) + " bytes"),
              std::string::npos)
        << cut;
  }
  idx[3] = 'X';
  writeBytes(prefix + ".idx", idx.data(), idx.size());
  EXPECT_NE(errorOf([&] { openMegatronTokens(prefix); }).find("bad magic"),
            std::string::npos);
  writeBytes(prefix + ".idx", idx.data(), 20);
  EXPECT_NE(errorOf([&] { openMegatronTokens(prefix); }).find("bad magic"),
            std::string::npos);
}

TEST(TokenFile, RoundTripsBothWidths) {
  for (int32_t vocab : {300, 65536, 70000}) {
    TokenFileWriter w(vocab);
    std::vector<int32_t> ids;
    for (int i = 0; i < 3000000; ++i) // past the 4 MiB write buffer
      ids.push_back(static_cast<int32_t>((int64_t(i) * 7919) % vocab));
    w.append(ids.data(), 1000);
    w.append(ids.data() + 1000, ids.size() - 1000);
    auto s = w.finish();
    ASSERT_EQ(s->size(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(s->maxToken(), vocab - 1);
    for (int64_t first : {int64_t(0), int64_t(1), int64_t(2999990)}) {
      std::vector<int32_t> got(10);
      s->read(first, 10, got.data());
      EXPECT_EQ(got, std::vector<int32_t>(ids.begin() + first,
                                          ids.begin() + first + 10))
          << vocab << " " << first;
    }
  }
  TokenFileWriter narrow(256);
  int32_t wide = 65536;
  EXPECT_THROW(narrow.append(&wide, 1), Error);
}

// The streamed text and JSONL readers against the byte encoding done here:
// every byte, a 0 after each document; JSONL documents across read blocks.
TEST(Corpus, TextAndJsonlStreamsHoldEveryDocument) {
  auto bytes = createByteTokenizer();
  std::string txt = tempPath("big.txt"), jsonl = tempPath("big.jsonl");
  std::string text;
  std::vector<int32_t> expect;
  {
    std::ofstream f(jsonl);
    for (int d = 0; d < 3000; ++d) {
      std::string doc(1 + (d * 977) % 3000, static_cast<char>('a' + d % 26));
      doc[doc.size() / 2] = ' ';
      f << "{\"text\": \"" << doc << "\"}\n";
      for (unsigned char c : doc)
        expect.push_back(c);
      expect.push_back(0);
      text += doc;
    }
  }
  writeBytes(txt, text.data(), text.size());
  EXPECT_EQ(loadTokens(jsonl, "auto", bytes.get()), expect);
  std::vector<int32_t> asText(text.begin(), text.end());
  asText.push_back(0);
  EXPECT_EQ(loadTokens(txt, "auto", bytes.get()), asText);
  auto s = openTokens(txt, "auto", bytes.get());
  EXPECT_EQ(s->maxToken(), 'z');
  // A sample read from the stream is the slice the old in-memory loader
  // gave (sample i = tokens[i*T, i*T+T]).
  BatchLoader fromFile(s, 16, 3, true), inMemory(asText, 16, 3, true);
  std::vector<int32_t> a(16), b(16), c(16), d(16);
  for (int64_t g : {int64_t(0), int64_t(7), int64_t(100000), int64_t(999999)}) {
    fromFile.sample(g, a.data(), b.data());
    inMemory.sample(g, c.data(), d.data());
    EXPECT_EQ(a, c);
    EXPECT_EQ(b, d);
  }
}

TEST(WeightInit, RulesAndDeterminism) {
  EXPECT_EQ(initKindFor("h.0.ln_1.weight", {64}), InitKind::Ones);
  EXPECT_EQ(initKindFor("h.0.attn.c_attn.bias", {192}), InitKind::Zeros);
  EXPECT_EQ(initKindFor("norm.beta", {8}), InitKind::Zeros);
  EXPECT_EQ(initKindFor("wte.weight", {50257, 64}), InitKind::Normal);
  std::vector<float> a(10001), b(10001), c(10001);
  initParam("w", {101, 99}, 5, a.data());
  initParam("w", {101, 99}, 5, b.data());
  initParam("v", {101, 99}, 5, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0, sq = 0;
  for (float x : a) {
    mean += x;
    sq += double(x) * x;
  }
  mean /= a.size();
  double sd = std::sqrt(sq / a.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.001);
  // A tensor large enough to be filled in chunks on threads: the same bits
  // as one SplitMix64 stream, two draws per pair (odd size: the last pair
  // keeps only its cosine).
  const int64_t big = 3 * (int64_t(1) << 20) + 7;
  std::vector<float> chunked(big), one(big);
  initParam("h.weight", {big, 1}, 9, chunked.data());
  SplitMix64 rng(9 ^ fnv1a64("h.weight"));
  for (int64_t i = 0; i < big; i += 2) {
    double u1 = (rng.next() >> 11) * 0x1.0p-53;
    double u2 = (rng.next() >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    one[i] = static_cast<float>(0.02 * r * std::cos(2 * M_PI * u2));
    if (i + 1 < big)
      one[i + 1] = static_cast<float>(0.02 * r * std::sin(2 * M_PI * u2));
  }
  EXPECT_EQ(chunked, one);
}
