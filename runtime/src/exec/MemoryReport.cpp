//===- MemoryReport.cpp - what a rank allocated against its plan ---------===//
#include "mapp/rt/MemoryReport.h"
#include "mapp/rt/Executor.h"

#include <cstdio>

using namespace mapp::rt;

std::string mapp::rt::memoryReport(const Executor &exec, int rank) {
  const Program &p = exec.program();
  // The executor rounds each slot up to 64 bytes (Executor.cpp).
  unsigned long long stride = (p.arenaBytes + 63) / 64 * 64;
  unsigned long long planned =
      p.persistentBytes + stride * static_cast<unsigned long long>(p.slots);
  char line[512];
  std::snprintf(
      line, sizeof line,
      "rank %d memory: allocated %llu B (peak %llu B); plan "
      "persistent %llu B + %d slot(s) x arena %llu B = %llu B",
      rank, static_cast<unsigned long long>(exec.backend().allocatedBytes()),
      static_cast<unsigned long long>(exec.backend().peakAllocatedBytes()),
      static_cast<unsigned long long>(p.persistentBytes), p.slots,
      static_cast<unsigned long long>(p.arenaBytes), planned);
  return line;
}
