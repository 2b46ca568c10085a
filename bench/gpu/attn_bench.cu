//===- attn_bench.cu - attention implementations: time and check ----------===//
//
// Times the backend's `attention` and `attention` + `attention_grad` kernels
// (exactly what a training step calls: bf16 [B,T,H] operands, causal) for
// each implementation MAPP_CUDA_ATTN selects (own, cudnn), with CUDA events
// on the backend's stream (3 warm-up runs, median of N), and checks O, dQ,
// dK, dV of the last run on one (batch, head) slice against an fp64 host
// reference computed from the same bf16 inputs. Prints one ROW line per
// (shape, implementation), which bench/gpu/attn.sh joins with PyTorch's
// numbers, then cuDNN's load/plan report. Exit 1 when a check fails.
// --gqa: grouped-query shapes instead (k, v [B,T,kv·D] with kv < heads;
// bench/gpu/gqa.sh joins them with PyTorch's SDPA enable_gqa and repeat_kv):
// dK, dV are checked against the fp64 sum over each group's query heads.
//   mapp-attn-bench [--gqa] [ITERS]
//   mapp-attn-bench --dry   (no GPU: build cuDNN's graph descriptors only)
//
//===----------------------------------------------------------------------===//
#include "Attention.h"
#include "CudaBackend.h"

#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

struct ShapeCase {
  const char *name;
  int64_t B, heads, kv, T, D; // kv: key/value heads (== heads: MHA)
};

// bench/gpu/configs: gpt-1.3b (micro-batch 8, 16 heads of 128, seq 2048) and
// gpt-124m (micro-batch 8, 12 heads of 64, seq 1024).
const ShapeCase kShapes[] = {{"1.3b", 8, 16, 16, 2048, 128},
                             {"124m", 8, 12, 12, 1024, 64}};
// --gqa (bench/gpu/gqa_torch.py has the same list): LLaMA-3-8B's attention
// (32 query heads over 8 key/value heads of 128), one tp=4 rank of it (8/2),
// a 70B-style tp=8 rank (8 query heads, 1 key/value head), MQA at D=64; the
// LLaMA-3.2-1B bench's (32/8 of 64) at 2k, 8k and 16k, LLaMA-3-8B's at 8k
// and 16k, and the other head dims of the model families: Pythia's 80,
// Phi-3's 96, Gemma 2's 256 (8/4).
const ShapeCase kGqaShapes[] = {{"l3-8b", 2, 32, 8, 2048, 128},
                                {"l3-8b/tp4", 4, 8, 2, 2048, 128},
                                {"70b/tp8", 4, 8, 1, 2048, 128},
                                {"mqa-d64", 4, 16, 1, 1024, 64},
                                {"l3-1b", 4, 32, 8, 2048, 64},
                                {"l3-1b-8k", 1, 32, 8, 8192, 64},
                                {"l3-1b-16k", 1, 32, 8, 16384, 64},
                                {"l3-8b-8k", 1, 32, 8, 8192, 128},
                                {"l3-8b-16k", 1, 32, 8, 16384, 128},
                                {"pythia-d80", 2, 32, 32, 2048, 80},
                                {"phi3-d96", 2, 32, 32, 2048, 96},
                                {"gemma2-d256", 2, 8, 4, 2048, 256}};
// The fp64 host reference is O(T²·D) per checked head: sequences past this
// are timed only (their engines are checked at the shorter shapes and by
// the kernel test).
constexpr int64_t kMaxCheckedT = 4096;

uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1); // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

struct DevBuf {
  void *p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t elems) : n(elems) { MAPP_CUDA_CHECK(cudaMalloc(&p, n * 2)); }
  ~DevBuf() { cudaFree(p); }
  std::vector<float> download() const {
    std::vector<uint16_t> h(n);
    MAPP_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i)
      f[i] = bf16ToFloat(h[i]);
    return f;
  }
};

/// Random bf16 values uploaded; the host copy holds the rounded values.
std::vector<float> fillRandom(DevBuf &d, std::mt19937_64 &rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> h(d.n);
  std::vector<float> f(d.n);
  for (size_t i = 0; i < d.n; ++i) {
    h[i] = toBf16(nd(rng));
    f[i] = bf16ToFloat(h[i]);
  }
  MAPP_CUDA_CHECK(cudaMemcpy(d.p, h.data(), d.n * 2, cudaMemcpyHostToDevice));
  return f;
}

/// fp64 causal attention and its gradients for batch b: O and dQ of query
/// head hd, dK and dV of its key/value head hd / (heads/kv), summed over
/// every query head of that group (one head when kv == heads).
struct Reference {
  std::vector<double> o, dq, dk, dv; // [T, D]
};

