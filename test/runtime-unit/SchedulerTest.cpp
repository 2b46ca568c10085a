// MegaDPP's run-time scheduler (runtime/src/sched) on the thread world: the
// adaptive order gives the static table's losses bit for bit (gradients of a
// block accumulate in microbatch order under every policy), switches to
// breadth-first under a slow link, keeps the memory cap, never deadlocks
// under random link delays, and rejects what it cannot serve.
#include "TestPlans.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Faults.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

Plan parse(const std::vector<uint8_t> &b) { return parsePlan(b.data(), b.size()); }

struct RunResult {
  std::vector<double> losses;                // per step (world-wide)
  std::vector<SchedStats> stats;             // per rank
  std::vector<std::vector<SchedSwitch>> sw;  // per rank
  std::vector<std::string> errors;           // per rank ("" = ok)
};

// --- A backend whose sends are letters (the CUDA device-local protocol on
// the CPU): the payload waits in a process-wide mailbox and the message
// through the communicator names it, so a posted receive of the adaptive
// scheduler must take the letter's size and the backend must finish it.

struct Letter {
  uint64_t id;
  int64_t n;
};

std::mutex mailMu;
std::map<uint64_t, std::vector<float>> mailbox;
uint64_t lettersSent = 0;

int64_t messageTag(const KernelArgs &a) {
  return a.attrs.getInt("tag", 0) * a.ctx.numMicrobatches + a.ctx.microbatch;
}

void takeLetter(const Letter &l, const Tensor &out) {
  std::lock_guard<std::mutex> lk(mailMu);
  auto it = mailbox.find(l.id);
  if (it == mailbox.end() || l.n != out.numel())
    fail("letter ", l.id, " of ", l.n, " floats: no such payload for ",
         out.numel());
  std::copy(it->second.begin(), it->second.end(), static_cast<float *>(out.data));
  mailbox.erase(it);
}

void letterSend(const KernelArgs &a) {
  const Tensor &in = a.in[0];
  const float *p = static_cast<const float *>(in.data);
  Letter l{0, in.numel()};
  {
    std::lock_guard<std::mutex> lk(mailMu);
    l.id = ++lettersSent;
    mailbox[l.id].assign(p, p + in.numel());
  }
  a.ctx.comm->send(&l, sizeof l, static_cast<int>(a.attrs.getInt("peer", 0)),
                   messageTag(a));
}

void letterRecv(const KernelArgs &a) {
  Letter l{};
  a.ctx.comm->recv(&l, sizeof l, static_cast<int>(a.attrs.getInt("peer", 0)),
                   messageTag(a));
  takeLetter(l, a.out[0]);
}

class LetterBackend final : public Backend {
public:
  LetterBackend() : cpu_(createCpuBackend(1)) {}
  std::string name() const override { return "cpu-letters"; }
  KernelFn lookup(const std::string &k) const override {
    return k == "send" ? letterSend : k == "recv" ? letterRecv : cpu_->lookup(k);
  }
  void *allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void release(void *p) override { cpu_->release(p); }
  ThreadPool &pool() override { return cpu_->pool(); }
  size_t postedRecvBytes(Communicator &, const Value &) override {
    return sizeof(Letter);
  }
  bool takePostedRecv(Communicator &, const void *msg, const Tensor &out, int,
                      int64_t) override {
    Letter l;
    std::memcpy(&l, msg, sizeof l);
    takeLetter(l, out);
    return true;
  }

private:
  std::unique_ptr<Backend> cpu_;
};

/// Trains `steps` steps of `plan` on a thread world with the given faults
/// and scheduler options (on LetterBackends when `letters`).
RunResult train(const Plan &plan, int steps, const std::vector<Injection> &inj,
                const SchedOptions &so, double timeout = 60,
                bool letters = false) {
  int n = plan.worldSize;
  std::unique_ptr<LocalWorld> w = createLocalWorld(n);
  RunResult res;
  res.losses.assign(steps, 0);
  res.stats.resize(n);
  res.sw.resize(n);
  res.errors.assign(n, "");
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        auto base = w->connect(r);
        base->setTimeout(timeout);
        auto c = withLinkFaults(std::move(base), inj);
        std::unique_ptr<Backend> be =
            letters ? std::make_unique<LetterBackend>() : createCpuBackend(1);
        Executor e(plan, *be, *c);
        e.setScheduler(so);
        e.initParams(3);
        auto batches = [&](int64_t step, int mb, int32_t *tok, int32_t *tgt) {
          int nt = plan.microBatchSize * plan.seqLength;
          for (int i = 0; i < nt; ++i) {
            tok[i] = static_cast<int32_t>((step * 7 + mb * 3 + i) % plan.vocabSize);
            tgt[i] = static_cast<int32_t>((step * 5 + mb + 2 * i) % plan.vocabSize);
          }
        };
        for (int s = 0; s < steps; ++s) {
          StepResult sr = e.step(batches);
          if (r == 0)
            res.losses[s] = sr.globalLoss;
          for (SchedSwitch &x : e.takeSchedSwitches())
            res.sw[r].push_back(x);
        }
        res.stats[r] = e.schedStats();
      } catch (const std::exception &ex) {
        res.errors[r] = ex.what();
        w->abort(r, ex.what());
      }
    });
  for (auto &t : th)
    t.join();
  return res;
}

