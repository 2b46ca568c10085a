// The cost model and the auto-parallel search against closed forms and an
// independent exhaustive enumeration (docs/auto-parallel.md).
#include "mapp/cost/Search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

using namespace mapp::cost;

namespace {

/// A profile without overheads or latency, links of 80 Gb/s (10 B/ns).
Profile idealProfile() {
  Profile p;
  defaultProfile("h100", p);
  p.opOverheadUs = 0;
  p.runtimeReserveGiB = 0;
  p.intra = {80, 0};
  p.inter = {80, 0};
  return p;
}

ModelDims gpt(int layers, int hidden, int heads, int seq, int vocab) {
  ModelDims m;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kvHeads = heads;
  m.ffn = 4 * hidden;
  m.seq = seq;
  m.vocab = vocab;
  return m;
}

Cluster node(int devices, const std::string &kind = "h100") {
  Cluster c;
  c.deviceKind = kind;
  c.devicesPerNode = devices;
  c.source = "test";
  return c;
}

/// One device, one microbatch of `mbs` sequences, bf16 compute.
Layout oneStepBf16(int mbs) {
  Layout l;
  l.microBatch = mbs;
  l.microbatches = 1;
  l.compute = DType::BF16;
  return l;
}

/// A search of `m` on `world` devices, `perNode` to a node, ideal profile.
SearchRequest request(const ModelDims &m, int perNode, int world,
                      int globalBatch) {
  SearchRequest req;
  req.model = m;
  req.cluster = node(perNode);
  req.profile = idealProfile();
  req.world = world;
  req.globalBatch = globalBatch;
  return req;
}

TEST(CostSearch, RingCollectivesAndLinksAreTheirClosedForms) {
  Profile p = idealProfile();
  p.intra = {80, 3}; // 10 bytes per ns, 3 us a step
  Costs c(p);
  // All-reduce: 2(n-1) steps of latency + bytes/n at the link's rate.
  EXPECT_DOUBLE_EQ(c.collectiveNs(Costs::Coll::AllReduce, 4000, 4, true),
                   6 * (3000 + 1000 / 10.0));
  EXPECT_DOUBLE_EQ(c.collectiveNs(Costs::Coll::AllGather, 4000, 4, true),
                   3 * (3000 + 100.0));
  EXPECT_DOUBLE_EQ(c.collectiveNs(Costs::Coll::AllReduce, 4000, 1, true), 0);
  EXPECT_DOUBLE_EQ(c.p2pNs(1000, true), 3000 + 100);
  // Shared-memory collectives (the thread communicator): 3 barriers and 2x
  // the bytes for an all-reduce, 2 and 1x for the others, whatever n.
  Profile shm = p;
  ASSERT_TRUE(parseProfile(R"({"device":"cpu","gemm_tflops":{"f32":1},
      "collectives":"shared-memory","links":{"intra":{"gbps":80,"latency_us":3}}})",
                           "shm.json", shm, nullptr));
  Costs cs(shm);
  for (int n : {2, 4, 8}) {
    EXPECT_DOUBLE_EQ(cs.collectiveNs(Costs::Coll::AllReduce, 4000, n, true),
                     3 * 3000 + 2 * 4000 / 10.0);
    EXPECT_DOUBLE_EQ(cs.collectiveNs(Costs::Coll::AllGather, 4000, n, true),
                     2 * 3000 + 4000 / 10.0);
  }
  EXPECT_DOUBLE_EQ(cs.collectiveNs(Costs::Coll::AllReduce, 4000, 1, true), 0);
  // An instruction is its roofline plus the overhead.
  p.opOverheadUs = 2;
  p.gemmTflopsF32 = 1; // 1000 FLOP per ns
  p.memGBps = 10;      // 10 bytes per ns
  Costs c2(p);
  EXPECT_DOUBLE_EQ(c2.instrNs(1e6, 100), 1000 + 2000);
  EXPECT_DOUBLE_EQ(c2.instrNs(0, 1e5), 1e4 + 2000);
}

