//===- KernelVocabTest.cpp - the backends against KernelVocab.def ---------===//
//
// KernelVocab.def is the one list of kernels. Here: each backend registers
// exactly the rows marked Y for it (a kernel missing from a backend, or one
// the table does not know, fails), every N carries its reason, and the spec
// table the loader checks with is the same list. The CUDA side reads the
// backend's registration table without a device, so it runs in CI.
// test/python/test_kernel_vocab.py checks the dialect's ops against the table.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/KernelVocab.h"
#include "mapp/rt/Kernels.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace mapp::rt;

namespace {

std::set<std::string> vocabOn(bool KernelInfo::*backend) {
  std::set<std::string> names;
  for (const KernelInfo &k : kKernelVocab)
    if (k.*backend)
      names.insert(std::string(k.name));
  return names;
}

/// Both directions, each name reported: what the table says the backend has
/// but it lacks, and what it registers that the table does not say.
void expectSameKernels(const std::string &backend,
                       const std::set<std::string> &table,
                       const std::vector<std::string> &registered) {
  std::set<std::string> got(registered.begin(), registered.end());
  EXPECT_EQ(got.size(), registered.size()) << backend << ": a name twice";
  for (const std::string &n : table)
    EXPECT_TRUE(got.count(n))
        << backend << " has no kernel '" << n
        << "', but KernelVocab.def marks it Y (implement it, or mark it N "
           "with the reason)";
  for (const std::string &n : got) {
    const KernelInfo *k = findKernelInfo(n);
    EXPECT_TRUE(k && table.count(n))
        << backend << " registers '" << n << "', which KernelVocab.def "
        << (k ? "marks N for it" : "does not list");
  }
}

} // namespace

TEST(KernelVocab, RowsAreWellFormed) {
  std::set<std::string_view> seen;
  for (const KernelInfo &k : kKernelVocab) {
    EXPECT_TRUE(seen.insert(k.name).second) << "'" << k.name << "' twice";
    bool everywhere = k.onCpu && k.onCuda;
    if (everywhere)
      EXPECT_TRUE(k.unsupportedWhy.empty())
          << k.name << ": on every backend, yet a reason it is missing";
    else
      EXPECT_FALSE(k.unsupportedWhy.empty())
          << k.name << ": missing on a backend without a reason";
    if (k.has(kExecutor))
      EXPECT_FALSE(k.onCpu || k.onCuda)
          << k.name << ": the executor runs it, no backend may register it";
  }
  EXPECT_EQ(findKernelInfo("no_such_kernel"), nullptr);
  ASSERT_NE(findKernelInfo("adamw"), nullptr);
  EXPECT_TRUE(findKernelInfo("adamw")->has(kOptimizer));
  EXPECT_TRUE(findKernelInfo("grad_accumulate")->has(kGradSink));
  EXPECT_FALSE(findKernelInfo("matmul")->has(kOptimizer));
}

TEST(KernelVocab, SpecsAreTheVocabulary) {
  const std::vector<KernelSpec> &specs = allKernelSpecs();
  ASSERT_EQ(specs.size(), kKernelVocabSize);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].name, kKernelVocab[i].name);
    EXPECT_EQ(specs[i].props, kKernelVocab[i].props) << specs[i].name;
    EXPECT_EQ(specs[i].inPlace, kKernelVocab[i].has(kInPlace)) << specs[i].name;
    EXPECT_EQ(isExecutorKernel(specs[i].name), kKernelVocab[i].has(kExecutor))
        << specs[i].name;
  }
}

TEST(KernelVocab, CpuBackendMatches) {
  expectSameKernels("cpu", vocabOn(&KernelInfo::onCpu), cpuKernelNames());
  // The registration table is the one lookup answers from.
  auto be = createCpuBackend(1);
  for (const KernelInfo &k : kKernelVocab)
    EXPECT_EQ(be->lookup(std::string(k.name)) != nullptr, k.onCpu) << k.name;
}

TEST(KernelVocab, CudaBackendMatches) {
  if (!cudaBackendBuilt())
    GTEST_SKIP() << "runtime built without CUDA";
  expectSameKernels("cuda", vocabOn(&KernelInfo::onCuda), cudaKernelNames());
}
