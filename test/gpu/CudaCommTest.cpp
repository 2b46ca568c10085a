//===- CudaCommTest.cpp - device collectives of rank-threads on one GPU ---===//
//
// mapp-cuda-comm-test [WORLD] [BENCH_MIB]: WORLD rank-threads (default 2,
// then 4), each with its own CUDA backend on GPU 0 and a local-world
// communicator, run the communication kernels on device tensors, checked
// against closed forms computed on the host from every rank's seeded input:
//   all_reduce (sum, avg, max; fp32 and bf16 storage; an odd count so the
//   members' chunks differ) — bit-exact against double accumulation in
//   member order rounded once, identical on every rank;
//   all_gather / reduce_scatter (dim 1 of a rank-3 tensor), all_to_all
//   (split 0, concat 1), send/recv (a ring, two tags received in reverse
//   order) — exact;
//   ep_dispatch / ep_combine (variable counts per rank and expert) — exact;
//   cp_attention / cp_attention_grad (comm a2a and the device ring; fp32
//   within 1e-4 and bf16 within 3e-2 of the largest element) against a
//   double-precision causal GQA attention with rotary of the whole sequence;
//   a failed rank: the other ranks' next collective is an Error naming it.
// MAPP_COMM_TEST_NCCL=1 runs only the ep_dispatch/ep_combine case over an
// NCCL world (rank r on GPU r; ncclSend/ncclRecv groups).
// Then times an in-place all_reduce of BENCH_MIB (default 256) MiB of fp32
// and prints the bus bandwidth (nccl-tests' 2(n-1)/n convention).
// Exit 77 (CTest: skipped) without a GPU; 1 on any failure.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace mapp::rt;

namespace {

std::atomic<int> gFailures{0};
std::mutex gPrintMu;

void check(bool ok, int rank, const std::string &what) {
  if (ok)
    return;
  ++gFailures;
  std::lock_guard<std::mutex> lk(gPrintMu);
  std::printf("FAIL rank %d: %s\n", rank, what.c_str());
}

float roundBf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

/// Rank r's seeded input of case `seed`: every thread can recompute any
/// rank's values for the expected results.
std::vector<float> inputOf(int rank, int seed, int64_t n, bool bf16) {
  std::mt19937 gen(1000 * seed + rank);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float &x : v)
    x = bf16 ? roundBf16(d(gen)) : d(gen);
  return v;
}

/// One rank's view of the test: backend, communicator, kernel calls.
struct Rank {
  Communicator &comm;
  Backend &be;
  KernelContext ctx;

  Tensor upload(const std::vector<float> &h, Shape shape, bool bf16) {
    Tensor t{nullptr, {bf16 ? DType::BF16 : DType::F32, std::move(shape)}};
    t.data = be.allocate(h.size() * 4);
    if (bf16) {
      std::vector<__nv_bfloat16> b(h.size());
      for (size_t i = 0; i < h.size(); ++i)
        b[i] = __float2bfloat16(h[i]);
      be.copyToStorage(t.data, b.data(), b.size() * 2);
    } else {
      be.copyToStorage(t.data, h.data(), h.size() * 4);
    }
    return t;
  }
  std::vector<float> download(const Tensor &t) {
    std::vector<float> h(t.numel());
    if (t.type.dtype == DType::BF16) {
      std::vector<__nv_bfloat16> b(h.size());
      be.copyFromStorage(b.data(), t.data, b.size() * 2);
      for (size_t i = 0; i < h.size(); ++i)
        h[i] = __bfloat162float(b[i]);
    } else {
      be.copyFromStorage(h.data(), t.data, h.size() * 4);
    }
    return h;
  }
  Tensor empty(Shape shape, bool bf16 = false) {
    Tensor t{nullptr, {bf16 ? DType::BF16 : DType::F32, std::move(shape)}};
    t.data = be.allocate(t.numel() * 4);
    return t;
  }
  void call(const char *kernel, const Attrs &attrs, Tensor in, Tensor out) {
    KernelFn fn = be.lookup(kernel);
    if (!fn)
      fail("cuda backend has no kernel ", kernel);
    fn({attrs, &in, 1, &out, 1, ctx});
  }
};

