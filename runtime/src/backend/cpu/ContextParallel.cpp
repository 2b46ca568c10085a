//===- ContextParallel.cpp - context-parallel kernels ---------------------===//
//
// Context parallelism (docs/context-parallel.md). The sequence of S tokens
// has 2·n chunks of S/(2·n) over the n members of the cp group; member r
// holds chunks r and 2n−1−r (causal load balancing), so its local row i is
// at global position pos(r, i). Masks and rotary angles use global
// positions throughout.
//
// cp_shard / cp_unshard move a member's share out of / into a whole
// sequence dimension (no communication).
//
// cp_attention, comm = "ring": each member rotates its K (rotary applied at
// its own positions) and V, sends them to the next member of the ring and
// works on the block it holds, merging the partial results with an online
// softmax (running max m, sum l and accumulator per query row). The send is
// buffered, so the block's transfer overlaps the current block's compute.
// The gradient recomputes the forward ring for each row's log-sum-exp, then
// sends K, V and the block's dK/dV accumulators around the ring once more:
// after n steps every block is back at its owner with the full dK/dV.
//
// comm = "a2a" (Ulysses): an all-to-all turns sequence-sharded q/k/v
// [B, S/n, H] into head-sharded ones [B, S, H/n] (rows in member order,
// the positions known), the attention runs on all S rows of the local heads
// and another all-to-all returns the output; the gradient does the same.
//
// Accumulation is in double: the results match the one-rank kernel's fp32
// to rounding.
//
//===----------------------------------------------------------------------===//
#include "../CollectiveArgs.h"
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

// MPI guarantees tags up to 32767; pipeline tags are tag·microbatches + mb.
constexpr int64_t kRingTag = 32001, kRingGradTag = 32002;

/// Global position of row i of member r's share (tl rows, n members).
int64_t globalPos(int64_t r, int64_t i, int64_t tl, int64_t n) {
  int64_t c = tl / 2;
  return i < c ? r * c + i : (2 * n - 1 - r) * c + (i - c);
}

std::vector<int64_t> positionsOf(int64_t r, int64_t tl, int64_t n) {
  std::vector<int64_t> p(tl);
  for (int64_t i = 0; i < tl; ++i)
    p[i] = globalPos(r, i, tl, n);
  return p;
}

/// Moves member r's two chunks between `whole` (S along dim) and `share`
/// (S/n along dim); toShare picks the direction. Elements are bytes-sized
/// `elem` (the layout ops take any dtype).
void moveShare(const Tensor &whole, const Tensor &share, int64_t dim,
               int64_t r, int64_t n, bool toShare, const char *kernel) {
  const Shape &ws = whole.type.shape;
  int64_t s = cpSequenceOf(ws, dim, n, kernel);
  size_t elem = dtypeSize(whole.type.dtype);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i)
    outer *= ws[i];
  for (size_t i = dim + 1; i < ws.size(); ++i)
    inner *= ws[i];
  int64_t c = s / (2 * n), tl = s / n;
  size_t chunkBytes = c * inner * elem;
  auto *w = static_cast<uint8_t *>(whole.data);
  auto *sh = static_cast<uint8_t *>(share.data);
  if (!toShare)
    std::memset(w, 0, whole.numel() * elem);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t part = 0; part < 2; ++part) {
      int64_t chunk = part == 0 ? r : 2 * n - 1 - r;
      uint8_t *wp = w + (o * s + chunk * c) * inner * elem;
      uint8_t *sp = sh + (o * tl + part * c) * inner * elem;
      if (toShare)
        std::memcpy(sp, wp, chunkBytes);
      else
        std::memcpy(wp, sp, chunkBytes);
    }
}

struct AttnDims {
  int64_t b = 0, heads = 0, kvHeads = 0, d = 0, group = 1;
  double scale = 1;
  bool causal = false, rotary = false;
  double base = 10000;
  int64_t rotDim = 0;
};

