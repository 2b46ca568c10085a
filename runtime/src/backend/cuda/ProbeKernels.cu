//===- ProbeKernels.cu - MegaScope probe reductions on the device ---------===//
//
// The CUDA "probe" kernel: every reduction of the probe reads the selected
// tokens in place (fp32 or bf16 storage) on the compute stream into one
// slot of the capture ring (ProbeCapture.h), and the slot is copied to the
// host behind the step. The results equal src/kernel/Reductions.cpp's:
// statistics and sketches accumulate in double (in another order, so within
// fp32 rounding), histogram bins use the same double arithmetic, top-k keys
// order (value, lower index) exactly. `lens` (logit lens) runs on the
// device too (launchLens): the norm of the selected rows, an fp32 cuBLASLt
// GEMM against the unembedding and a per-row softmax top-k, of which only
// the k ids and probabilities per row enter the slot; it agrees with
// LogitLens.cpp's double arithmetic to fp32 rounding. `attn` (recomputed
// attention probabilities) is staged through the host and reduced by the
// CPU code: it is meant for a few sampled steps.
//
// The step issues ~2,000 launches in 25 ms, so a probe call's host work and
// launches are on the critical path: a call looks up its cached plan (the
// parsed attrs, slot layout and launch shapes), issues one launch per family
// of reductions (ProbeReduce.cuh) and commits the slot; the copy to the host
// is batched per step by ProbeCapture.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "ProbeCapture.h"
#include "ProbeReduce.cuh"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>
#include <sstream>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace rd = mapp::rt::cuda::probe_reduce;

namespace {

std::vector<std::string> splitList(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

size_t align16(size_t b) { return (b + 15) / 16 * 16; }

/// Host copy (fp32) of a stored float tensor: for the staged `attn` path.
std::vector<float> hostFloats(CudaBackend &be, const Tensor &t) {
  int64_t n = t.numel();
  std::vector<float> h(std::max<int64_t>(n, 1));
  if (!n)
    return h;
  const void *src = t.data;
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.probeCapture().work(n * 4, 2));
    copyConvert(view(t), {tmp, 0}, n, be.stream());
    src = tmp;
  }
  be.copyFromStorage(h.data(), src, n * 4);
  return h;
}

void stagedAttention(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  std::vector<float> q = hostFloats(be, a.in[0]), k = hostFloats(be, a.in[1]);
  ProbeSample s = attentionProbs(a.attrs, q.data(), k.data(), a.in[0].shape());
  s.probeId = a.attrs.getInt("probe_id", 0);
  s.step = a.ctx.step;
  s.microbatch = a.ctx.microbatch;
  a.ctx.probe->record(std::move(s));
}

bool sameAttrs(const Attrs &a, const Attrs &b) {
  const auto &x = a.all(), &y = b.all();
  if (x.size() != y.size())
    return false;
  for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j) {
    const AttrValue &u = i->second, &v = j->second;
    if (i->first != j->first || u.kind != v.kind || u.i != v.i ||
        !(u.f == v.f || (u.f != u.f && v.f != v.f)) || u.s != v.s ||
        u.ints != v.ints || u.floats != v.floats)
      return false;
  }
  return true;
}

bool isStatistic(const std::string &r) {
  return r == "max" || r == "min" || r == "mean" || r == "std" ||
         r == "absmax" || r == "sparsity";
}

constexpr size_t kNone = ~size_t(0);

} // namespace

/// What a call of one probe instr needs; valid while its attrs and the
/// input's type stay the same.
struct mapp::rt::cuda::ProbeCallPlan {
  Attrs attrs; // what it was built from
  TensorType type;
  bool staged = false; // `attn`: host-staged
  // `lens`: its own launches (launchLens); the plan also holds for one
  // unembedding shape
  bool lens = false;
  rd::LensParams lensParams{};
  Shape unembedding;
  int64_t probeId = 0, every = 1;
  std::shared_ptr<const std::vector<ResultField>> fields;
  size_t bytes = 0;
  rd::Selection sel{}; // without the source (set per call)
  // statistics and histogram: one launch when either is asked for
  rd::StatsParams stats{};
  size_t histOffset = kNone;
  int statsGrid = 1;
  // top-k: one launch for k <= kMaxSinglePassK, else k passes
  size_t topkOffset = kNone;
  int64_t k = 0;
  int topkGrid = 1;
  // sketch, raw
  size_t sketchOffset = kNone, rawOffset = kNone;
  const double *projection = nullptr;
  int64_t dim = 0, sketchRows = 0, rawCount = 0;
};