void testAllReduce(Rank &r, int world) {
  const int64_t n = 100003;
  const char *ops[] = {"sum", "avg", "max"};
  for (int bf16 = 0; bf16 < 2; ++bf16)
    for (int o = 0; o < 3; ++o) {
      int seed = 10 + 3 * bf16 + o;
      Tensor t = r.upload(inputOf(r.comm.rank(), seed, n, bf16), {n}, bf16);
      Attrs a;
      a.setStr("group", "world");
      a.setStr("reduction", ops[o]);
      r.call("all_reduce", a, t, t);
      std::vector<float> got = r.download(t);
      std::vector<std::vector<float>> all;
      for (int m = 0; m < world; ++m)
        all.push_back(inputOf(m, seed, n, bf16));
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        double acc = all[0][i];
        for (int m = 1; m < world; ++m)
          acc = o == 2 ? std::max(acc, double(all[m][i])) : acc + all[m][i];
        if (o == 1)
          acc /= world;
        float want = static_cast<float>(acc);
        if (bf16)
          want = roundBf16(want);
        bad += std::memcmp(&want, &got[i], 4) != 0;
      }
      check(bad == 0, r.comm.rank(),
            std::string("all_reduce ") + ops[o] + (bf16 ? " bf16" : " f32") +
                ": " + std::to_string(bad) + " elements differ");
      r.be.release(t.data);
    }
}

void testLayouts(Rank &r, int world) {
  int me = r.comm.rank();
  Attrs a;
  a.setStr("group", "world");
  a.setInt("dim", 1);
  { // all_gather: y[o][m*5 + j][i] = x_m[o][j][i]
    Tensor x = r.upload(inputOf(me, 20, 3 * 5 * 7, false), {3, 5, 7}, false);
    Tensor y = r.empty({3, 5 * world, 7});
    r.call("all_gather", a, x, y);
    std::vector<float> got = r.download(y);
    int64_t bad = 0;
    for (int m = 0; m < world; ++m) {
      std::vector<float> xm = inputOf(m, 20, 3 * 5 * 7, false);
      for (int o = 0; o < 3; ++o)
        for (int j = 0; j < 5; ++j)
          for (int i = 0; i < 7; ++i)
            bad += got[(o * 5 * world + m * 5 + j) * 7 + i] !=
                   xm[(o * 5 + j) * 7 + i];
    }
    check(bad == 0, me, "all_gather dim 1: " + std::to_string(bad) + " wrong");
  }
  { // reduce_scatter: y[o][j][i] = sum_m x_m[o][me*4 + j][i]
    int64_t n = 3 * 4 * world * 5;
    Tensor x = r.upload(inputOf(me, 21, n, false), {3, 4 * world, 5}, false);
    Tensor y = r.empty({3, 4, 5});
    r.call("reduce_scatter", a, x, y);
    std::vector<float> got = r.download(y);
    std::vector<std::vector<float>> all;
    for (int m = 0; m < world; ++m)
      all.push_back(inputOf(m, 21, n, false));
    int64_t bad = 0;
    for (int o = 0; o < 3; ++o)
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 5; ++i) {
          int64_t src = (o * 4 * world + me * 4 + j) * 5 + i;
          double acc = all[0][src];
          for (int m = 1; m < world; ++m)
            acc += all[m][src];
          bad += got[(o * 4 + j) * 5 + i] != static_cast<float>(acc);
        }
    check(bad == 0, me, "reduce_scatter dim 1: " + std::to_string(bad) + " wrong");
  }
  { // all_to_all: x [2*world, 3] split on 0; y [2, 3*world], piece m at
    // columns m*3.. holding x_m's rows me*2..me*2+1.
    Attrs t;
    t.setStr("group", "world");
    t.setInt("split_dim", 0);
    t.setInt("concat_dim", 1);
    int64_t n = 2 * world * 3;
    Tensor x = r.upload(inputOf(me, 22, n, false), {2 * world, 3}, false);
    Tensor y = r.empty({2, 3 * world});
    r.call("all_to_all", t, x, y);
    std::vector<float> got = r.download(y);
    int64_t bad = 0;
    for (int m = 0; m < world; ++m) {
      std::vector<float> xm = inputOf(m, 22, n, false);
      for (int row = 0; row < 2; ++row)
        for (int c = 0; c < 3; ++c)
          bad += got[row * 3 * world + m * 3 + c] != xm[(me * 2 + row) * 3 + c];
    }
    check(bad == 0, me, "all_to_all: " + std::to_string(bad) + " wrong");
  }
}