AttnDims attnDims(const KernelArgs &a, int64_t h, int64_t hk, int64_t b) {
  AttnDims d;
  d.b = b;
  d.heads = a.attrs.getInt("heads", 1);
  d.d = h / d.heads;
  d.kvHeads = d.d ? hk / d.d : 1;
  d.group = d.kvHeads ? d.heads / d.kvHeads : 1;
  d.scale = a.attrs.getFloat("scale", 1.0);
  d.causal = a.attrs.flag("causal");
  d.rotary = a.attrs.flag("rotary");
  d.base = a.attrs.getFloat("rotary_base", 10000.0);
  d.rotDim = a.attrs.getInt("rotary_dim", d.d);
  return d;
}

/// Rotates (inverse: back) the first rotDim columns of every head of x
/// [B, T, width] in place, row t at position pos[t] (rotate-half form, as
/// the one-rank kernel).
void rotate(const AttnDims &d, float *x, int64_t t, int64_t width,
            const std::vector<int64_t> &pos, bool inverse) {
  if (!d.rotary)
    return;
  int64_t half = d.rotDim / 2, nh = width / d.d;
  double sgn = inverse ? -1.0 : 1.0;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t r = 0; r < t; ++r)
      for (int64_t i = 0; i < half; ++i) {
        double theta = std::pow(d.base, -2.0 * i / d.rotDim);
        double c = std::cos(pos[r] * theta), s = sgn * std::sin(pos[r] * theta);
        for (int64_t h = 0; h < nh; ++h) {
          float *row = x + (b * t + r) * width + h * d.d;
          double x0 = row[i], x1 = row[i + half];
          row[i] = static_cast<float>(x0 * c - x1 * s);
          row[i + half] = static_cast<float>(x1 * c + x0 * s);
        }
      }
}

/// Online-softmax state of the query rows [B, heads, Tq] and their
/// accumulators [B, Tq, heads·D].
struct SoftmaxState {
  std::vector<double> m, l, acc;
  SoftmaxState(const AttnDims &d, int64_t tq)
      : m(d.b * d.heads * tq, -std::numeric_limits<double>::infinity()),
        l(d.b * d.heads * tq, 0.0), acc(d.b * tq * d.heads * d.d, 0.0) {}
};

/// Views of one block of operands: q [B, Tq, H], k/v [B, Tk, Hk] (rotated).
struct Block {
  const float *k, *v;
  int64_t tk;
  const std::vector<int64_t> *pos;
};

double score(const AttnDims &d, const float *qr, const float *kr) {
  double s = 0;
  for (int64_t c = 0; c < d.d; ++c)
    s += static_cast<double>(qr[c]) * kr[c];
  return s * d.scale;
}

/// Merges the block's keys into the state of the queries (positions qpos).
void forwardBlock(const AttnDims &d, const float *q, int64_t tq,
                  const std::vector<int64_t> &qpos, const Block &kb,
                  SoftmaxState &st) {
  int64_t h = d.heads * d.d, hk = d.kvHeads * d.d;
  std::vector<double> s(kb.tk);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t head = 0; head < d.heads; ++head) {
      int64_t g = head / d.group;
      for (int64_t i = 0; i < tq; ++i) {
        const float *qr = q + (b * tq + i) * h + head * d.d;
        double mb = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < kb.tk; ++j) {
          if (d.causal && (*kb.pos)[j] > qpos[i]) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          s[j] = score(d, qr, kb.k + (b * kb.tk + j) * hk + g * d.d);
          mb = std::max(mb, s[j]);
        }
        if (mb == -std::numeric_limits<double>::infinity())
          continue; // nothing visible in this block
        size_t si = (b * d.heads + head) * tq + i;
        double mNew = std::max(st.m[si], mb);
        double keep = std::exp(st.m[si] - mNew); // 0 for the first block
        double *acc = st.acc.data() + (b * tq + i) * h + head * d.d;
        st.l[si] *= keep;
        for (int64_t c = 0; c < d.d; ++c)
          acc[c] *= keep;
        for (int64_t j = 0; j < kb.tk; ++j) {
          if (s[j] == -std::numeric_limits<double>::infinity())
            continue;
          double p = std::exp(s[j] - mNew);
          st.l[si] += p;
          const float *vr = kb.v + (b * kb.tk + j) * hk + g * d.d;
          for (int64_t c = 0; c < d.d; ++c)
            acc[c] += p * vr[c];
        }
        st.m[si] = mNew;
      }
    }
}