TEST(CostSearch, OneFOneBIsTheClosedFormOnUniformStages) {
  // Stages are uniform when the embedding and head cost nothing next to
  // the layers: the pipeline's step is (m + p - 1) stage-microbatches.
  ModelDims m = gpt(8, 1024, 16, 512, 8);
  Profile p = idealProfile();
  Cluster c = node(8);
  Layout one;
  one.microBatch = 1;
  one.microbatches = 8;
  one.compute = DType::BF16;
  Layout pipe = one;
  pipe.pp = 4;
  double t1 = predict(m, one, c, p).computeMs;
  Prediction pp4 = predict(m, pipe, c, p);
  // One stage computes 1/4 of the layers: (8 + 4 - 1)/4 of t1 over 8.
  EXPECT_NEAR(pp4.computeMs, t1 * (8 + 4 - 1) / (4.0 * 8), t1 * 0.01);
  EXPECT_NEAR(pp4.bubbleFraction, 3.0 / 11, 0.01);
  // Interleaved with v chunks: the ramp shrinks by v.
  Layout inter = pipe;
  inter.schedule = "interleaved";
  inter.chunks = 2;
  EXPECT_NEAR(predict(m, inter, c, p).computeMs,
              t1 * (8 + 3 / 2.0) / (4.0 * 8), t1 * 0.01);
}

TEST(CostSearch, SearchFindsTheExhaustiveMinimum) {
  // An independent enumeration of every layout of the space (no pruning)
  // finds the same best layout and the same number of feasible ones.
  ModelDims m = gpt(8, 256, 8, 128, 512);
  SearchRequest req = request(m, 8, 16, 32);
  req.profile.opOverheadUs = 3;
  req.profile.intra = {400, 2};
  req.space.schedules = {"1f1b", "interleaved", "zb-h1"};
  req.space.recomputes = {Recompute::None, Recompute::Full};
  req.space.chunks = {1, 2};
  req.space.zero1 = true;
  req.space.computes = {DType::BF16};
  req.space.storages = {DType::F32};
  req.memCapBytes = 0.02 * (1 << 30); // binding: some layouts do not fit
  SearchResult res;
  std::string err;
  ASSERT_TRUE(search(req, res, &err)) << err;

  double best = INFINITY;
  size_t feasible = 0;
  for (int tp = 1; tp <= 16; ++tp)
    for (int pp = 1; pp <= 16; ++pp)
      for (int dp = 1; dp <= 16; ++dp)
        for (int mbs = 1; mbs <= 32; ++mbs)
          for (const char *s : {"1f1b", "interleaved", "zb-h1"})
            for (int v : {1, 2})
              for (Recompute rc : {Recompute::None, Recompute::Full})
                for (bool z : {false, true}) {
                  if (tp * pp * dp != 16 || 32 % (mbs * dp) || mbs > 16)
                    continue;
                  Layout l;
                  l.tp = tp;
                  l.pp = pp;
                  l.dp = dp;
                  l.microBatch = mbs;
                  l.microbatches = 32 / (mbs * dp);
                  l.schedule = s;
                  l.chunks = v;
                  l.recompute = rc;
                  l.zero1 = z;
                  l.compute = DType::BF16;
                  if (!validLayout(m, l, 16, 32, req.cluster, true, nullptr))
                    continue;
                  Prediction p = predict(m, l, req.cluster, req.profile);
                  if (p.peakBytes > req.memCapBytes)
                    continue;
                  ++feasible;
                  best = std::min(best, p.stepMs);
                }
  EXPECT_EQ(res.feasible, feasible);
  ASSERT_FALSE(res.top.empty());
  EXPECT_DOUBLE_EQ(res.top.front().pred.stepMs, best);
  EXPECT_GT(res.overCap, 0u); // the cap did bind
  for (const Ranked &r : res.top)
    EXPECT_LE(r.pred.peakBytes, req.memCapBytes);
}

TEST(CostSearch, TensorParallelStaysInsideANode) {
  ModelDims m = gpt(8, 1024, 16, 512, 1024);
  SearchRequest req = request(m, 4, 16, 16);
  req.top = 1000;
  SearchResult res;
  std::string err;
  ASSERT_TRUE(search(req, res, &err)) << err;
  for (const Ranked &r : res.top)
    EXPECT_LE(r.layout.tp, 4) << r.layout.brief();
}