void testSendRecv(Rank &r, int world) {
  int me = r.comm.rank(), next = (me + 1) % world,
      prev = (me + world - 1) % world;
  const int64_t n = 4099;
  // Two messages to the next rank, tags 1 then 2, received in reverse order;
  // the second stored bf16 on the sender and fp32 at the receiver.
  Tensor a1 = r.upload(inputOf(me, 30, n, false), {n}, false);
  Tensor a2 = r.upload(inputOf(me, 31, n, true), {n}, true);
  Attrs s1, s2;
  s1.setInt("peer", next);
  s1.setInt("tag", 1);
  s2.setInt("peer", next);
  s2.setInt("tag", 2);
  Tensor none{};
  KernelFn send = r.be.lookup("send"), recv = r.be.lookup("recv");
  send({s1, &a1, 1, &none, 0, r.ctx});
  send({s2, &a2, 1, &none, 0, r.ctx});
  // The sender may overwrite its buffers at once (eager send).
  r.be.zeroStorage(a1.data, n * 4);
  Tensor b1 = r.empty({n}, true), b2 = r.empty({n});
  s1.setInt("peer", prev);
  s2.setInt("peer", prev);
  recv({s2, &none, 0, &b2, 1, r.ctx});
  recv({s1, &none, 0, &b1, 1, r.ctx});
  std::vector<float> g1 = r.download(b1), g2 = r.download(b2);
  std::vector<float> w1 = inputOf(prev, 30, n, false),
                     w2 = inputOf(prev, 31, n, true);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad += g1[i] != roundBf16(w1[i]) || g2[i] != w2[i];
  check(bad == 0, me, "send/recv ring: " + std::to_string(bad) + " wrong");
}

/// Rank 1 fails; everybody else's next collective must name it.
void testAbort(Rank &r, LocalWorld &world) {
  if (r.comm.rank() == 1) {
    world.abort(1, "injected failure");
    return;
  }
  Tensor t = r.empty({1024});
  Attrs a;
  a.setStr("group", "world");
  std::string msg;
  try {
    r.call("all_reduce", a, t, t);
  } catch (const Error &e) {
    msg = e.what();
  }
  check(msg.find("rank 1 failed (injected failure)") != std::string::npos,
        r.comm.rank(), "abort: got '" + msg + "'");
}

double benchAllReduce(Rank &r, int64_t bytes, int iters) {
  int64_t n = bytes / 4;
  Tensor t = r.empty({n});
  Attrs a;
  a.setStr("group", "world");
  r.call("all_reduce", a, t, t); // warm-up: scratch, events
  r.be.synchronize();
  r.comm.barrier();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    r.call("all_reduce", a, t, t);
  r.be.synchronize();
  r.comm.barrier();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                 .count();
  r.be.release(t.data);
  return s / iters;
}