Reference reference(const ShapeCase &s, int64_t b, int64_t hd, const std::vector<float> &q,
                    const std::vector<float> &k, const std::vector<float> &v,
                    const std::vector<float> &dO) {
  int64_t T = s.T, D = s.D, H = s.heads * s.D, Hk = s.kv * s.D;
  int64_t group = s.heads / s.kv, kvh = hd / group;
  double scale = 1.0 / std::sqrt(double(D));
  Reference r;
  r.dk.assign(T * D, 0);
  r.dv.assign(T * D, 0);
  std::vector<double> p(T), dp(T);
  for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
  auto at = [&](const std::vector<float> &x, int64_t t, int64_t d) {
    return double(x[(b * T + t) * H + qh * D + d]);
  };
  auto atkv = [&](const std::vector<float> &x, int64_t t, int64_t d) {
    return double(x[(b * T + t) * Hk + kvh * D + d]);
  };
  r.o.assign(T * D, 0);
  r.dq.assign(T * D, 0);
  for (int64_t i = 0; i < T; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      double sdot = 0;
      for (int64_t d = 0; d < D; ++d)
        sdot += at(q, i, d) * atkv(k, j, d);
      p[j] = sdot * scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j)
      sum += (p[j] = std::exp(p[j] - mx));
    for (int64_t j = 0; j <= i; ++j)
      p[j] /= sum;
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t j = 0; j <= i; ++j)
        acc += p[j] * atkv(v, j, d);
      r.o[i * D + d] = acc;
    }
    // dP = dO·Vᵀ, delta = rowsum(dO∘O), dS = P∘(dP − delta)
    double delta = 0;
    for (int64_t d = 0; d < D; ++d)
      delta += at(dO, i, d) * r.o[i * D + d];
    for (int64_t j = 0; j <= i; ++j) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d)
        acc += at(dO, i, d) * atkv(v, j, d);
      dp[j] = p[j] * (acc - delta) * scale;
    }
    for (int64_t j = 0; j <= i; ++j)
      for (int64_t d = 0; d < D; ++d) {
        r.dq[i * D + d] += dp[j] * atkv(k, j, d);
        r.dk[j * D + d] += dp[j] * at(q, i, d);
        r.dv[j * D + d] += p[j] * at(dO, i, d);
      }
  }
  if (qh == hd)
    break; // hd is the group's last head: O and dQ stay its own
  }
  return r;
}

