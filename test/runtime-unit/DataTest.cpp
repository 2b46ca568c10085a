//===- DataTest.cpp - packing, shuffle, corpora, weight init --------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
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