// ep_dispatch then ep_combine over the world (docs/expert-parallel.md): 2
// experts per rank, rank i routes (i + e) % 3 rows of 4 floats to expert e,
// row k = v + c/8 with v = 1000*i + 10*e + k; dispatch groups them by local
// expert (source rank minor), zero past the total; combine returns x. Under
// NCCL the payload moves by ncclSend/ncclRecv; else it is host-staged.
void testExpertDispatch(Rank &r, int world) {
  int me = r.comm.rank();
  const int per = 2, E = per * world, H = 4;
  auto cnt = [](int i, int e) { return (i + e) % 3; };
  std::vector<float> counts(E), x;
  for (int e = 0; e < E; ++e) {
    counts[e] = float(cnt(me, e));
    for (int k = 0; k < cnt(me, e); ++k)
      for (int c = 0; c < H; ++c)
        x.push_back(1000.f * me + 10.f * e + k + c / 8.f);
  }
  int64_t rows = int64_t(x.size()) / H + 1, cap = 2 * world * per + 1;
  x.resize(rows * H, 0.f);
  Attrs a;
  a.setStr("group", "world");
  Tensor in[2] = {r.upload(x, {rows, H}, false), r.upload(counts, {E}, false)};
  Tensor out[2] = {r.empty({cap, H}), r.empty({per})};
  r.be.lookup("ep_dispatch")({a, in, 2, out, 2, r.ctx});
  std::vector<float> y = r.download(out[0]), local = r.download(out[1]);
  int64_t bad = 0, row = 0;
  for (int le = 0; le < per; ++le) {
    int e = me * per + le, sum = 0;
    for (int i = 0; i < world; ++i)
      for (int k = 0; k < cnt(i, e); ++k, ++row, ++sum)
        for (int c = 0; c < H; ++c)
          bad += y[row * H + c] != 1000.f * i + 10.f * e + k + c / 8.f;
    bad += local[le] != float(sum);
  }
  for (; row < cap; ++row)
    for (int c = 0; c < H; ++c)
      bad += y[row * H + c] != 0.f;
  check(bad == 0, me, "ep_dispatch: " + std::to_string(bad) + " wrong");
  Tensor cin[2] = {out[0], in[1]};
  Tensor cout[1] = {r.empty({rows, H})};
  r.be.lookup("ep_combine")({a, cin, 2, cout, 1, r.ctx});
  std::vector<float> back = r.download(cout[0]);
  bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    bad += back[i] != x[i];
  check(bad == 0, me, "ep_combine: " + std::to_string(bad) + " wrong");
  for (Tensor *t : {&in[0], &in[1], &out[0], &out[1], &cout[0]})
    r.be.release(t->data);
}

// MAPP_COMM_TEST_NCCL=1: the expert dispatch/combine over an NCCL world,
// rank r on GPU r (needs WORLD GPUs).
int runNcclWorld(int world) {
  std::unique_ptr<LocalWorld> lw = createNcclWorld(world);
  std::vector<std::thread> threads;
  int before = gFailures.load();
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<Communicator> comm = lw->connect(rank);
        comm->setTimeout(60);
        comm->setLayout({world, 1, 1});
        std::unique_ptr<Backend> be = createCudaBackend(comm->deviceOrdinal());
        Rank r{*comm, *be, {}};
        r.ctx.comm = comm.get();
        r.ctx.backend = be.get();
        testExpertDispatch(r, world);
        be->synchronize();
        comm->barrier();
      } catch (const std::exception &e) {
        check(false, rank, std::string("error: ") + e.what());
        lw->abort(rank, e.what());
      }
    });
  for (std::thread &t : threads)
    t.join();
  return gFailures.load() - before;
}

// --- context parallelism: cp_attention / cp_attention_grad against a
// double-precision attention of the whole sequence (causal, GQA, rotary at
// global positions), each rank's rows at its chunks r and 2n−1−r. comm a2a
// always; ring as MAPP_CUDA_CP_RING selects (main runs it with "device").