MultiPlanSpec mlp(int tp, int pp, int dp, int chunks, int mb,
                  const std::string &dpp, uint64_t cap = 0) {
  MlpOptions o;
  o.vocab = 16;
  o.hidden = 8;
  o.ffn = 12;
  o.microbatches = mb;
  ParallelOptions po;
  po.tp = tp;
  po.pp = pp;
  po.dp = dp;
  po.chunks = chunks;
  po.dpp = dpp;
  po.adaptive.memCapBytes = cap;
  po.stashBytes = 1000; // planned accounting unit: caps below count in 1000s
  return parallelMlpPlan(o, po);
}

void expectOk(const RunResult &r) {
  std::string all;
  for (size_t i = 0; i < r.errors.size(); ++i)
    if (!r.errors[i].empty())
      all += "\n  rank " + std::to_string(i) + ": " + r.errors[i];
  EXPECT_EQ(all, "");
}

} // namespace

// Static dfc, static bfc and adaptive (with and without a slow link) give
// identical losses; the slowed run switches to bfc, naming the link.
TEST(Scheduler, AdaptiveMatchesStaticAndSwitchesUnderASlowLink) {
  for (auto [tp, pp, dp] : {std::tuple{1, 2, 1}, std::tuple{2, 2, 2}}) {
    Plan dfc = parse(mlp(tp, pp, dp, 2, 4, "dfc").build());
    Plan bfc = parse(mlp(tp, pp, dp, 2, 4, "bfc").build());
    Plan ada = parse(mlp(tp, pp, dp, 2, 4, "adaptive").build());
    RunResult a = train(dfc, 3, {}, {}, 20);
    RunResult b = train(bfc, 3, {}, {});
    RunResult c = train(ada, 3, {}, {}, 20);
    // Rank tp*dp (stage 1, tp 0) -> rank 0: the backward link into stage 0,
    // from step 2 (step 0 is warm-up, step 1 gives the link's best).
    std::string link = "link-delay:src=" + std::to_string(tp * dp) +
                       ",dst=0,us=15000,from-step=2";
    RunResult d = train(ada, 4, {parseInjection(link)}, {}, 20);
    for (const RunResult *r : {&a, &b, &c, &d})
      expectOk(*r);
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(a.losses[s], b.losses[s]) << "bfc, step " << s;
      EXPECT_EQ(a.losses[s], c.losses[s]) << "adaptive, step " << s;
      EXPECT_EQ(a.losses[s], d.losses[s]) << "adaptive slowed, step " << s;
    }
    EXPECT_EQ(c.stats[0].mode, "adaptive");
    // (Scheduling noise on a loaded machine may look like a slow link; the
    // fault's own switch names the link.)
    bool switched = false;
    for (const SchedSwitch &s : d.sw[0])
      if (s.to == "bfc" &&
          s.reason.find("link " + std::to_string(tp * dp) + "->0 slow") !=
              std::string::npos)
        switched = true;
    EXPECT_TRUE(switched) << "tp" << tp << ": no switch to bfc under the slow link";
    // Ranks of a tp group took the same decisions.
    if (tp == 2) {
      ASSERT_EQ(d.sw[0].size(), d.sw[1].size());
      EXPECT_EQ(d.stats[0].decisions, d.stats[1].decisions);
    }
  }
}

