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