struct CpGeo {
  int64_t b = 2, s = 0, heads = 8, kv = 4, d = 16;
  int64_t h() const { return heads * d; }
  int64_t hk() const { return kv * d; }
};

/// The global position of row t of member m's share (tl rows, n members).
int64_t cpPos(int64_t m, int64_t t, int64_t tl, int64_t n) {
  int64_t c = tl / 2;
  return t < c ? m * c + t : (2 * n - 1 - m) * c + (t - c);
}

/// Rotates (inverse: back) rows [B, S, width] in place at positions 0..S−1.
void cpRefRotate(std::vector<double> &x, const CpGeo &g, int64_t width,
                 bool inverse) {
  int64_t half = g.d / 2;
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t t = 0; t < g.s; ++t)
      for (int64_t i = 0; i < half; ++i) {
        double th = t * std::pow(10000.0, -2.0 * i / g.d);
        double c = std::cos(th), sn = (inverse ? -1 : 1) * std::sin(th);
        for (int64_t hd = 0; hd < width / g.d; ++hd) {
          double *row = &x[(b * g.s + t) * width + hd * g.d];
          double x0 = row[i], x1 = row[i + half];
          row[i] = x0 * c - x1 * sn;
          row[i + half] = x1 * c + x0 * sn;
        }
      }
}

/// o, and with dout the gradients dq, dk, dv, of causal GQA attention with
/// rotary over the whole sequence, in double.
void cpReference(const CpGeo &g, const std::vector<float> &qf,
                 const std::vector<float> &kf, const std::vector<float> &vf,
                 const std::vector<float> &dof, std::vector<double> &o,
                 std::vector<double> &dq, std::vector<double> &dk,
                 std::vector<double> &dv) {
  std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()),
      v(vf.begin(), vf.end());
  cpRefRotate(q, g, g.h(), false);
  cpRefRotate(k, g, g.hk(), false);
  double scale = 1.0 / std::sqrt(double(g.d));
  int64_t H = g.h(), HK = g.hk(), group = g.heads / g.kv;
  o.assign(q.size(), 0);
  dq.assign(q.size(), 0);
  dk.assign(k.size(), 0);
  dv.assign(v.size(), 0);
  std::vector<double> p(g.s), dp(g.s);
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t hd = 0; hd < g.heads; ++hd) {
      int64_t kh = hd / group;
      for (int64_t i = 0; i < g.s; ++i) {
        const double *qi = &q[(b * g.s + i) * H + hd * g.d];
        double m = -1e300, l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double *kj = &k[(b * g.s + j) * HK + kh * g.d];
          double sc = 0;
          for (int64_t e = 0; e < g.d; ++e)
            sc += qi[e] * kj[e];
          p[j] = sc * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j <= i; ++j)
          l += (p[j] = std::exp(p[j] - m));
        double *oi = &o[(b * g.s + i) * H + hd * g.d];
        for (int64_t j = 0; j <= i; ++j) {
          p[j] /= l;
          const double *vj = &v[(b * g.s + j) * HK + kh * g.d];
          for (int64_t e = 0; e < g.d; ++e)
            oi[e] += p[j] * vj[e];
        }
        // Backward of this row: dS = P ∘ (dP − Σ P dP).
        const float *doi = &dof[(b * g.s + i) * H + hd * g.d];
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double *vj = &v[(b * g.s + j) * HK + kh * g.d];
          dp[j] = 0;
          for (int64_t e = 0; e < g.d; ++e)
            dp[j] += doi[e] * vj[e];
          delta += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          double ds = p[j] * (dp[j] - delta) * scale;
          const double *kj = &k[(b * g.s + j) * HK + kh * g.d];
          double *dkj = &dk[(b * g.s + j) * HK + kh * g.d];
          double *dvj = &dv[(b * g.s + j) * HK + kh * g.d];
          double *dqi = &dq[(b * g.s + i) * H + hd * g.d];
          for (int64_t e = 0; e < g.d; ++e) {
            dqi[e] += ds * kj[e];
            dkj[e] += ds * qi[e];
            dvj[e] += p[j] * doi[e];
          }
        }
      }
    }
  cpRefRotate(dq, g, H, true);
  cpRefRotate(dk, g, HK, true);
}

