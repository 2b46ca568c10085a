//===- kernel_census.cpp - every CUDA kernel a process launches ----------===//
//
// A CUPTI injection library (CUDA_INJECTION64_PATH=libmapp-kernel-census.so):
// the driver loads it into any CUDA process, mapp-run or a PyTorch script
// alike, so both sides of bench/gpu/kernels.sh are counted by the same
// activity records. At exit it writes MAPP_CENSUS_OUT: one line per kernel
// name, "launches<TAB>device ns<TAB>mangled name", sorted by time.
// Steady-state figures come from the difference of two runs that differ
// only in their step count (kernels.py).
//
//===----------------------------------------------------------------------===//
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Tally {
  long long launches = 0;
  unsigned long long ns = 0;
};

std::mutex mutex;
std::map<std::string, Tally> &tallies() {
  static auto *t = new std::map<std::string, Tally>; // outlives exit handlers
  return *t;
}

void check(CUptiResult r, const char *what) {
  if (r == CUPTI_SUCCESS)
    return;
  const char *text = "?";
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel census: %s: %s\n", what, text);
}

void CUPTIAPI bufferRequested(uint8_t **buffer, size_t *size,
                              size_t *maxRecords) {
  *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *maxRecords = 0;
}

void CUPTIAPI bufferCompleted(CUcontext, uint32_t, uint8_t *buffer, size_t,
                              size_t valid) {
  CUpti_Activity *record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    auto *k = reinterpret_cast<CUpti_ActivityKernel10 *>(record);
    Tally &t = tallies()[k->name ? k->name : "?"];
    t.launches += 1;
    t.ns += k->end > k->start ? k->end - k->start : 0;
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped)
    std::fprintf(stderr, "kernel census: %zu records dropped\n", dropped);
  std::free(buffer);
}

void writeCensus() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char *path = std::getenv("MAPP_CENSUS_OUT");
  if (!path)
    path = "kernel-census.tsv";
  std::vector<std::pair<std::string, Tally>> rows;
  {
    std::lock_guard<std::mutex> lock(mutex);
    rows.assign(tallies().begin(), tallies().end());
  }
  std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) {
    return a.second.ns > b.second.ns;
  });
  FILE *f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel census: cannot write %s\n", path);
    return;
  }
  for (const auto &[name, t] : rows)
    std::fprintf(f, "%lld\t%llu\t%s\n", t.launches, t.ns, name.c_str());
  std::fclose(f);
}

} // namespace

/// Called by the CUDA driver when it loads this library
/// (CUDA_INJECTION64_PATH); returns 1 on success.
extern "C" int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted),
        "register callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
        "enable kernel records");
  std::atexit(writeCensus);
  return 1;
}