namespace {

void checkRingFits(const KernelArgs &a, const ProbeCapture &cap,
                   int64_t probeId, size_t bytes, const char *knobs) {
  if (ProbeCapture::slotBytes(bytes) > cap.capacity())
    fail("probe ", probeId, " ('", a.attrs.getStr("point", ""), "') needs ",
         ProbeCapture::slotBytes(bytes), " bytes of probe capture ring per "
         "call, more than MAPP_PROBE_RING_BYTES=", cap.capacity(),
         "; raise it or lower the probe's ", knobs);
}

/// `lens`: in[0] the residual [B,T,H], in[1] gamma [H], in[2] beta [H] when
/// there are 4 inputs, last the unembedding [vocab,H] (ProbeKernels.cpp).
/// Its result is one TokenProbs field [positions, k] in the ring, so the
/// worker decodes it with the other probes' slots (no copy of its own).
void buildLensPlan(const KernelArgs &a, ProbeCapture &cap, ProbeCallPlan &p) {
  const Tensor &x = a.in[0], &w = a.in[a.numIn - 1];
  int64_t H = x.rank() == 3 ? x.dim(2) : -1;
  if ((a.numIn != 3 && a.numIn != 4) || x.rank() != 3 || w.rank() != 2 ||
      w.dim(1) != H || a.in[1].numel() != H ||
      (a.numIn == 4 && a.in[2].numel() != H))
    fail("probe ", p.probeId, ": lens needs x [B,T,H], the final norm's "
         "weights [H] and the unembedding [vocab,H]");
  int64_t vocab = w.dim(0);
  if (vocab > 0xFFFFFFFEll)
    fail("probe ", p.probeId, ": lens over a vocabulary of ", vocab,
         " (the device keys hold 32-bit ids)");
  const LensSpec spec = lensSpec(a.attrs, x.dim(1), vocab);
  int64_t R = static_cast<int64_t>(spec.positions.size()), k = spec.k;
  rd::LensParams &lp = p.lensParams;
  lp.positions = cap.constants().ints(&a.attrs, 1, spec.positions);
  lp.rows = R;
  lp.hidden = H;
  lp.vocab = vocab;
  lp.k = static_cast<int>(k);
  lp.rms = spec.rms;
  lp.eps = spec.eps;
  ResultField f;
  f.reduction = "lens";
  f.kind = ResultField::TokenProbs;
  f.count = R * k;
  f.shape = {R, k};
  p.bytes = tokenProbsOffset(f.count) + align16(f.count * 4);
  checkRingFits(a, cap, p.probeId, p.bytes, "tokens/k");
  p.fields = std::make_shared<std::vector<ResultField>>(1, f);
  p.lens = true;
  p.unembedding = w.shape();
}

/// Parses the probe's attrs for the input `x` once (ProbeKernels.cpp /
/// selectTokens define the selection).
std::shared_ptr<ProbeCallPlan> buildPlan(const KernelArgs &a, ProbeCapture &cap,
                                         cudaStream_t st) {
  auto plan = std::make_shared<ProbeCallPlan>();
  ProbeCallPlan &p = *plan;
  const Tensor &x = a.in[0];
  p.attrs = a.attrs;
  p.type = x.type;
  p.probeId = a.attrs.getInt("probe_id", 0);
  p.every = a.attrs.getInt("every", 1);
  std::vector<std::string> reds = splitList(a.attrs.getStr("reduce", ""));
  if (reds.size() == 1 && reds[0] == "attn") {
    p.staged = true;
    return plan;
  }
  if (reds.size() == 1 && reds[0] == "lens") {
    buildLensPlan(a, cap, p);
    return plan;
  }
  std::vector<int64_t> toks = a.attrs.getInts("tokens");
  bool select = !toks.empty() && x.rank() >= 2;
  int64_t rows0 = x.rank() >= 2 ? x.dim(0) * x.dim(1) : 0;
  int64_t inner = select || x.rank() >= 3
                      ? x.numel() / std::max<int64_t>(rows0, 1)
                      : (x.rank() ? x.dim(-1) : 1);
  int64_t n = select ? x.dim(0) * static_cast<int64_t>(toks.size()) * inner
                     : x.numel();
  p.sel = {{nullptr, 0}, nullptr, 0, select ? x.dim(1) : 0, inner, n};
  if (select) {
    p.sel.toks = cap.constants().ints(&a.attrs, 0, toks);
    p.sel.ntok = static_cast<int64_t>(toks.size());
  }

  // Slot layout: the six statistics (when any is asked for), then each
  // vector result 16-byte aligned, in the order of `reduce`.
  static const char *kStatNames[] = {"max", "min", "mean", "std", "absmax",
                                     "sparsity"};
  bool needStats = std::any_of(reds.begin(), reds.end(), isStatistic);
  p.stats.stats = needStats;
  p.stats.moments = std::find(reds.begin(), reds.end(), "std") != reds.end();
  p.stats.eps = a.attrs.getFloat("eps", 1e-6);
  p.stats.lo = a.attrs.getFloat("lo", -8);
  p.stats.hi = a.attrs.getFloat("hi", 8);
  int64_t bins = a.attrs.getInt("bins", 32);
  p.k = std::min<int64_t>(a.attrs.getInt("k", 10), n);
  p.dim = a.attrs.getInt("dim", 16);
  p.sketchRows = inner ? n / inner : 0;
  p.rawCount = std::min<int64_t>(a.attrs.getInt("cap", 4096), n);
  if (n > 0xFFFFFFFEll && std::find(reds.begin(), reds.end(), "topk") != reds.end())
    fail("probe ", p.probeId, ": topk over ", n, " elements (the device keys "
         "hold 32-bit indices); select tokens");
  auto fields = std::make_shared<std::vector<ResultField>>();
  size_t bytes = needStats ? 6 * sizeof(double) : 0;
  for (const std::string &r : reds) {
    ResultField f;
    f.reduction = r;
    if (isStatistic(r)) {
      f.kind = ResultField::Scalar;
      for (int i = 0; i < 6; ++i)
        if (r == kStatNames[i])
          f.offset = i * sizeof(double);
      fields->push_back(f);
      continue;
    }
    f.offset = bytes;
    if (r == "hist") {
      f.kind = ResultField::Counts;
      f.count = bins;
      p.histOffset = bytes;
      bytes += align16(bins * 4);
    } else if (r == "topk") {
      f.kind = ResultField::TopKeys;
      f.count = p.k;
      p.topkOffset = bytes;
      bytes += align16(std::max<int64_t>(p.k, 1) * 8);
    } else if (r == "sketch") {
      f.kind = ResultField::Floats;
      f.count = p.sketchRows * p.dim;
      f.shape = {p.sketchRows, p.dim};
      if (f.count) {
        p.sketchOffset = bytes;
        p.projection = cap.constants().projection(
            static_cast<uint64_t>(a.attrs.getInt("seed", 0)), p.dim, inner, st);
      }
      bytes += align16(f.count * 4);
    } else if (r == "raw") {
      f.kind = ResultField::Floats;
      f.count = p.rawCount;
      f.shape = {p.rawCount};
      if (f.count)
        p.rawOffset = bytes;
      bytes += align16(p.rawCount * 4);
    } else {
      fail("probe ", p.probeId, ": reduction '", r, "' cannot be combined "
           "with others on the device");
    }
    if (f.kind != ResultField::Floats)
      f.shape = {f.count};
    fields->push_back(f);
  }
  checkRingFits(a, cap, p.probeId, bytes, "cap/dim/tokens");
  p.fields = std::move(fields);
  p.bytes = bytes;
  bool hist = p.histOffset != kNone;
  p.stats.hist = hist;
  p.stats.bins = bins;
  p.stats.copies = bins * (rd::kThreads / 32) <= rd::kMaxSharedBins ? rd::kThreads / 32
                   : bins <= rd::kMaxSharedBins                      ? 1
                                                                     : 0;
  p.statsGrid = gridFor(n, rd::kThreads, rd::kStatBlocks);
  // At least 8 elements per thread: the per-thread lists fill, then filter.
  p.topkGrid = gridFor(n, rd::kThreads * 8, rd::kStatBlocks);
  return plan;
}

/// One single-pass top-k launch with per-thread lists of K >= k keys.
template <int K>
void launchTopk(const ProbeCallPlan &p, const rd::Selection &sel,
                ProbeCapture &cap, unsigned *done, unsigned long long *keys,
                cudaStream_t st) {
  auto *parts = static_cast<unsigned long long *>(
      cap.work(size_t(p.topkGrid) * K * sizeof(unsigned long long), 1));
  rd::topkKernel<K><<<p.topkGrid, rd::kThreads, 0, st>>>(
      sel, static_cast<int>(p.k), parts, done, keys);
  MAPP_CUDA_LAUNCHED();
}

/// Queues every reduction of `p` on `sel` into `slot`.
void launchReductions(const ProbeCallPlan &p, const rd::Selection &sel,
                      uint8_t *slot, ProbeCapture &cap, cudaStream_t st) {
  bool hist = p.histOffset != kNone, topk = p.topkOffset != kNone && p.k > 0;
  unsigned *zeroed = nullptr;
  if (p.stats.stats || hist || (topk && p.k <= rd::kMaxSinglePassK))
    zeroed = static_cast<unsigned *>(cap.zeroedWork(
        rd::kCountsOffset + (hist ? p.stats.bins * sizeof(unsigned) : 0)));
  if (p.stats.stats || hist) {
    auto *parts = static_cast<rd::StatPartial *>(
        cap.work(p.statsGrid * sizeof(rd::StatPartial), 1));
    size_t shared = hist ? p.stats.copies * p.stats.bins * sizeof(unsigned) : 0;
    rd::statsHistKernel<<<p.statsGrid, rd::kThreads, shared, st>>>(
        sel, p.stats, parts, zeroed, reinterpret_cast<double *>(slot),
        hist ? reinterpret_cast<unsigned *>(slot + p.histOffset) : nullptr);
    MAPP_CUDA_LAUNCHED();
  }
  if (p.topkOffset != kNone) {
    auto *keys = reinterpret_cast<unsigned long long *>(slot + p.topkOffset);
    if (p.k == 0) {
      // nothing selected: the sample is empty (decode reads no key)
    } else if (p.k <= 8) {
      launchTopk<8>(p, sel, cap, zeroed, keys, st);
    } else if (p.k <= 16) {
      launchTopk<16>(p, sel, cap, zeroed, keys, st);
    } else if (p.k <= rd::kMaxSinglePassK) {
      launchTopk<rd::kMaxSinglePassK>(p, sel, cap, zeroed, keys, st);
    } else {
      MAPP_CUDA_CHECK(cudaMemsetAsync(keys, 0, p.k * 8, st));
      for (int j = 0; j < p.k; ++j) {
        rd::topkPass<<<p.statsGrid, rd::kThreads, 0, st>>>(sel, keys, j);
        MAPP_CUDA_LAUNCHED();
      }
    }
  }
  if (p.sketchOffset != kNone) {
    int64_t rowsPerBlock = rd::kThreads / 32 * rd::kSketchRows;
    int64_t blocks = (p.sketchRows + rowsPerBlock - 1) / rowsPerBlock;
    rd::sketchKernel<<<static_cast<unsigned>(blocks), rd::kThreads, 0, st>>>(
        sel, p.projection, p.sketchRows, p.dim,
        reinterpret_cast<float *>(slot + p.sketchOffset));
    MAPP_CUDA_LAUNCHED();
  }
  if (p.rawOffset != kNone) {
    rd::rawKernel<<<gridFor(p.rawCount, rd::kThreads), rd::kThreads, 0, st>>>(
        sel, p.rawCount, reinterpret_cast<float *>(slot + p.rawOffset));
    MAPP_CUDA_LAUNCHED();
  }
}

/// Logits of at most this many bytes per GEMM: rows go in chunks, so a lens
/// over every position of a long sequence needs no [T, vocab] buffer.
constexpr size_t kLensLogitBytes = size_t(64) << 20;

/// Queues the lens of `p` into `slot`: norm -> y [R,H] (fp32), per chunk of
/// rows logits = y·Wᵀ (gemmF32; a bf16 unembedding is widened to fp32
/// first, exactly) and the top-k softmax of each row.
void launchLens(const ProbeCallPlan &p, const KernelArgs &a, uint8_t *slot,
                ProbeCapture &cap, cudaStream_t st) {
  const rd::LensParams &lp = p.lensParams;
  if (!lp.rows)
    return;
  CudaBackend &be = backendOf(a);
  int64_t R = lp.rows, H = lp.hidden, V = lp.vocab, k = lp.k;
  size_t yBytes = align16(R * H * 4);
  auto *y = static_cast<float *>(cap.work(yBytes + R * k * 8, 0));
  auto *keys = reinterpret_cast<unsigned long long *>(
      reinterpret_cast<uint8_t *>(y) + yBytes);
  DView beta = a.numIn == 4 ? view(a.in[2]) : DView{nullptr, 0};
  rd::lensNormKernel<<<static_cast<unsigned>(R), rd::kThreads, 0, st>>>(
      lp, view(a.in[0]), view(a.in[1]), beta, y);
  MAPP_CUDA_LAUNCHED();
  const Tensor &w = a.in[a.numIn - 1];
  const float *wf = w.f32();
  if (isBf16(w)) {
    auto *tmp = static_cast<float *>(cap.work(V * H * 4, 2));
    copyConvert(view(w), {tmp, 0}, V * H, st);
    wf = tmp;
  }
  int64_t chunk = std::max<int64_t>(1, kLensLogitBytes / (V * 4));
  chunk = std::min(chunk, R);
  auto *logits = static_cast<float *>(cap.work(chunk * V * 4, 1));
  auto *ids = reinterpret_cast<uint32_t *>(slot);
  auto *probs = reinterpret_cast<float *>(slot + tokenProbsOffset(R * k));
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    rd::LensParams part = lp;
    part.rows = std::min(chunk, R - r0);
    gemmF32(be, y + r0 * H, wf, logits, part.rows, V, H);
    auto blocks = static_cast<unsigned>(part.rows);
    unsigned long long *kk = keys + r0 * k;
    uint32_t *ii = ids + r0 * k;
    float *pp = probs + r0 * k;
    if (k <= 8)
      rd::lensTopkKernel<8><<<blocks, rd::kThreads, 0, st>>>(part, logits, kk, ii, pp);
    else if (k <= 16)
      rd::lensTopkKernel<16><<<blocks, rd::kThreads, 0, st>>>(part, logits, kk, ii, pp);
    else
      rd::lensTopkKernel<rd::kMaxSinglePassK>
          <<<blocks, rd::kThreads, 0, st>>>(part, logits, kk, ii, pp);
    MAPP_CUDA_LAUNCHED();
  }
}

} // namespace

