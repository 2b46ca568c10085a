//===- TrainTest.cpp - executor on the hand-built MLP plan ----------------===//
//
// Independent checks: gradients against central finite differences of the
// executor's own loss, accumulation over microbatches against separately
// computed microbatch gradients, and loss decrease when training.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

Plan parse(const PlanSpec &s) {
  std::vector<uint8_t> b = s.build();
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

/// Deterministic tokens/targets per (microbatch, row, position).
Executor::BatchFn fixedBatches(int b, int t, int vocab, int offset = 0) {
  return [=](int64_t, int mb, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < b * t; ++i) {
      int k = (mb + offset) * b * t + i;
      tok[i] = (k * 7 + 3) % vocab;
      tgt[i] = (k * 5 + 1) % vocab;
    }
  };
}

struct Fixture {
  Plan plan;
  std::unique_ptr<Backend> backend = createCpuBackend(2);
  std::unique_ptr<Communicator> comm = createLocalComm();
  std::unique_ptr<Executor> exec;
  explicit Fixture(const PlanSpec &s) : plan(parse(s)) {
    exec = std::make_unique<Executor>(plan, *backend, *comm);
    exec->initParams(1);
  }
};

/// Larger weights than the 0.02 init so every path carries signal.
void scaleParams(Executor &e) {
  Safetensors w = e.saveParams();
  for (auto &[name, t] : w.tensors) {
    std::vector<float> v = t.toF32(name);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = v[i] * 25 + 0.1f * std::sin(float(i + name.size()));
    t = StTensor::fromF32(t.shape, v.data());
  }
  e.loadParams(w, "test");
}

MlpOptions opts() {
  MlpOptions o;
  o.vocab = 11;
  o.hidden = 5;
  o.ffn = 7;
  o.batch = 2;
  o.seq = 4;
  return o;
}

} // namespace

TEST(Train, GradientsMatchFiniteDifferences) {
  MlpOptions o = opts();
  o.lr = 0; // the optimizer then leaves parameters unchanged
  Fixture f(mlpPlan(o));
  scaleParams(*f.exec);
  Safetensors w = f.exec->saveParams();
  auto batches = fixedBatches(o.batch, o.seq, o.vocab);
  Safetensors grads;
  f.exec->step(batches, [&](const Executor &e) { grads = e.saveGrads(); });

  const double eps = 1e-2;
  int checked = 0;
  for (auto &[name, t] : w.tensors) {
    std::vector<float> base = t.toF32(name);
    std::vector<float> g = grads.tensors.at(name).toF32(name);
    for (size_t i = 0; i < base.size(); i += 1 + base.size() / 6) {
      auto lossAt = [&](float delta) {
        std::vector<float> v = base;
        v[i] += delta;
        Safetensors p = w;
        p.tensors[name] = StTensor::fromF32(t.shape, v.data());
        f.exec->loadParams(p, "test");
        return f.exec->step(batches).loss;
      };
      double fd = (lossAt(eps) - lossAt(-eps)) / (2 * eps);
      EXPECT_NEAR(g[i], fd, 2e-3 + 0.02 * std::fabs(fd))
          << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Train, MicrobatchGradientsAverage) {
  MlpOptions o = opts();
  o.lr = 0;
  o.microbatches = 2;
  Fixture two(mlpPlan(o));
  Safetensors g2;
  two.exec->step(fixedBatches(o.batch, o.seq, o.vocab),
                 [&](const Executor &e) { g2 = e.saveGrads(); });

  o.microbatches = 1;
  Fixture one(mlpPlan(o));
  std::vector<Safetensors> parts(2);
  for (int mb = 0; mb < 2; ++mb)
    one.exec->step(fixedBatches(o.batch, o.seq, o.vocab, mb),
                   [&](const Executor &e) { parts[mb] = e.saveGrads(); });
  for (auto &[name, t] : g2.tensors) {
    std::vector<float> a = t.toF32(name),
                       p0 = parts[0].tensors[name].toF32(name),
                       p1 = parts[1].tensors[name].toF32(name);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], 0.5f * (p0[i] + p1[i]), 1e-6)
          << name << "[" << i << "]";
  }
}

TEST(Train, SgdAndAdamwReduceTheLoss) {
  for (const char *optName : {"sgd", "adamw"}) {
    MlpOptions o = opts();
    o.optimizer = optName;
    o.lr = std::string(optName) == "sgd" ? 0.1 : 0.02;
    Fixture f(mlpPlan(o));
    auto batches = fixedBatches(o.batch, o.seq, o.vocab);
    EXPECT_NEAR(f.exec->step(batches).loss, std::log(double(o.vocab)), 0.05)
        << "the 0.02-std init gives loss ~ ln V";
    scaleParams(*f.exec);
    double first = f.exec->step(batches).loss, last = first;
    for (int s = 1; s < 40; ++s)
      last = f.exec->step(batches).loss;
    EXPECT_LT(last, 0.5 * first) << optName;
    EXPECT_EQ(f.exec->stepsDone(), 41);
  }
}

TEST(Train, RuntimeDataErrorsAreReported) {
  MlpOptions o = opts();
  Fixture f(mlpPlan(o));
  auto bad = [](int64_t, int, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < 8; ++i)
      tok[i] = tgt[i] = 0;
    tok[3] = 1000;
  };
  try {
    f.exec->step(bad);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("embedding: id 1000 at position 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(Train, WeightsByNameWithClearErrors) {
  Fixture f(mlpPlan(opts()));
  Safetensors w = f.exec->saveParams();
  EXPECT_EQ(w.tensors.size(), 5u);
  w.tensors.erase("fc.bias");
  try {
    f.exec->loadParams(w, "w.safetensors");
    FAIL();
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'fc.bias'"),
              std::string::npos);
  }
}
