//===- ProbeKernels.cpp - CPU "probe" and "perturb" kernels ---------------===//
//
// A probe without a ProbeRuntime (no --probe-db) returns at once, so a plan
// with probes runs at the speed of one without. Reductions run on the
// kernel's thread (they are cheap next to the GEMMs they observe); the store
// does its I/O on its own thread.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Probe.h"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>

using namespace mapp::rt;

void mapp::rt::cpu::probe(const KernelArgs &a) {
  ProbeRuntime *rt = a.ctx.probe;
  if (!rt)
    return;
  int64_t every = a.attrs.getInt("every", 1);
  if (!rt->generating() && a.ctx.step % every != 0)
    return;
  std::vector<ProbeSample> samples;
  const Tensor &x = a.in[0];
  if (a.attrs.getStr("reduce", "") == "attn" && a.attrs.flag("kv_cache")) {
    samples.push_back(attentionProbsCached(a.attrs, x.f32(), a.in[1].f32(),
                                           a.in[2].i32(), x.shape(),
                                           a.in[1].dim(1)));
  } else if (a.attrs.getStr("reduce", "") == "lens") {
    const float *beta = a.numIn == 4 ? a.in[2].f32() : nullptr;
    const Tensor &w = a.in[a.numIn - 1];
    samples.push_back(logitLens(a.attrs, x.f32(), a.in[1].f32(), beta,
                                w.f32(), x.shape(), w.dim(0)));
  } else if (a.attrs.getStr("reduce", "") == "attn") {
    samples.push_back(
        attentionProbs(a.attrs, x.f32(), a.in[1].f32(), x.shape()));
  } else {
    std::vector<float> sel = selectTokens(a.attrs, x.f32(), x.shape());
    // Elements per selected row: what selectTokens keeps per token.
    bool toks = !a.attrs.getInts("tokens").empty() && x.rank() >= 2;
    int64_t inner = toks || x.rank() >= 3
                        ? x.numel() / std::max<int64_t>(x.dim(0) * x.dim(1), 1)
                        : (x.rank() ? x.dim(-1) : 1);
    samples = reduceValues(a.attrs, sel, inner);
  }
  int64_t id = a.attrs.getInt("probe_id", 0);
  for (ProbeSample &s : samples) {
    s.probeId = id;
    s.step = a.ctx.step;
    s.microbatch = a.ctx.microbatch;
    rt->record(std::move(s));
  }
}

void mapp::rt::cpu::perturb(const KernelArgs &a) {
  SwitchState s;
  s.enabled = a.attrs.getInt("enabled", 1) != 0;
  s.magnitude = a.attrs.getFloat("magnitude", 0);
  if (a.ctx.probe)
    a.ctx.probe->switchState(a.attrs.getInt("switch_id", 0), s);
  const Tensor &x = a.in[0];
  applyPerturbation(a.attrs, s, a.ctx.step, a.ctx.microbatch, x.f32(),
                    a.out[0].f32(), x.numel(), x.rank() ? x.dim(-1) : 1);
}