void cuda::probe(const KernelArgs &a) {
  ProbeRuntime *rt = a.ctx.probe;
  if (!rt)
    return;
  CudaBackend &be = backendOf(a);
  ProbeCapture &cap = be.probeCapture();
  cudaStream_t st = be.stream();
  const Tensor &x = a.in[0];
  std::shared_ptr<ProbeCallPlan> &plan = cap.plan(&a.attrs);
  if (!plan || plan->type.dtype != x.type.dtype ||
      plan->type.shape != x.type.shape || !sameAttrs(plan->attrs, a.attrs) ||
      (plan->lens && plan->unembedding != a.in[a.numIn - 1].shape())) {
    plan.reset(); // a failed build leaves no stale plan
    plan = buildPlan(a, cap, st);
  }
  const ProbeCallPlan &p = *plan;
  if (!rt->generating() && a.ctx.step % p.every != 0)
    return;
  if (p.staged)
    return stagedAttention(a);
  rd::Selection sel = p.sel;
  sel.src = view(x);
  uint8_t *slot = cap.reserve(p.bytes);
  // A slot must be committed or cancelled, or the worker waits for it.
  try {
    if (p.lens)
      launchLens(p, a, slot, cap, st);
    else
      launchReductions(p, sel, slot, cap, st);
  } catch (...) {
    cap.cancel();
    throw;
  }
  cap.commit(p.fields, rt, p.probeId, a.ctx.step, a.ctx.microbatch);
}
