//===- KernelTest.cpp - thread pool and kernel-table coverage -------------===//
//
// Numerical conformance lives in test/python/test_kernels.py (against
// PyTorch); here: every kernel of the spec table has a CPU implementation,
// and the pool splits work exactly once per index and propagates errors.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/ThreadPool.h"

#include <gtest/gtest.h>

#include <atomic>

using namespace mapp::rt;

TEST(CpuBackend, ImplementsEveryKernel) {
  auto be = createCpuBackend(1);
  for (const KernelSpec &s : allKernelSpecs())
    if (!isExecutorKernel(s.name))
      EXPECT_NE(be->lookup(s.name), nullptr) << s.name;
  EXPECT_EQ(be->lookup("no_such_kernel"), nullptr);
  EXPECT_THROW(createBackend("tpu", 1), Error);
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.parallelFor(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallelFor(10, 1, [&](int64_t bb, int64_t ee) {
        total += static_cast<int>(ee - bb);
      });
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPool, PropagatesWorkerErrors) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallelFor(100, 1,
                                [&](int64_t b, int64_t) {
                                  if (b > 0)
                                    fail("boom");
                                }),
               Error);
  // The pool is still usable afterwards.
  std::atomic<int> n{0};
  pool.parallelFor(10, 1, [&](int64_t b, int64_t e) { n += int(e - b); });
  EXPECT_EQ(n.load(), 10);
}

TEST(Schedule, CosineAndConstant) {
  Attrs a;
  a.setFloat("lr", 1.0);
  EXPECT_EQ(scheduledLr(a, 100), 1.0);
  a.setStr("schedule", "cosine");
  a.setInt("warmup", 4);
  a.setInt("total_steps", 12);
  a.setFloat("min_lr", 0.1);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 0), 0.25);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 3), 1.0);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 4), 1.0);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 8), 0.55);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 12), 0.1);
  EXPECT_DOUBLE_EQ(scheduledLr(a, 50), 0.1);
}