TEST(CostSearch, CapBelowEveryLayoutNamesTheSmallestAndTheKnob) {
  ModelDims m = gpt(4, 256, 8, 128, 512);
  SearchRequest req = request(m, 8, 2, 8);
  req.memCapBytes = 1 << 20; // 1 MiB
  SearchResult res;
  std::string err;
  ASSERT_FALSE(search(req, res, &err));
  EXPECT_NE(err.find("no layout fits mem-cap 1.0 MiB"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the smallest needs"), std::string::npos) << err;
  // The smallest is the least memory of all priced layouts.
  EXPECT_NE(err.find(res.smallest.layout.brief()), std::string::npos) << err;
  EXPECT_TRUE(err.find("allow") != std::string::npos ||
              err.find("more devices") != std::string::npos)
      << err;
}

TEST(CostSearch, WorldWithoutFactorizationIsAnError) {
  // 7 devices, 8 heads, global batch 8: tp 7 does not divide the heads, dp
  // 7 does not divide the batch, pp 7 is at most the layers but leaves dp
  // = 1 -- and pp 7 with 4 layers is more stages than layers.
  ModelDims m = gpt(4, 256, 8, 128, 512);
  SearchRequest req = request(m, 8, 7, 8);
  SearchResult res;
  std::string err;
  ASSERT_FALSE(search(req, res, &err));
  EXPECT_NE(err.find("world=7 has no valid factorization"), std::string::npos)
      << err;
}

TEST(CostSearch, MegatronSeedClaimIsImpossible) {
  // GPT-3 175B at sequence 2048: 120 samples/s on 256 A100s needs about
  // 1,000 TFLOP/s per device against a 312 TFLOP/s peak.
  ModelDims m = gpt(96, 12288, 96, 2048, 51200);
  Profile a100;
  ASSERT_TRUE(defaultProfile("a100", a100));
  std::string err;
  EXPECT_FALSE(checkThroughputClaim(m, 120, 256, a100, &err));
  EXPECT_NE(err.find("against a peak of 312: impossible"), std::string::npos)
      << err;
  double need = m.trainFlopsPerSequence() * 120 / 256 / 1e12;
  EXPECT_GT(need, 950);
  EXPECT_LT(need, 1150);
  // A claim within the peak passes.
  EXPECT_TRUE(checkThroughputClaim(m, 30, 256, a100, &err));
}

TEST(CostSearch, ProfileAndClusterKeysAreChecked) {
  Profile p;
  std::string err;
  EXPECT_FALSE(parseProfile(R"({"device":"cpu","gemm_tflop":{"f32":1}})",
                            "p.json", p, &err));
  EXPECT_EQ(err.rfind("p.json: key 'gemm_tflop': unknown key", 0), 0u) << err;
  EXPECT_FALSE(parseProfile(
      R"({"device":"cpu","links":{"inter":{"gbps":-3}}})", "p.json", p, &err));
  EXPECT_EQ(err.rfind("p.json: key 'links.inter.gbps': expected a positive", 0),
            0u)
      << err;
  EXPECT_FALSE(parseProfile(R"({"device":"cpu","collectives":"tree"})",
                            "p.json", p, &err));
  EXPECT_EQ(err.rfind("p.json: key 'collectives': expected \"ring\"", 0), 0u) << err;
  EXPECT_FALSE(parseProfile(R"({"device":"cpu","attention_scores":"hbm"})",
                            "p.json", p, &err));
  EXPECT_EQ(err.rfind("p.json: key 'attention_scores': expected \"memory\"", 0), 0u)
      << err;
  EXPECT_FALSE(parseProfile(R"({"device":"tpu"})", "p.json", p, &err));
  EXPECT_NE(err.find("unknown device kind 'tpu'"), std::string::npos) << err;
  Cluster c;
  EXPECT_FALSE(parseCluster(R"({"gpus_per_node": 2.5})", "c.json", c, &err));
  EXPECT_EQ(err.rfind("c.json: key 'gpus_per_node'", 0), 0u) << err;
  EXPECT_FALSE(parseCluster(R"({"nodes": 2, "inner": {}})", "c.json", c, &err));
  EXPECT_EQ(err.rfind("c.json: key 'inner': unknown key", 0), 0u) << err;
  // A profile of another device kind: used, with a warning naming both.
  ASSERT_TRUE(parseProfile(R"({"device":"a100"})", "a.json", p, &err)) << err;
  ASSERT_TRUE(parseCluster(R"({"device":"h100"})", "c.json", c, &err)) << err;
  std::vector<std::string> warnings;
  Profile eff = effectiveProfile(c, &p, warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("a100"), std::string::npos);
  EXPECT_NE(warnings[0].find("h100"), std::string::npos);
  EXPECT_EQ(eff.deviceKind, "a100");
}

} // namespace

// Attention's score rows are streamed bytes where the kernel puts them in
// memory (the CPU's), not where a fused GPU kernel keeps them on chip
// (its calibrated rate is all of its cost): by device kind, or the
// profile's "attention_scores". The difference is the closed form
// 3 · e·4·n·T·heads / bandwidth per layer (forward once, backward twice).
TEST(CostSearch, AttentionScoreRowsStreamOnlyWhereTheyLeaveTheChip) {
  Profile cpu, h100;
  ASSERT_TRUE(defaultProfile("cpu", cpu));
  ASSERT_TRUE(defaultProfile("h100", h100));
  EXPECT_TRUE(cpu.attentionScoresInMemory);
  EXPECT_FALSE(h100.attentionScoresInMemory);
  std::string err;
  Profile q;
  ASSERT_TRUE(parseProfile(R"({"device":"h100","attention_scores":"memory"})",
                           "q.json", q, &err))
      << err;
  EXPECT_TRUE(q.attentionScoresInMemory);
  Profile back;
  ASSERT_TRUE(parseProfile(profileJson(h100), "h.json", back, &err)) << err;
  EXPECT_FALSE(back.attentionScoresInMemory);
  ASSERT_TRUE(parseProfile(profileJson(q), "q2.json", back, &err)) << err;
  EXPECT_TRUE(back.attentionScoresInMemory);
  ModelDims m = gpt(4, 1024, 16, 2048, 32000);
  Layout l = oneStepBf16(2);
  Cluster c = node(1);
  Prediction on = predict(m, l, c, h100), off = predict(m, l, c, q);
  const double e = 2, n = 2.0 * 2048;
  double perLayerNs = 3 * e * 4 * n * 2048 * 16 / h100.memGBps;
  EXPECT_NEAR((off.stepMs - on.stepMs) * 1e6, 4 * perLayerNs, 1e-3 * perLayerNs);
}

TEST(CostSearch, MemoryBesideThePlanIsShadowsLogitsAndTheReserve) {
  // A low-precision backend holds a bf16 shadow of every weight and a bf16
  // copy of the logits' gradient beside the plan, plus its reserve: closed
  // forms, and the profile key round-trips.
  Profile h100;
  ASSERT_TRUE(defaultProfile("h100", h100));
  EXPECT_GT(h100.runtimeReserveGiB, 0);
  Profile cpu;
  ASSERT_TRUE(defaultProfile("cpu", cpu));
  EXPECT_EQ(cpu.runtimeReserveGiB, 0);
  std::string err;
  Profile q;
  ASSERT_TRUE(parseProfile(R"({"device":"h100","runtime_reserve_gib":1.5})",
                           "q.json", q, &err))
      << err;
  EXPECT_EQ(q.runtimeReserveGiB, 1.5);
  Profile back;
  ASSERT_TRUE(parseProfile(profileJson(q), "q2.json", back, &err)) << err;
  EXPECT_EQ(back.runtimeReserveGiB, 1.5);
  Profile bad;
  EXPECT_FALSE(parseProfile(R"({"device":"h100","runtime_reserve_gib":-1})",
                            "bad.json", bad, &err));
  EXPECT_NE(err.find("runtime_reserve_gib"), std::string::npos) << err;

  ModelDims m = gpt(4, 1024, 16, 2048, 32000);
  Layout l = oneStepBf16(2);
  Cluster c = node(1);
  Prediction bf16 = predict(m, l, c, q);
  const double gib = 1073741824.0;
  // One stage: the layers, the tied embedding and the learned positions.
  double params = m.layers * m.layerParams() + (32000.0 + 2048) * 1024;
  EXPECT_NEAR(bf16.outsidePlanBytes,
              2 * params + 2 * 2.0 * 2048 * 32000 + 1.5 * gib, 1e-6 * gib);
  EXPECT_NEAR(bf16.peakBytes,
              bf16.paramStateBytes + bf16.activationBytes +
                  bf16.workspaceBytes + bf16.outsidePlanBytes,
              1);
  l.compute = DType::F32; // no shadows, no low-precision copy
  EXPECT_NEAR(predict(m, l, c, q).outsidePlanBytes, 1.5 * gib, 1e-6 * gib);
}

TEST(CostSearch, CapSlackKeepsLayoutsForThePlannerAndFlagsThem) {
  // With slack, layouts predicted a little over the cap stay ranked and are
  // flagged; none of them is over cap x (1 + slack); without it none stays.
  ModelDims m = gpt(8, 1024, 16, 1024, 32000);
  SearchRequest req = request(m, 1, 1, 16);
  req.top = 100;
  SearchResult all;
  std::string err;
  req.memCapBytes = 1e15;
  ASSERT_TRUE(search(req, all, &err)) << err;
  // A cap between the smallest and the largest peak.
  std::vector<double> peaks;
  for (const Ranked &r : all.top)
    peaks.push_back(r.pred.peakBytes);
  std::sort(peaks.begin(), peaks.end());
  req.memCapBytes = peaks[peaks.size() / 2];
  SearchResult strict, slack;
  ASSERT_TRUE(search(req, strict, &err)) << err;
  req.capSlack = 0.15;
  ASSERT_TRUE(search(req, slack, &err)) << err;
  size_t flagged = 0;
  for (const Ranked &r : strict.top) {
    EXPECT_LE(r.pred.peakBytes, req.memCapBytes);
    EXPECT_FALSE(r.overCapPredicted);
  }
  for (const Ranked &r : slack.top) {
    EXPECT_LE(r.pred.peakBytes, req.memCapBytes * 1.15);
    EXPECT_EQ(r.overCapPredicted, r.pred.peakBytes > req.memCapBytes);
    flagged += r.overCapPredicted;
  }
  size_t between = 0;
  for (double p : peaks)
    between += p > req.memCapBytes && p <= req.memCapBytes * 1.15;
  EXPECT_GT(between, 0u);
  EXPECT_EQ(flagged, between);
  EXPECT_EQ(slack.top.size(), strict.top.size() + between);
  EXPECT_EQ(slack.feasible, strict.feasible); // kept is not "fits"
  EXPECT_NE(formatRanking(req, slack).find("the memory planner decides"),
            std::string::npos);
}

TEST(CostSearch, GemmRatesPriceEachProductAtItsSize) {
  std::string err;
  Profile p;
  ASSERT_TRUE(parseProfile(R"({"device":"cpu","gemm_tflops":{"f32":0.02},
      "gemm_rates":{"f32":[[32,0.01],[128,0.04]]}})",
                           "r.json", p, &err))
      << err;
  // Log-log between the points, the nearer point's rate outside them, the
  // flat rate for a dtype without points.
  EXPECT_DOUBLE_EQ(gemmTflops(p, DType::F32, 16), 0.01);
  EXPECT_NEAR(gemmTflops(p, DType::F32, 64), 0.02, 1e-15);
  EXPECT_DOUBLE_EQ(gemmTflops(p, DType::F32, 512), 0.04);
  EXPECT_DOUBLE_EQ(gemmTflops(p, DType::F32, 0), 0.02);
  Profile back;
  ASSERT_TRUE(parseProfile(profileJson(p), "back.json", back, &err)) << err;
  ASSERT_EQ(back.gemmRatesF32.size(), 2u);
  EXPECT_DOUBLE_EQ(back.gemmRatesF32[1].dim, 128);
  EXPECT_DOUBLE_EQ(back.gemmRatesF32[1].tflops, 0.04);

  // A flat table prices every layout as the flat rate does (the layer's
  // products at their shapes add up to the model's GEMM FLOPs, experts over
  // ep included); halving the table's rate adds exactly the step's GEMM
  // FLOPs at the rate once more.
  ModelDims dense = gpt(4, 64, 4, 32, 256);
  ModelDims moe = dense;
  moe.experts = 4;
  moe.topk = 2;
  moe.moeFfn = 128;
  Profile flat, table, half;
  ASSERT_TRUE(defaultProfile("cpu", flat));
  flat.opOverheadUs = 0;
  table = flat;
  table.gemmRatesF32 = {{1, flat.gemmTflopsF32}, {1e6, flat.gemmTflopsF32}};
  half = table;
  half.gemmRatesF32 = {{1, flat.gemmTflopsF32 / 2}, {1e6, flat.gemmTflopsF32 / 2}};
  Cluster c = node(8, "cpu");
  for (const ModelDims &m : {dense, moe})
    for (int ep : {1, 2}) {
      if (ep > 1 && !m.experts)
        continue;
      Layout l;
      l.microBatch = 2;
      l.dp = ep;
      l.ep = ep;
      l.compute = DType::F32;
      double f = predict(m, l, c, flat).stepMs;
      EXPECT_NEAR(predict(m, l, c, table).stepMs, f, 1e-9 * f) << m.experts << ep;
      double attention = 3.0 * m.layers * 4 * m.seq * m.seq * m.hidden;
      double gemmFlops = l.microBatch * (m.trainFlopsPerSequence() - attention);
      EXPECT_NEAR(predict(m, l, c, half).stepMs - f,
                  gemmFlops / (flat.gemmTflopsF32 * 1e12) * 1e3, 1e-6 * f)
          << m.experts << ep;
    }

  for (const char *bad :
       {R"({"device":"cpu","gemm_rates":{"f32":[[64,1],[32,2]]}})",
        R"({"device":"cpu","gemm_rates":{"f16":[[64,1]]}})",
        R"({"device":"cpu","gemm_rates":{"f32":[[64]]}})",
        R"({"device":"cpu","gemm_rates":{"f32":[[64,-1]]}})",
        R"({"device":"cpu","gemm_rates":[[64,1]]})"})
    EXPECT_FALSE(parseProfile(bad, "bad.json", p, &err)) << bad;
  EXPECT_FALSE(parseProfile(R"({"device":"cpu","gemm_rates":{"f32":[[64,1],[32,2]]}})",
                            "bad.json", p, &err));
  EXPECT_NE(err.find("key 'gemm_rates.f32[1]': dimensions must increase"),
            std::string::npos)
      << err;
}