/// out = acc / l; lse = m + log l per (b, head, row).
void finish(const AttnDims &d, int64_t tq, const SoftmaxState &st, float *out,
            std::vector<double> *lse) {
  int64_t h = d.heads * d.d;
  if (lse)
    lse->assign(st.m.size(), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t head = 0; head < d.heads; ++head)
      for (int64_t i = 0; i < tq; ++i) {
        size_t si = (b * d.heads + head) * tq + i;
        const double *acc = st.acc.data() + (b * tq + i) * h + head * d.d;
        for (int64_t c = 0; c < d.d; ++c)
          out[(b * tq + i) * h + head * d.d + c] =
              static_cast<float>(acc[c] / st.l[si]);
        if (lse)
          (*lse)[si] = st.m[si] + std::log(st.l[si]);
      }
}

/// The gradient contributions of one block: dq (queries, rotated frame)
/// and the block's dk/dv, from P = exp(s − lse) and Δ = rowsum(dO ∘ O).
void gradBlock(const AttnDims &d, const float *q, int64_t tq,
               const std::vector<int64_t> &qpos, const float *dout,
               const std::vector<double> &lse, const std::vector<double> &delta,
               const Block &kb, double *dq, double *dk, double *dv) {
  int64_t h = d.heads * d.d, hk = d.kvHeads * d.d;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t head = 0; head < d.heads; ++head) {
      int64_t g = head / d.group;
      for (int64_t i = 0; i < tq; ++i) {
        size_t si = (b * d.heads + head) * tq + i;
        const float *qr = q + (b * tq + i) * h + head * d.d;
        const float *dor = dout + (b * tq + i) * h + head * d.d;
        double *dqr = dq + (b * tq + i) * h + head * d.d;
        for (int64_t j = 0; j < kb.tk; ++j) {
          if (d.causal && (*kb.pos)[j] > qpos[i])
            continue;
          size_t kj = (b * kb.tk + j) * hk + g * d.d;
          const float *kr = kb.k + kj, *vr = kb.v + kj;
          double p = std::exp(score(d, qr, kr) - lse[si]);
          double dp = 0;
          for (int64_t c = 0; c < d.d; ++c) {
            dv[kj + c] += p * dor[c];
            dp += static_cast<double>(dor[c]) * vr[c];
          }
          double ds = p * (dp - delta[si]) * d.scale;
          for (int64_t c = 0; c < d.d; ++c) {
            dqr[c] += ds * kr[c];
            dk[kj + c] += ds * qr[c];
          }
        }
      }
    }
}

std::vector<double> rowDots(const AttnDims &d, int64_t tq, const float *dout,
                            const float *out) {
  int64_t h = d.heads * d.d;
  std::vector<double> delta(d.b * d.heads * tq, 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t head = 0; head < d.heads; ++head)
      for (int64_t i = 0; i < tq; ++i) {
        double s = 0;
        for (int64_t c = 0; c < d.d; ++c) {
          size_t e = (b * tq + i) * h + head * d.d + c;
          s += static_cast<double>(dout[e]) * out[e];
        }
        delta[(b * d.heads + head) * tq + i] = s;
      }
  return delta;
}

void toFloat(const std::vector<double> &src, float *dst) {
  for (size_t i = 0; i < src.size(); ++i)
    dst[i] = static_cast<float>(src[i]);
}

/// The ring's shared state: the group, this member, its neighbours.
struct Ring {
  Communicator &c;
  CommGroup g;
  int64_t n, self;
  int next, prev;
  Ring(Communicator &comm, CommGroup grp) : c(comm), g(std::move(grp)) {
    n = g.size();
    self = g.indexOf(c.rank());
    next = g.members[(self + 1) % n];
    prev = g.members[(self + n - 1) % n];
  }
};

