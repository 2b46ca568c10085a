//===- WaitCommTest.cpp - where the executor joins async collectives ------===//
//
// A device backend may leave grad_sync's collective running on a stream of
// its own (CUDA + NCCL) and join it in Backend::waitComm. The executor must
// call waitComm once per step, after the whole backward is issued and
// before anything reads the gradients: the after-gradients hook, the norm
// (sumSquares), the optimizer kernels and the next step's gradient zeroing.
// A CPU backend that logs every kernel launch, waitComm, sumSquares and
// zeroStorage checks that order on the hand-built MLP plan (two
// microbatches, so the backward runs twice before the optimizer).
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

constexpr int kMaxKernels = 64;

/// The real kernel behind each logging trampoline (KernelFn is a plain
/// function pointer: one template instance per kernel name).
struct KernelRegistry {
  std::array<KernelFn, kMaxKernels> real{};
  std::array<std::string, kMaxKernels> name;
  int used = 0;
};
KernelRegistry &registry() {
  static KernelRegistry r;
  return r;
}

class OrderLoggingBackend;
template <int I> void loggedKernel(const KernelArgs &a);

template <int... I>
constexpr std::array<KernelFn, sizeof...(I)>
trampolines(std::integer_sequence<int, I...>) {
  return {&loggedKernel<I>...};
}

class OrderLoggingBackend final : public Backend {
public:
  std::unique_ptr<Backend> cpu = createCpuBackend(1);
  std::vector<std::string> log;

  std::string name() const override { return "order-logging-cpu"; }
  KernelFn lookup(const std::string &k) const override {
    KernelFn real = cpu->lookup(k);
    if (!real)
      return nullptr;
    KernelRegistry &r = registry();
    for (int i = 0; i < r.used; ++i)
      if (r.name[i] == k)
        return kTable[i];
    if (r.used == kMaxKernels)
      ADD_FAILURE() << "more than " << kMaxKernels << " kernel names";
    r.real[r.used] = real;
    r.name[r.used] = k;
    return kTable[r.used++];
  }
  void *allocate(size_t n) override { return cpu->allocate(n); }
  void release(void *p) override { cpu->release(p); }
  ThreadPool &pool() override { return cpu->pool(); }
  void zeroStorage(void *dst, size_t bytes) override {
    log.push_back("zeroStorage");
    cpu->zeroStorage(dst, bytes);
  }
  double sumSquares(const std::vector<Tensor> &ts) override {
    log.push_back("sumSquares");
    return cpu->sumSquares(ts);
  }
  void waitComm() override { log.push_back("waitComm"); }
  void beginStep(int64_t) override { log.push_back("beginStep"); }
  void endStep() override { log.push_back("endStep"); }

private:
  static constexpr std::array<KernelFn, kMaxKernels> kTable =
      trampolines(std::make_integer_sequence<int, kMaxKernels>{});
};

template <int I> void loggedKernel(const KernelArgs &a) {
  static_cast<OrderLoggingBackend *>(a.ctx.backend)
      ->log.push_back("kernel:" + registry().name[I]);
  registry().real[I](a);
}

Plan parse(const PlanSpec &s) {
  std::vector<uint8_t> b = s.build();
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

size_t indexOf(const std::vector<std::string> &log, const std::string &what,
               size_t from = 0) {
  auto it = std::find(log.begin() + from, log.end(), what);
  return static_cast<size_t>(it - log.begin());
}

} // namespace

TEST(WaitComm, JoinsAfterBackwardBeforeEveryGradientReader) {
  MlpOptions o;
  o.microbatches = 2;
  o.optimizer = "sgd";
  Plan plan = parse(mlpPlan(o));
  OrderLoggingBackend be;
  std::unique_ptr<Communicator> comm = createLocalComm();
  Executor ex(plan, be, *comm);
  ex.initParams(1);
  auto batches = [&](int64_t, int mb, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < o.batch * o.seq; ++i) {
      tok[i] = (mb * 5 + i * 3) % o.vocab;
      tgt[i] = (mb * 7 + i) % o.vocab;
    }
  };
  auto hook = [&](Executor &) { be.log.push_back("afterGrads"); };
  for (int s = 0; s < 2; ++s)
    ex.step(batches, hook);

  const std::vector<std::string> &log = be.log;
  for (size_t begin = indexOf(log, "beginStep"), step = 0; begin < log.size();
       begin = indexOf(log, "beginStep", begin + 1), ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    size_t end = indexOf(log, "endStep", begin);
    ASSERT_LT(end, log.size());
    std::vector<std::string> s(log.begin() + begin, log.begin() + end);
    ASSERT_EQ(std::count(s.begin(), s.end(), "waitComm"), 1);
    size_t wait = indexOf(s, "waitComm");
    size_t firstSgd = indexOf(s, "kernel:sgd");
    ASSERT_LT(firstSgd, s.size()) << "the optimizer ran";
    // Every forward/backward kernel is issued before the join...
    size_t lastOther = 0, backwardKernels = 0;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i].rfind("kernel:", 0) == 0 && s[i] != "kernel:sgd") {
        lastOther = i;
        ++backwardKernels;
      }
    EXPECT_GT(backwardKernels, 0u);
    EXPECT_LT(lastOther, wait);
    // ...and every gradient reader after it.
    EXPECT_LT(wait, indexOf(s, "afterGrads"));
    EXPECT_LT(indexOf(s, "afterGrads"), s.size());
    EXPECT_LT(wait, indexOf(s, "sumSquares"));
    EXPECT_LT(indexOf(s, "sumSquares"), s.size());
    EXPECT_LT(wait, firstSgd);
    // This step's gradient zeroing comes before its backward, hence after
    // the previous step's join.
    EXPECT_LT(indexOf(s, "zeroStorage"), wait);
    for (size_t i = wait; i < s.size(); ++i)
      EXPECT_NE(s[i], "zeroStorage") << "gradients zeroed after the join";
  }
  EXPECT_EQ(std::count(log.begin(), log.end(), "waitComm"), 2);
}