/// Rows of a whole [B, S, w] tensor that member m holds.
std::vector<float> cpShare(const std::vector<float> &whole, const CpGeo &g,
                           int64_t w, int m, int n) {
  int64_t tl = g.s / n;
  std::vector<float> s(g.b * tl * w);
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t t = 0; t < tl; ++t)
      std::copy_n(&whole[(b * g.s + cpPos(m, t, tl, n)) * w], w,
                  &s[(b * tl + t) * w]);
  return s;
}

/// Worst |got − want| over member m's rows, relative to want's largest.
double cpWorst(const std::vector<float> &got, const std::vector<double> &want,
               const CpGeo &g, int64_t w, int m, int n) {
  int64_t tl = g.s / n;
  double worst = 0, top = 1e-30;
  for (double x : want)
    top = std::max(top, std::fabs(x));
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t t = 0; t < tl; ++t)
      for (int64_t e = 0; e < w; ++e)
        worst = std::max(worst,
                         std::fabs(got[(b * tl + t) * w + e] -
                                   want[(b * g.s + cpPos(m, t, tl, n)) * w + e]));
  return worst / top;
}

void testContextParallel(Rank &r, int world) {
  int me = r.comm.rank();
  CpGeo g;
  g.s = 8 * world;
  if (g.kv % world)
    g.kv = world; // a2a splits the key/value heads over the group
  std::vector<float> q = inputOf(0, 40, g.b * g.s * g.h(), false),
                     k = inputOf(0, 41, g.b * g.s * g.hk(), false),
                     v = inputOf(0, 42, g.b * g.s * g.hk(), false),
                     dout = inputOf(0, 43, g.b * g.s * g.h(), false);
  // The references of the fp32 inputs and of their bf16 roundings.
  std::vector<double> ref[2][4];
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    auto rounded = [&](std::vector<float> x) {
      if (bf16)
        for (float &e : x)
          e = roundBf16(e);
      return x;
    };
    cpReference(g, rounded(q), rounded(k), rounded(v), rounded(dout),
                ref[bf16][0], ref[bf16][1], ref[bf16][2], ref[bf16][3]);
  }
  for (const char *comm : {"a2a", "ring"})
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      const std::vector<double> &o = ref[bf16][0], &dq = ref[bf16][1],
                                &dk = ref[bf16][2], &dv = ref[bf16][3];
      Attrs a;
      a.setStr("group", "world");
      a.setInt("members", world);
      a.setStr("comm", comm);
      a.setInt("heads", g.heads);
      a.setFloat("scale", 1.0 / std::sqrt(double(g.d)));
      a.setInt("causal", 1);
      a.setInt("rotary", 1);
      int64_t tl = g.s / world;
      auto up = [&](const std::vector<float> &whole, int64_t w) {
        std::vector<float> s = cpShare(whole, g, w, me, world);
        if (bf16)
          for (float &x : s)
            x = roundBf16(x);
        return r.upload(s, {g.b, tl, w}, bf16);
      };
      Tensor in[4] = {up(dout, g.h()), up(q, g.h()), up(k, g.hk()),
                      up(v, g.hk())};
      Tensor out[3] = {r.empty({g.b, tl, g.h()}, bf16),
                       r.empty({g.b, tl, g.hk()}, bf16),
                       r.empty({g.b, tl, g.hk()}, bf16)};
      Tensor o1 = r.empty({g.b, tl, g.h()}, bf16);
      r.be.lookup("cp_attention")({a, in + 1, 3, &o1, 1, r.ctx});
      r.be.lookup("cp_attention_grad")({a, in, 4, out, 3, r.ctx});
      double tol = bf16 ? 3e-2 : 1e-4;
      struct {
        const char *name;
        const Tensor &t;
        const std::vector<double> &want;
        int64_t w;
      } rows[] = {{"o", o1, o, g.h()}, {"dq", out[0], dq, g.h()},
                  {"dk", out[1], dk, g.hk()}, {"dv", out[2], dv, g.hk()}};
      for (auto &x : rows) {
        double worst = cpWorst(r.download(x.t), x.want, g, x.w, me, world);
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "cp_attention comm=%s %s %s: worst %.2e of the largest "
                      "element, tolerance %.0e",
                      comm, bf16 ? "bf16" : "f32", x.name, worst, tol);
        check(worst <= tol, me, msg);
      }
      for (Tensor *t : {&in[0], &in[1], &in[2], &in[3], &out[0], &out[1],
                        &out[2], &o1})
        r.be.release(t->data);
    }
}