/// The forward ring: q rotated at qpos; k (rotated at this member's
/// positions) and v travel. Returns the output and lse.
void ringForward(const AttnDims &d, Ring &ring, const float *q, int64_t tl,
                 std::vector<float> kv, int64_t hk, float *out,
                 std::vector<double> *lse, int64_t tag) {
  std::vector<int64_t> qpos = positionsOf(ring.self, tl, ring.n);
  SoftmaxState st(d, tl);
  size_t half = kv.size() / 2;
  std::vector<float> incoming(kv.size());
  for (int64_t s = 0; s < ring.n; ++s) {
    int64_t src = (ring.self - s + ring.n) % ring.n;
    // Buffered: the block is on its way while this one is used.
    if (s + 1 < ring.n)
      ring.c.send(kv.data(), kv.size() * sizeof(float), ring.next, tag);
    std::vector<int64_t> kpos = positionsOf(src, tl, ring.n);
    forwardBlock(d, q, tl, qpos, {kv.data(), kv.data() + half, tl, &kpos}, st);
    if (s + 1 < ring.n) {
      ring.c.recv(incoming.data(), incoming.size() * sizeof(float), ring.prev,
                  tag);
      kv.swap(incoming);
    }
  }
  (void)hk;
  finish(d, tl, st, out, lse);
}

/// k and v of [B, T, Hk] into one buffer [k | v], k rotated at pos.
std::vector<float> packKV(const AttnDims &d, const Tensor &k, const Tensor &v,
                          int64_t t, const std::vector<int64_t> &pos) {
  size_t n = k.numel();
  std::vector<float> kv(2 * n);
  std::copy(k.f32(), k.f32() + n, kv.data());
  std::copy(v.f32(), v.f32() + n, kv.data() + n);
  rotate(d, kv.data(), t, k.dim(2), pos, false);
  return kv;
}

// --- Ulysses: [B, Tl, W] sequence-sharded <-> [B, n·Tl, W/n] head-sharded.

/// x [B, Tl, W] of every member → y [B, n·Tl, W/n]: this member's column
/// block of every member's rows, in member order.
std::vector<float> seqToHeads(Ring &r, const float *x, int64_t b, int64_t tl,
                              int64_t w) {
  int64_t n = r.n, wl = w / n, blk = b * tl * wl;
  std::vector<float> send(b * tl * w), got(b * tl * w);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t t = 0; t < tl; ++t)
        std::copy(x + (bb * tl + t) * w + j * wl,
                  x + (bb * tl + t) * w + (j + 1) * wl,
                  send.data() + j * blk + (bb * tl + t) * wl);
  r.c.allToAll(send.data(), got.data(), blk * sizeof(float), r.g);
  std::vector<float> y(b * n * tl * wl);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t t = 0; t < tl; ++t)
        std::copy(got.data() + i * blk + (bb * tl + t) * wl,
                  got.data() + i * blk + (bb * tl + t + 1) * wl,
                  y.data() + (bb * n * tl + i * tl + t) * wl);
  return y;
}

/// The inverse: y [B, n·Tl, W/n] → x [B, Tl, W].
void headsToSeq(Ring &r, const float *y, int64_t b, int64_t tl, int64_t w,
                float *x) {
  int64_t n = r.n, wl = w / n, blk = b * tl * wl;
  std::vector<float> send(b * tl * w), got(b * tl * w);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t t = 0; t < tl; ++t)
        std::copy(y + (bb * n * tl + i * tl + t) * wl,
                  y + (bb * n * tl + i * tl + t + 1) * wl,
                  send.data() + i * blk + (bb * tl + t) * wl);
  r.c.allToAll(send.data(), got.data(), blk * sizeof(float), r.g);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t t = 0; t < tl; ++t)
        std::copy(got.data() + j * blk + (bb * tl + t) * wl,
                  got.data() + j * blk + (bb * tl + t + 1) * wl,
                  x + (bb * tl + t) * w + j * wl);
}

/// Positions of the head-sharded rows: member i's share, in member order.
std::vector<int64_t> allPositions(int64_t tl, int64_t n) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < tl; ++t)
      p.push_back(globalPos(i, t, tl, n));
  return p;
}

/// The attention dims of the local heads (a2a: heads/n and kvHeads/n).
AttnDims localHeads(AttnDims d, int64_t n) {
  d.heads /= n;
  d.kvHeads /= n;
  return d;
}

