//===- Storage.cpp - running bf16-planned programs with fp32 storage ------===//
#include "mapp/rt/Plan.h"

#include <algorithm>

using namespace mapp::rt;

bool mapp::rt::hasBf16Storage(const Program &p) {
  return std::any_of(p.values.begin(), p.values.end(),
                     [](const Value &v) { return v.storedBf16; });
}

Program mapp::rt::withF32Storage(const Program &p) {
  Program out = p;
  for (Value &v : out.values) {
    if (!inArena(v.kind))
      continue;
    v.offset *= 2;
    v.storedBf16 = false;
    v.bytes = static_cast<uint64_t>(v.type.numel()) * dtypeSize(v.type.dtype);
  }
  out.arenaBytes *= 2;
  out.peakBytes = out.persistentBytes + out.slots * out.arenaBytes;
  return out;
}
