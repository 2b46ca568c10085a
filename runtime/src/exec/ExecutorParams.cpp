//===- ExecutorParams.cpp - parameters in and out of a rank ---------------===//
//
// Fresh initialization, loading from safetensors (whole or this rank's
// shard of a full tensor), saving this rank's parameters and gradients, and
// gathering the full named tensors over the tp/dp groups (what --save and
// resharding read), each by the plan's names and shard attributes.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Shard.h"
#include "mapp/rt/Weights.h"

#include <algorithm>
#include <cstring>

using namespace mapp::rt;

int Executor::shardCount(const Value &v) const {
  return shardGroupSize(plan_, *prog_, v);
}

int Executor::shardIndex(const Value &v) const {
  return shardGroupIndex(plan_, *prog_, v);
}

void Executor::initParams(uint64_t seed) {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param)
      continue;
    // Staged through host memory: storage may live on a device.
    std::vector<float> host(static_cast<size_t>(val.type.numel()));
    int n = shardCount(val);
    if (val.shardDim < 0 || n == 1) {
      initParam(val.name, val.type.shape, seed, host.data());
    } else {
      Shape full = fullShapeOf(val, n);
      std::vector<float> buf(numel(full));
      initParam(val.name, full, seed, buf.data());
      copyPiece(buf.data(), host.data(), val.type.shape, val.shardDim,
                val.shardBlocks, n, shardIndex(val), true);
    }
    backend_.copyToStorage(valueData(static_cast<int>(v)), host.data(),
                           host.size() * sizeof(float));
  }
}

void Executor::loadParams(const Safetensors &st, const std::string &where) {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param)
      continue;
    auto it = st.tensors.find(val.name);
    if (it == st.tensors.end() && isFp8Meta(val.name)) {
      // Recipe state, not a weight: a plain weights file starts it fresh.
      std::vector<float> host(static_cast<size_t>(val.type.numel()));
      initParam(val.name, val.type.shape, 0, host.data());
      backend_.copyToStorage(valueData(static_cast<int>(v)), host.data(),
                             host.size() * sizeof(float));
      continue;
    }
    if (it == st.tensors.end())
      fail(where, ": missing tensor '", val.name, "' (shape ",
           shapeStr(val.type.shape), ")");
    loadValue(static_cast<int>(v), it->second, false, where);
  }
}

void Executor::loadValue(int v, const StTensor &t, bool piece,
                         const std::string &where) {
  const Value &val = prog_->values[v];
  // Grad and OptState values are cut like the parameter they belong to.
  // (Only theirs: the loader checks `param` of those kinds alone.)
  const bool owned =
      val.kind == ValueKind::Grad || val.kind == ValueKind::OptState;
  const Value &owner = owned ? prog_->values[val.param] : val;
  int n = piece ? 1 : shardCount(owner);
  Shape full = piece ? val.type.shape : fullShapeOf(owner, n);
  if (t.shape != full)
    fail(where, ": tensor '", val.name, "' has shape ", shapeStr(t.shape),
         ", the plan needs ", shapeStr(full),
         n > 1 ? " (the full tensor; this rank holds a piece)" : "");
  if (t.dtype == DType::I32 || t.dtype == DType::I64)
    fail(where, ": tensor '", val.name, "' is an integer tensor");
  std::vector<float> f = t.toF32(val.name);
  if (n == 1) {
    backend_.copyToStorage(valueData(v), f.data(), f.size() * 4);
  } else {
    std::vector<float> host(static_cast<size_t>(val.type.numel()));
    copyPiece(f.data(), host.data(), val.type.shape, owner.shardDim,
              owner.shardBlocks, n, shardIndex(owner), true);
    backend_.copyToStorage(valueData(v), host.data(), host.size() * 4);
  }
}

Safetensors Executor::saveParams() const {
  Safetensors st;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Param)
      st.tensors[val.name] =
          StTensor::fromF32(val.type.shape, hostCopy(static_cast<int>(v)).data());
  }
  st.metadata["format"] = "pt";
  st.metadata["step"] = std::to_string(step_);
  return st;
}

Safetensors Executor::saveGrads() const {
  Safetensors st;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Grad)
      st.tensors[prog_->values[val.param].name] =
          StTensor::fromF32(val.type.shape, hostCopy(static_cast<int>(v)).data());
  }
  st.metadata["step"] = std::to_string(step_);
  return st;
}

Safetensors Executor::gatherParams(bool grads) {
  // The source of each (name, piece): the lowest rank holding it. Every rank
  // walks the same plan-wide list, so the send/recv pairs line up.
  struct Src {
    const Program *prog;
    int value; // Param (or its Grad) index in prog
  };
  std::map<std::pair<std::string, int>, Src> src;
  std::vector<const Program *> progs;
  for (const Program &q : plan_.programs)
    if (q.placement.role != "fwd") // MegaFBD: copies of the backward side's
      progs.push_back(&q);
  std::sort(progs.begin(), progs.end(),
            [](const Program *a, const Program *b) { return a->rank < b->rank; });
  for (const Program *q : progs)
    for (size_t v = 0; v < q->values.size(); ++v) {
      const Value &val = q->values[v];
      int pv = -1;
      if (!grads && val.kind == ValueKind::Param)
        pv = static_cast<int>(v);
      else if (grads && val.kind == ValueKind::Grad)
        pv = val.param;
      if (pv < 0)
        continue;
      const Value &par = q->values[pv];
      int idx = shardGroupIndex(plan_, *q, par);
      src.emplace(std::make_pair(par.name, idx), Src{q, static_cast<int>(v)});
    }
  Safetensors st;
  int me = comm_.rank();
  const int64_t kTagBase = int64_t(1) << 29;
  int64_t counter = 0;
  for (auto &[key, s] : src) {
    const Value &val = s.prog->values[s.value];
    const Value &par =
        grads ? s.prog->values[val.param] : s.prog->values[s.value];
    int64_t tag = kTagBase + counter++;
    size_t bytes = static_cast<size_t>(numel(val.type.shape)) * sizeof(float);
    if (me == 0) {
      std::vector<float> piece(numel(val.type.shape));
      if (s.prog->rank == 0)
        backend_.copyFromStorage(piece.data(), valueData(s.value), bytes);
      else
        comm_.recv(piece.data(), bytes, s.prog->rank, tag);
      int n = shardCount(par);
      Shape full = fullShapeOf(par, n);
      auto it = st.tensors.find(par.name);
      if (it == st.tensors.end()) {
        std::vector<float> zeros(numel(full));
        it = st.tensors.emplace(par.name, StTensor::fromF32(full, zeros.data()))
                 .first;
      }
      float *f = reinterpret_cast<float *>(it->second.data.data());
      if (n == 1)
        std::memcpy(f, piece.data(), bytes);
      else
        copyPiece(f, piece.data(), val.type.shape, par.shardDim,
                  par.shardBlocks, n, key.second, false);
    } else if (s.prog->rank == me) {
      comm_.send(hostCopy(s.value).data(), bytes, 0, tag);
    }
  }
  if (me == 0) {
    if (!grads)
      st.metadata["format"] = "pt";
    st.metadata["step"] = std::to_string(step_);
  }
  return st;
}

std::vector<float> Executor::hostCopy(int v) const {
  const Value &val = prog_->values[v];
  std::vector<float> host(static_cast<size_t>(val.type.numel()));
  backend_.copyFromStorage(host.data(), valueData(v), host.size() * sizeof(float));
  return host;
}