void checkA2a(const AttnDims &d, int64_t n, const char *kernel) {
  if (d.heads % n || d.kvHeads % n)
    fail(kernel, ": comm \"a2a\" splits the heads over the cp group: ",
         d.heads, " heads and ", d.kvHeads,
         " key/value heads must be divisible by cp = ", n);
}

} // namespace

void cpu::cp_shard(const KernelArgs &a) {
  auto [r, n] = cpMemberOf(a, "cp_shard");
  moveShare(a.in[0], a.out[0], a.attrs.getInt("dim", 1), r, n, true,
            "cp_shard");
}

void cpu::cp_unshard(const KernelArgs &a) {
  auto [r, n] = cpMemberOf(a, "cp_unshard");
  moveShare(a.out[0], a.in[0], a.attrs.getInt("dim", 1), r, n, false,
            "cp_unshard");
}

void cpu::cp_attention(const KernelArgs &a) {
  const char *k = "cp_attention";
  Communicator &c = communicatorOf(a, k);
  Ring ring(c, cpGroupOf(a, c, k));
  const Tensor &q = a.in[0], &kt = a.in[1], &vt = a.in[2];
  int64_t b = q.dim(0), tl = q.dim(1), h = q.dim(2), hk = kt.dim(2);
  AttnDims d = attnDims(a, h, hk, b);
  if (tl % 2)
    fail(k, ": the sequence share ", tl, " must be two equal chunks");
  std::vector<int64_t> qpos = positionsOf(ring.self, tl, ring.n);
  std::string comm = a.attrs.getStr("comm", "ring");
  if (comm == "ring") {
    std::vector<float> qr(q.f32(), q.f32() + q.numel());
    rotate(d, qr.data(), tl, h, qpos, false);
    ringForward(d, ring, qr.data(), tl, packKV(d, kt, vt, tl, qpos), hk,
                a.out[0].f32(), nullptr, kRingTag);
    return;
  }
  if (comm != "a2a")
    fail(k, ": comm must be \"ring\" or \"a2a\", got \"", comm, "\"");
  checkA2a(d, ring.n, k);
  AttnDims ld = localHeads(d, ring.n);
  int64_t s = ring.n * tl;
  std::vector<int64_t> pos = allPositions(tl, ring.n);
  std::vector<float> qh = seqToHeads(ring, q.f32(), b, tl, h);
  std::vector<float> kh = seqToHeads(ring, kt.f32(), b, tl, hk);
  std::vector<float> vh = seqToHeads(ring, vt.f32(), b, tl, hk);
  rotate(ld, qh.data(), s, h / ring.n, pos, false);
  rotate(ld, kh.data(), s, hk / ring.n, pos, false);
  SoftmaxState st(ld, s);
  forwardBlock(ld, qh.data(), s, pos, {kh.data(), vh.data(), s, &pos}, st);
  std::vector<float> oh(qh.size());
  finish(ld, s, st, oh.data(), nullptr);
  headsToSeq(ring, oh.data(), b, tl, h, a.out[0].f32());
}