// Sends that are letters naming the payload (the CUDA device-local
// protocol): the adaptive scheduler's posted receives take the letter, the
// backend finishes them, and the losses equal the static table's bit for
// bit, with and without a slow link; every letter is taken.
TEST(Scheduler, PostedReceivesTakeTheBackendsLetters) {
  Plan dfc = parse(mlp(1, 2, 1, 2, 4, "dfc").build());
  Plan ada = parse(mlp(1, 2, 1, 2, 4, "adaptive").build());
  RunResult ref = train(dfc, 4, {}, {});
  uint64_t before = lettersSent;
  RunResult plain = train(ada, 4, {}, {}, 20, true);
  RunResult slowed = train(
      ada, 4, {parseInjection("link-delay:src=1,dst=0,us=15000,from-step=2")},
      {}, 20, true);
  expectOk(ref);
  expectOk(plain);
  expectOk(slowed);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(ref.losses[s], plain.losses[s]) << "step " << s;
    EXPECT_EQ(ref.losses[s], slowed.losses[s]) << "slowed, step " << s;
  }
  // 2 stages x 2 chunks x 4 microbatches: forward and backward edges.
  EXPECT_GT(lettersSent - before, 0u);
  std::lock_guard<std::mutex> lk(mailMu);
  EXPECT_TRUE(mailbox.empty()) << mailbox.size() << " letters never taken";
}

// Random link delays (and random caps): every run completes, matches the
// static losses and never holds more stash than its cap.
TEST(Scheduler, RandomDelaysNeverDeadlockAndKeepTheCap) {
  Plan dfc = parse(mlp(1, 2, 1, 2, 4, "dfc").build());
  RunResult ref = train(dfc, 2, {}, {});
  expectOk(ref);
  std::mt19937 rng(14);
  for (int trial = 0; trial < 12; ++trial) {
    int pp = trial % 3 == 2 ? 4 : 2;
    int chunks = pp == 4 ? 1 : 2, m = 4;
    Plan ada = parse(mlp(1, pp, 1, chunks, m, "adaptive").build());
    std::vector<Injection> inj;
    for (int k = 0; k < 3; ++k) {
      int a = static_cast<int>(rng() % pp), b = static_cast<int>(rng() % pp);
      if (a == b)
        continue;
      inj.push_back(parseInjection(
          "link-delay:src=" + std::to_string(a) + ",dst=" + std::to_string(b) +
          ",us=" + std::to_string(500 + rng() % 4000)));
    }
    // Between one microbatch (chunks x 1000) and all of them.
    uint64_t cap = 1000 * chunks * (1 + rng() % m);
    SchedOptions so;
    so.memCapBytes = cap;
    RunResult r = train(ada, 2, inj, so, 30);
    expectOk(r);
    for (const SchedStats &st : r.stats) {
      EXPECT_LE(st.peakStashBytes, cap) << "trial " << trial;
      EXPECT_GT(st.peakStashBytes, 0u);
    }
    if (pp == 2)
      for (int s = 0; s < 2; ++s)
        EXPECT_EQ(r.losses[s], ref.losses[s]) << "trial " << trial;
  }
}

TEST(Scheduler, RejectsWhatItCannotServe) {
  Plan ada = parse(mlp(1, 2, 1, 2, 4, "adaptive").build());
  SchedOptions tiny;
  tiny.memCapBytes = 1999; // one microbatch is 2 chunks x 1000
  RunResult r = train(ada, 1, {}, tiny, 10);
  EXPECT_NE(r.errors[0].find("below one microbatch's activations"),
            std::string::npos)
      << r.errors[0];
  // A static plan has no tables to adapt between.
  Plan dfc = parse(mlp(1, 2, 1, 2, 4, "dfc").build());
  SchedOptions want;
  want.mode = "adaptive";
  r = train(dfc, 1, {}, want, 10);
  EXPECT_NE(r.errors[0].find("'dfc' and 'bfc' schedule tables"),
            std::string::npos)
      << r.errors[0];
  // Tables that disagree (bfc misses a task): the plan loader refuses them
  // before a scheduler sees them.
  MultiPlanSpec bad = mlp(1, 2, 1, 2, 4, "adaptive");
  bad.programs[0].scheduleTables[1].second.erase(
      bad.programs[0].scheduleTables[1].second.begin());
  try {
    parse(bad.build());
    ADD_FAILURE() << "a bfc table missing a task was loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "schedule table 'bfc' is not a permutation"),
              std::string::npos)
        << e.what();
  }
  want.mode = "sideways";
  r = train(dfc, 1, {}, want, 10);
  EXPECT_NE(r.errors[0].find("unknown scheduler"), std::string::npos)
      << r.errors[0];
}