/// Relative L2 error of head hd of batch b in `got` [B, T, heads·D].
double relErr(const std::vector<float> &got, const ShapeCase &s, int64_t heads, int64_t b,
              int64_t hd, const std::vector<double> &ref) {
  int64_t T = s.T, D = s.D, H = heads * s.D;
  double num = 0, den = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      double g = got[(b * T + t) * H + hd * D + d], r = ref[t * D + d];
      if (!std::isfinite(g))
        return INFINITY;
      num += (g - r) * (g - r);
      den += r * r;
    }
  return std::sqrt(num / std::max(den, 1e-300));
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--dry") {
    bool ok = false;
    std::string report = cuda::cudnnAttnDryRun(ok);
    std::printf("%s\n", report.c_str());
    if (report.rfind("cuDNN not loaded", 0) == 0)
      return 77;
    return ok ? 0 : 1;
  }
  bool gqa = argc > 1 && std::string(argv[1]) == "--gqa";
  if (gqa) {
    --argc;
    ++argv;
  }
  int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  if (iters < 1) {
    std::fprintf(stderr, "mapp-attn-bench: ITERS must be a positive count, got '%s'\n", argv[1]);
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  // A backend reads MAPP_CUDA_ATTN once, when it is made: one per choice.
  const char *impls[] = {"own", "cudnn"};
  std::unique_ptr<Backend> gpus[2];
  for (int i = 0; i < 2; ++i) {
    setenv("MAPP_CUDA_ATTN", impls[i], 1);
    gpus[i] = createCudaBackend(0);
  }
  std::mt19937_64 rng(1234);
  int failures = 0;
  cudaEvent_t e0, e1;
  MAPP_CUDA_CHECK(cudaEventCreate(&e0));
  MAPP_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<ShapeCase> shapes(std::begin(kShapes), std::end(kShapes));
  if (gqa)
    shapes.assign(std::begin(kGqaShapes), std::end(kGqaShapes));
  for (const ShapeCase &s : shapes) {
    int64_t H = s.heads * s.D, numel = s.B * s.T * H;
    int64_t Hk = s.kv * s.D, numelKV = s.B * s.T * Hk;
    DevBuf q(numel), k(numelKV), v(numelKV), dO(numel), o(numel), dq(numel), dk(numelKV),
        dv(numelKV);
    auto hq = fillRandom(q, rng), hk = fillRandom(k, rng), hv = fillRandom(v, rng),
         hdO = fillRandom(dO, rng);
    // The slice checked: the last query head (the last of its group) and
    // its key/value head.
    int64_t b = s.B - 1, hd = s.heads - 1, kvh = s.kv - 1;
    bool checked = s.T <= kMaxCheckedT;
    Reference ref = checked ? reference(s, b, hd, hq, hk, hv, hdO) : Reference{};
    Attrs at;
    at.setInt("heads", s.heads);
    at.setFloat("scale", 1.0 / std::sqrt(double(s.D)));
    at.setInt("causal", 1);
    TensorType tt{DType::BF16, {s.B, s.T, H}}, tk{DType::BF16, {s.B, s.T, Hk}};
    Tensor fin[3] = {{q.p, tt}, {k.p, tk}, {v.p, tk}}, fout[1] = {{o.p, tt}};
    Tensor bin[4] = {{dO.p, tt}, {q.p, tt}, {k.p, tk}, {v.p, tk}};
    Tensor bout[3] = {{dq.p, tt}, {dk.p, tk}, {dv.p, tk}};
    double flopFwd = 4.0 * s.B * s.heads * double(s.T) * s.T * s.D / 2; // causal half
    for (int i = 0; i < 2; ++i) {
      const char *impl = impls[i];
      Backend *gpu = gpus[i].get();
      auto &be = static_cast<cuda::CudaBackend &>(*gpu);
      KernelContext ctx;
      ctx.backend = gpu;
      ctx.pool = &gpu->pool();
      KernelFn fwd = gpu->lookup("attention"), bwd = gpu->lookup("attention_grad");
      std::vector<float> tf, tfb;
      std::string err;
      try {
        for (int it = 0; it < iters + 3; ++it) {
          MAPP_CUDA_CHECK(cudaEventRecord(e0, be.stream()));
          fwd({at, fin, 3, fout, 1, ctx});
          MAPP_CUDA_CHECK(cudaEventRecord(e1, be.stream()));
          MAPP_CUDA_CHECK(cudaEventSynchronize(e1));
          float ms;
          MAPP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          if (it >= 3)
            tf.push_back(ms);
        }
        for (int it = 0; it < iters + 3; ++it) {
          cudaMemset(dq.p, 0xFF, numel * 2); // poison: unwritten → NaN
          cudaMemset(dk.p, 0xFF, numelKV * 2);
          cudaMemset(dv.p, 0xFF, numelKV * 2);
          MAPP_CUDA_CHECK(cudaEventRecord(e0, be.stream()));
          fwd({at, fin, 3, fout, 1, ctx});
          bwd({at, bin, 4, bout, 3, ctx});
          MAPP_CUDA_CHECK(cudaEventRecord(e1, be.stream()));
          MAPP_CUDA_CHECK(cudaEventSynchronize(e1));
          float ms;
          MAPP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          if (it >= 3)
            tfb.push_back(ms);
        }
        gpu->synchronize();
      } catch (const Error &e) {
        err = e.what();
      }
      if (!err.empty()) {
        std::printf("ROW %s %s unavailable: %s\n", s.name, impl, err.c_str());
        continue;
      }
      double eo = NAN, eq = NAN, ek = NAN, ev = NAN;
      bool pass = true;
      if (checked) {
        eo = relErr(o.download(), s, s.heads, b, hd, ref.o);
        eq = relErr(dq.download(), s, s.heads, b, hd, ref.dq);
        ek = relErr(dk.download(), s, s.kv, b, kvh, ref.dk);
        ev = relErr(dv.download(), s, s.kv, b, kvh, ref.dv);
        pass = eo <= 1e-2 && eq <= 2e-2 && ek <= 2e-2 && ev <= 2e-2;
      }
      failures += !pass;
      double mf = median(tf), mfb = median(tfb);
      std::printf("ROW %s %s %.3f %.3f %.1f %.1f %.2e %.2e %.2e %.2e %s\n", s.name, impl, mf,
                  mfb, flopFwd / (mf * 1e9), 3.5 * flopFwd / (mfb * 1e9), eo, eq, ek, ev,
                  !checked ? "UNCHECKED" : pass ? "PASS" : "FAIL");
      std::fflush(stdout);
    }
  }
  std::printf("CUDNN %s\n", cuda::cudnnAttnReport().c_str());
  return failures ? 1 : 0;
}