TEST(CostSearch, ActivationFunctionsCostTheirElementsBeyondTheirBytes) {
  std::string err;
  Profile p;
  ASSERT_TRUE(parseProfile(R"({"device":"cpu","mem_gbps":8,"op_overhead_us":0,
      "activation_gelems":0.1})",
                           "a.json", p, &err))
      << err;
  Costs c(p);
  // 1e6 elements at 0.1 G/s: 1e7 ns, less their 8e6 bytes at 8 GB/s.
  EXPECT_DOUBLE_EQ(c.activationNs(1e6, 8e6), 1e7 - 1e6);
  EXPECT_DOUBLE_EQ(c.activationNs(1e6, 8e9), 0); // bandwidth-bound
  Profile back;
  ASSERT_TRUE(parseProfile(profileJson(p), "back.json", back, &err)) << err;
  EXPECT_DOUBLE_EQ(back.activationGelems, 0.1);
  EXPECT_FALSE(parseProfile(R"({"device":"cpu","activation_gelems":-1})",
                            "bad.json", back, &err));
  EXPECT_NE(err.find("key 'activation_gelems'"), std::string::npos) << err;

  // One rank, one microbatch: each layer's MLP activation once forward and
  // once backward (its gradient), each n·ffn elements.
  ModelDims m = gpt(4, 64, 4, 32, 256);
  Profile none = p;
  none.activationGelems = 0;
  Layout l;
  l.microBatch = 2;
  l.compute = DType::F32;
  Cluster one = node(1, "cpu");
  double elems = 2.0 * 32 * m.ffn;
  double perLayerNs = 2 * (elems / 0.1 - 2 * 4 * elems / 8);
  EXPECT_NEAR((predict(m, l, one, p).stepMs - predict(m, l, one, none).stepMs) * 1e6,
              m.layers * perLayerNs, 1e-6 * m.layers * perLayerNs);
}
