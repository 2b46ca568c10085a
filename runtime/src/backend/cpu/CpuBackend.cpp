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

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(int threads) : pool_(threads) {
    // OpenBLAS gets the same thread budget; our own workers stay idle while
    // a GEMM runs, so the two never oversubscribe the cores together.
    openblas_set_num_threads(pool_.size());
#define MAPP_REGISTER(name) table_[#name] = cpu::name;
    MAPP_CPU_KERNELS(MAPP_REGISTER)
#undef MAPP_REGISTER
  }
  std::string name() const override { return "cpu"; }
  KernelFn lookup(const std::string &kernel) const override {
    auto it = table_.find(kernel);
    return it == table_.end() ? nullptr : it->second;
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
  std::map<std::string, KernelFn> table_;
  mutable std::mutex allocMutex_;
  std::unordered_map<void *, size_t> sizes_;
  uint64_t allocated_ = 0, peakAllocated_ = 0;
};

} // namespace

std::unique_ptr<Backend> mapp::rt::createCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}