int runWorld(int world, int64_t benchBytes) {
  std::unique_ptr<LocalWorld> lw = createLocalWorld(world);
  std::vector<std::thread> threads;
  std::vector<double> secs(world, 0);
  int before = gFailures.load();
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<Communicator> comm = lw->connect(rank);
        comm->setTimeout(60);
        comm->setLayout({world, 1, 1});
        std::unique_ptr<Backend> be = createCudaBackend(0);
        Rank r{*comm, *be, {}};
        r.ctx.comm = comm.get();
        r.ctx.backend = be.get();
        testAllReduce(r, world);
        testLayouts(r, world);
        testSendRecv(r, world);
        testExpertDispatch(r, world);
        testContextParallel(r, world);
        if (benchBytes)
          secs[rank] = benchAllReduce(r, benchBytes, 10);
        be->synchronize();
        comm->barrier();
        testAbort(r, *lw);
      } catch (const std::exception &e) {
        check(false, rank, std::string("error: ") + e.what());
        lw->abort(rank, e.what());
      }
    });
  for (std::thread &t : threads)
    t.join();
  if (benchBytes && gFailures.load() == before) {
    double s = secs[0];
    double busbw = benchBytes * 2.0 * (world - 1) / world / s;
    std::printf("all_reduce world %d, %lld MiB fp32: %.3f ms, algbw %.1f GB/s, "
                "busbw %.1f GB/s\n",
                world, static_cast<long long>(benchBytes >> 20), s * 1e3,
                benchBytes / s / 1e9, busbw / 1e9);
  }
  return gFailures.load() - before;
}

} // namespace

int main(int argc, char **argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  // The cp case runs the ring on the device (the host ring is the CPU
  // kernel, checked by test_context_parallel.py).
  setenv("MAPP_CUDA_CP_RING", "device", 0);
  std::vector<int> worlds = {2, 4};
  if (argc > 1)
    worlds = {std::atoi(argv[1])};
  int64_t benchMiB = argc > 2 ? std::atoll(argv[2]) : 256;
  int bad = 0;
  const char *nccl = std::getenv("MAPP_COMM_TEST_NCCL");
  if (nccl && std::string(nccl) == "1") {
    for (int w : worlds) {
      int f = runNcclWorld(w);
      std::printf("nccl world %d: %s\n", w, f ? "FAIL" : "ok");
      bad += f;
    }
    std::printf("comm-test %s (%d failure(s))\n", bad ? "FAILED" : "ok", bad);
    return bad ? 1 : 0;
  }
  for (int w : worlds) {
    int f = runWorld(w, benchMiB << 20);
    std::printf("world %d: %s\n", w, f ? "FAIL" : "ok");
    bad += f;
  }
  std::printf("comm-test %s (%d failure(s))\n", bad ? "FAILED" : "ok", bad);
  return bad ? 1 : 0;
}