void cpu::cp_attention_grad(const KernelArgs &a) {
  const char *k = "cp_attention_grad";
  Communicator &c = communicatorOf(a, k);
  Ring ring(c, cpGroupOf(a, c, k));
  const Tensor &dout = a.in[0], &q = a.in[1], &kt = a.in[2], &vt = a.in[3];
  int64_t b = q.dim(0), tl = q.dim(1), h = q.dim(2), hk = kt.dim(2);
  AttnDims d = attnDims(a, h, hk, b);
  if (tl % 2)
    fail(k, ": the sequence share ", tl, " must be two equal chunks");
  std::vector<int64_t> qpos = positionsOf(ring.self, tl, ring.n);
  std::string comm = a.attrs.getStr("comm", "ring");
  if (comm == "ring") {
    std::vector<float> qr(q.f32(), q.f32() + q.numel());
    rotate(d, qr.data(), tl, h, qpos, false);
    std::vector<float> kv = packKV(d, kt, vt, tl, qpos);
    // The forward again, for each row's log-sum-exp and Δ.
    std::vector<float> out(q.numel());
    std::vector<double> lse;
    ringForward(d, ring, qr.data(), tl, kv, hk, out.data(), &lse,
                kRingGradTag);
    std::vector<double> delta = rowDots(d, tl, dout.f32(), out.data());
    // K, V, dK, dV go around together; n sends bring each block home.
    size_t nk = kt.numel();
    std::vector<double> dq(q.numel(), 0.0), dkv(2 * nk, 0.0);
    std::vector<uint8_t> msg(2 * nk * sizeof(float) + 2 * nk * sizeof(double));
    for (int64_t s = 0; s < ring.n; ++s) {
      int64_t src = (ring.self - s + ring.n) % ring.n;
      std::vector<int64_t> kpos = positionsOf(src, tl, ring.n);
      gradBlock(d, qr.data(), tl, qpos, dout.f32(), lse, delta,
                {kv.data(), kv.data() + nk, tl, &kpos}, dq.data(), dkv.data(),
                dkv.data() + nk);
      if (ring.n == 1)
        break;
      std::memcpy(msg.data(), kv.data(), 2 * nk * sizeof(float));
      std::memcpy(msg.data() + 2 * nk * sizeof(float), dkv.data(),
                  2 * nk * sizeof(double));
      ring.c.send(msg.data(), msg.size(), ring.next, kRingGradTag);
      ring.c.recv(msg.data(), msg.size(), ring.prev, kRingGradTag);
      std::memcpy(kv.data(), msg.data(), 2 * nk * sizeof(float));
      std::memcpy(dkv.data(), msg.data() + 2 * nk * sizeof(float),
                  2 * nk * sizeof(double));
    }
    // The rotation is orthogonal: its gradient is the inverse rotation.
    float *dqo = a.out[0].f32(), *dko = a.out[1].f32(), *dvo = a.out[2].f32();
    toFloat(dq, dqo);
    for (size_t i = 0; i < nk; ++i) {
      dko[i] = static_cast<float>(dkv[i]);
      dvo[i] = static_cast<float>(dkv[nk + i]);
    }
    rotate(d, dqo, tl, h, qpos, true);
    rotate(d, dko, tl, hk, qpos, true);
    return;
  }
  if (comm != "a2a")
    fail(k, ": comm must be \"ring\" or \"a2a\", got \"", comm, "\"");
  checkA2a(d, ring.n, k);
  AttnDims ld = localHeads(d, ring.n);
  int64_t s = ring.n * tl, hl = h / ring.n, hkl = hk / ring.n;
  std::vector<int64_t> pos = allPositions(tl, ring.n);
  std::vector<float> qh = seqToHeads(ring, q.f32(), b, tl, h);
  std::vector<float> kh = seqToHeads(ring, kt.f32(), b, tl, hk);
  std::vector<float> vh = seqToHeads(ring, vt.f32(), b, tl, hk);
  std::vector<float> doh = seqToHeads(ring, dout.f32(), b, tl, h);
  rotate(ld, qh.data(), s, hl, pos, false);
  rotate(ld, kh.data(), s, hkl, pos, false);
  Block all{kh.data(), vh.data(), s, &pos};
  SoftmaxState st(ld, s);
  forwardBlock(ld, qh.data(), s, pos, all, st);
  std::vector<float> oh(qh.size());
  std::vector<double> lse;
  finish(ld, s, st, oh.data(), &lse);
  std::vector<double> delta = rowDots(ld, s, doh.data(), oh.data());
  std::vector<double> dq(qh.size(), 0.0), dk(kh.size(), 0.0),
      dv(vh.size(), 0.0);
  gradBlock(ld, qh.data(), s, pos, doh.data(), lse, delta, all, dq.data(),
            dk.data(), dv.data());
  std::vector<float> dqf(dq.size()), dkf(dk.size()), dvf(dv.size());
  toFloat(dq, dqf.data());
  toFloat(dk, dkf.data());
  toFloat(dv, dvf.data());
  rotate(ld, dqf.data(), s, hl, pos, true);
  rotate(ld, dkf.data(), s, hkl, pos, true);
  headsToSeq(ring, dqf.data(), b, tl, h, a.out[0].f32());
  headsToSeq(ring, dkf.data(), b, tl, hk, a.out[1].f32());
  headsToSeq(ring, dvf.data(), b, tl, hk, a.out[2].f32());
}
