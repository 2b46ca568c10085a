//===- CpuBackend.cpp - the reference backend -----------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"

#include <cblas.h>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

using namespace mapp::rt;

namespace {

/// Name -> kernel for every row of KernelVocab.def with cpu = Y.
const std::map<std::string, KernelFn> &cpuKernelTable() {
  static const std::map<std::string, KernelFn> table = {
#define MAPP_KERNEL(name, minIn, maxIn, minOut, maxOut, check, props, onCpu,    \
                    onCuda, why)                                                 \
  MAPP_VOCAB_IF(onCpu, {#name, cpu::name},)
#include "mapp/rt/KernelVocab.def"
#undef MAPP_KERNEL
  };
  return table;
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(int threads) : pool_(threads) {
    // OpenBLAS gets the same thread budget; our own workers stay idle while
    // a GEMM runs, so the two never oversubscribe the cores together.
    openblas_set_num_threads(pool_.size());
  }
  std::string name() const override { return "cpu"; }
  KernelFn lookup(const std::string &kernel) const override {
    const auto &table = cpuKernelTable();
    auto it = table.find(kernel);
    return it == table.end() ? nullptr : it->second;
  }
  void *allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void *p = std::aligned_alloc(64, rounded);
    if (!p)
      fail("out of host memory allocating ", bytes, " bytes");
    std::memset(p, 0, rounded);
    std::lock_guard<std::mutex> lock(allocMutex_);
    sizes_[p] = bytes;
    allocated_ += bytes;
    peakAllocated_ = std::max(peakAllocated_, allocated_);
    return p;
  }
  void release(void *p) override {
    if (p) {
      std::lock_guard<std::mutex> lock(allocMutex_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        allocated_ -= it->second;
        sizes_.erase(it);
      }
    }
    std::free(p);
  }
  uint64_t allocatedBytes() const override {
    std::lock_guard<std::mutex> lock(allocMutex_);
    return allocated_;
  }
  uint64_t peakAllocatedBytes() const override {
    std::lock_guard<std::mutex> lock(allocMutex_);
    return peakAllocated_;
  }
  ThreadPool &pool() override { return pool_; }

private:
  ThreadPool pool_;
  mutable std::mutex allocMutex_;
  std::unordered_map<void *, size_t> sizes_;
  uint64_t allocated_ = 0, peakAllocated_ = 0;
};

} // namespace

std::vector<std::string> mapp::rt::cpuKernelNames() {
  std::vector<std::string> names;
  for (const auto &kv : cpuKernelTable())
    names.push_back(kv.first);
  return names;
}

std::unique_ptr<Backend> mapp::rt::createCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}
