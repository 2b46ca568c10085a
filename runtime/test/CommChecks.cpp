//===- CommChecks.cpp -----------------------------------------------------===//
#include "CommChecks.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

void expect(bool ok, const std::string &what) {
  if (!ok)
    fail("comm check failed: ", what);
}

void near(double got, double want, const std::string &what) {
  if (std::fabs(got - want) > 1e-6 * std::max(1.0, std::fabs(want)))
    fail("comm check failed: ", what, ": got ", got, ", want ", want);
}

/// Runs a communication kernel of the CPU backend on one input/output.
void kernel(Backend &be, Communicator &c, const char *name, const Attrs &at,
            std::vector<float> &x, const Shape &xs, std::vector<float> &y,
            const Shape &ys) {
  Tensor in{x.data(), TensorType{DType::F32, xs}};
  Tensor out{y.data(), TensorType{DType::F32, ys}};
  KernelContext ctx;
  ctx.comm = &c;
  ctx.pool = &be.pool();
  KernelArgs a{at, &in, 1, &out, 1, ctx};
  be.lookup(name)(a);
}

template <typename T>
void checkAllReduce(Communicator &c, const CommGroup &g, ReduceOp op,
                    const char *opName) {
  const int count = 7; // not a multiple of the group size: uneven chunks
  int r = c.rank();
  std::vector<T> buf(count);
  for (int i = 0; i < count; ++i)
    buf[i] = static_cast<T>((r + 1) * (i + 1));
  c.allReduce(buf.data(), count, op, g);
  double sum = 0, mx = 0;
  for (int m : g.members) {
    sum += m + 1;
    mx = std::max(mx, double(m + 1));
  }
  for (int i = 0; i < count; ++i) {
    double want = op == ReduceOp::Sum   ? sum * (i + 1)
                  : op == ReduceOp::Max ? mx * (i + 1)
                                        : sum * (i + 1) / g.size();
    near(buf[i], want,
         std::string("all_reduce ") + opName + " over " + g.str() +
             " element " + std::to_string(i) + " on rank " +
             std::to_string(r));
  }
}

/// Variable all-to-all: member i sends member j (i + 2j) % 3 floats of value
/// 1000*i + 10*j + k, received counts given (or exchanged).
void checkAllToAllv(Communicator &c, const CommGroup &g, bool exchange) {
  int n = g.size(), me = g.indexOf(c.rank());
  auto len = [](int i, int j) { return (i + 2 * j) % 3; };
  std::vector<float> in, out;
  std::vector<uint64_t> sb(n), rb(n);
  for (int j = 0; j < n; ++j) {
    sb[j] = len(me, j) * sizeof(float);
    rb[j] = len(j, me) * sizeof(float);
    for (int k = 0; k < len(me, j); ++k)
      in.push_back(1000.f * me + 10.f * j + k);
  }
  if (exchange) {
    std::vector<uint64_t> got = c.exchangeCounts(sb, g);
    expect(got == rb, "exchangeCounts over " + g.str());
  }
  size_t total = 0;
  for (uint64_t b : rb)
    total += b / sizeof(float);
  out.assign(std::max<size_t>(total, 1), -1.f);
  c.allToAllv(in.data(), sb, out.data(), rb, g);
  size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < len(i, me); ++k)
      near(out[at++], 1000.0 * i + 10.0 * me + k,
           "all_to_allv over " + g.str() + " from member " + std::to_string(i) +
               " on rank " + std::to_string(c.rank()));
}

/// ep_dispatch then ep_combine over g: 2 experts per member, member i routed
/// (i + e) % 3 rows of 2 floats to expert e, row k = (v, -v) with v = 1000*i
/// + 10*e + k. Dispatch groups them by local expert, source member minor;
/// combine returns x exactly (padding rows zero).
void checkExpertDispatch(Backend &be, Communicator &c, const CommGroup &g) {
  int n = g.size(), me = g.indexOf(c.rank());
  const int perMember = 2, E = perMember * n, H = 2;
  auto cnt = [](int i, int e) { return (i + e) % 3; };
  std::vector<float> counts(E), x;
  for (int e = 0; e < E; ++e) {
    counts[e] = float(cnt(me, e));
    for (int k = 0; k < cnt(me, e); ++k) {
      float v = 1000.f * me + 10.f * e + k;
      x.push_back(v);
      x.push_back(-v);
    }
  }
  int64_t rows = static_cast<int64_t>(x.size()) / H + 1; // one padding row
  x.resize(rows * H, 0.f);
  int64_t cap = 2 * n * perMember + 1;
  std::vector<float> y(cap * H, -7.f), local(perMember, -1.f);
  Attrs at;
  at.setStr("group", g.kind); // tp, dp, pp or world
  Tensor ti[2] = {{x.data(), TensorType{DType::F32, {rows, H}}},
                  {counts.data(), TensorType{DType::F32, {E}}}};
  Tensor to[2] = {{y.data(), TensorType{DType::F32, {cap, H}}},
                  {local.data(), TensorType{DType::F32, {perMember}}}};
  KernelContext ctx;
  ctx.comm = &c;
  ctx.pool = &be.pool();
  PeerBytes pb;
  ctx.peerBytes = &pb;
  be.lookup("ep_dispatch")({at, ti, 2, to, 2, ctx});
  std::string where = " over " + g.str() + " on rank " + std::to_string(c.rank());
  int64_t row = 0;
  for (int le = 0; le < perMember; ++le) {
    int e = me * perMember + le, sum = 0;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < cnt(i, e); ++k, ++row, ++sum) {
        near(y[row * H], 1000.0 * i + 10.0 * e + k, "ep_dispatch row" + where);
        near(y[row * H + 1], -(1000.0 * i + 10.0 * e + k),
             "ep_dispatch row" + where);
      }
    near(local[le], sum, "ep_dispatch local_counts" + where);
  }
  for (; row < cap; ++row)
    near(y[row * H], 0, "ep_dispatch padding is zero" + where);
  expect(pb.send.size() == size_t(n) && pb.recv.size() == size_t(n),
         "ep_dispatch peer bytes" + where);
  for (int j = 0; j < n; ++j) {
    uint64_t s = 0, r = 0;
    for (int le = 0; le < perMember; ++le) {
      s += cnt(me, j * perMember + le);
      r += cnt(j, me * perMember + le);
    }
    expect(pb.send[j] == s * H * 4 && pb.recv[j] == r * H * 4,
           "ep_dispatch bytes per peer" + where);
  }
  std::vector<float> back(rows * H, -7.f);
  Tensor ci[2] = {{y.data(), TensorType{DType::F32, {cap, H}}},
                  {counts.data(), TensorType{DType::F32, {E}}}};
  Tensor co[1] = {{back.data(), TensorType{DType::F32, {rows, H}}}};
  be.lookup("ep_combine")({at, ci, 2, co, 1, ctx});
  for (size_t i = 0; i < x.size(); ++i)
    near(back[i], x[i], "ep_combine returns x" + where);
}

} // namespace

void mapp::rt::test::runCommChecks(Communicator &c) {
  std::unique_ptr<Backend> be = createCpuBackend(1);
  int r = c.rank(), n = c.worldSize();
  std::string at = " on rank " + std::to_string(r);

  // Named groups resolve from the coordinates.
  const Layout &l = c.layout();
  expect(l.world() == n, "layout matches the world");
  for (Group g : {Group::TP, Group::DP, Group::PP, Group::World}) {
    CommGroup cg = c.group(g);
    expect(cg.indexOf(r) >= 0, "rank in its own group");
    for (int m : cg.members) {
      bool same = (g == Group::TP || l.tpOf(m) == l.tpOf(r)) &&
                  (g == Group::DP || l.dpOf(m) == l.dpOf(r)) &&
                  (g == Group::PP || l.ppOf(m) == l.ppOf(r));
      expect(same || g == Group::World,
             std::string(groupName(g)) + " member coordinates" + at);
    }
  }

  for (Group g : {Group::TP, Group::DP, Group::PP, Group::World}) {
    CommGroup cg = c.group(g);
    checkAllReduce<float>(c, cg, ReduceOp::Sum, "sum");
    checkAllReduce<float>(c, cg, ReduceOp::Max, "max");
    checkAllReduce<float>(c, cg, ReduceOp::Avg, "avg");
    checkAllReduce<double>(c, cg, ReduceOp::Sum, "sum(f64)");
  }
  // An explicit group of ranks (the first and the last).
  if (n > 1 && (r == 0 || r == n - 1))
    checkAllReduce<float>(c, CommGroup{"ranks", {0, n - 1}}, ReduceOp::Sum,
                          "sum");

  for (Group gk : {Group::TP, Group::World}) {
    CommGroup g = c.group(gk);
    int gs = g.size(), idx = g.indexOf(r);
    Attrs a;
    a.setStr("group", groupName(gk));
    // all_gather along dim 1 of [2, 3].
    {
      Attrs ga = a;
      ga.setInt("dim", 1);
      std::vector<float> x(6), y(6 * gs);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          x[i * 3 + j] = r * 100 + i * 10 + j;
      kernel(*be, c, "all_gather", ga, x, {2, 3}, y, {2, 3 * gs});
      for (int i = 0; i < 2; ++i)
        for (int m = 0; m < gs; ++m)
          for (int j = 0; j < 3; ++j)
            near(y[i * 3 * gs + m * 3 + j], g.members[m] * 100 + i * 10 + j,
                 "all_gather dim 1 over " + g.str() + at);
      // ... and along dim 0.
      Attrs g0 = a;
      kernel(*be, c, "all_gather", g0, x, {2, 3}, y, {2 * gs, 3});
      for (int m = 0; m < gs; ++m)
        for (int k = 0; k < 6; ++k)
          near(y[m * 6 + k], g.members[m] * 100 + (k / 3) * 10 + k % 3,
               "all_gather dim 0 over " + g.str() + at);
    }
    // reduce_scatter along dim 1 of [2, 2*gs] and along dim -1 via avg.
    {
      Attrs ra = a;
      ra.setInt("dim", 1);
      std::vector<float> x(2 * 2 * gs), y(4);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2 * gs; ++j)
          x[i * 2 * gs + j] = r + i * 10 + j;
      kernel(*be, c, "reduce_scatter", ra, x, {2, 2 * gs}, y, {2, 2});
      double rs = 0;
      for (int m : g.members)
        rs += m;
      for (int i = 0; i < 2; ++i)
        for (int b = 0; b < 2; ++b)
          near(y[i * 2 + b], rs + gs * (i * 10 + idx * 2 + b),
               "reduce_scatter dim 1 over " + g.str() + at);
      Attrs avg = a;
      avg.setInt("dim", -1);
      avg.setStr("reduction", "avg");
      kernel(*be, c, "reduce_scatter", avg, x, {2, 2 * gs}, y, {2, 2});
      for (int i = 0; i < 2; ++i)
        for (int b = 0; b < 2; ++b)
          near(y[i * 2 + b], rs / gs + (i * 10 + idx * 2 + b),
               "reduce_scatter avg over " + g.str() + at);
    }
    // all_to_all: split dim 1 of [2, gs], concat dim 0 -> [2*gs, 1].
    {
      Attrs aa = a;
      aa.setInt("split_dim", 1);
      aa.setInt("concat_dim", 0);
      std::vector<float> x(2 * gs), y(2 * gs);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < gs; ++j)
          x[i * gs + j] = r * 100 + i * 10 + j;
      kernel(*be, c, "all_to_all", aa, x, {2, gs}, y, {2 * gs, 1});
      for (int m = 0; m < gs; ++m)
        for (int i = 0; i < 2; ++i)
          near(y[m * 2 + i], g.members[m] * 100 + i * 10 + idx,
               "all_to_all over " + g.str() + at);
    }
  }

  // Variable all-to-all and expert dispatch/combine over every named group.
  for (Group gk : {Group::TP, Group::DP, Group::PP, Group::World}) {
    CommGroup g = c.group(gk);
    checkAllToAllv(c, g, false);
    checkAllToAllv(c, g, true);
    checkExpertDispatch(*be, c, g);
  }

  // Point-to-point around the ring, two tags received in reverse order.
  if (n > 1) {
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> a(5, float(r)), b(3, float(r + 1000));
    c.send(a.data(), a.size() * 4, next, 5);
    c.send(b.data(), b.size() * 4, next, 6);
    std::vector<float> ga(5), gb(3);
    c.recv(gb.data(), gb.size() * 4, prev, 6);
    c.recv(ga.data(), ga.size() * 4, prev, 5);
    for (float v : ga)
      near(v, prev, "recv tag 5" + at);
    for (float v : gb)
      near(v, prev + 1000, "recv tag 6" + at);
  }
  // Asynchronous: receives posted before the sends (any dtype: int32 and
  // double payloads), completed through waitAny in whatever order, with the
  // sender's time stamp; a deadline on a receive that never comes.
  if (n > 1) {
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    int32_t gi = -1;
    double gd = -1;
    P2PHandle hi = c.irecv(&gi, 4, prev, 7), hd = c.irecv(&gd, 8, prev, 8);
    c.barrier();
    int32_t si = 40 + r;
    double sd = 0.5 + r;
    c.isend(&sd, 8, next, 8);
    c.isend(&si, 4, next, 7);
    std::vector<P2PRequest *> left = {hi.get(), hd.get()};
    while (!left.empty()) {
      int k = c.waitAny(left);
      expect(k >= 0, "waitAny without a deadline returns a request" + at);
      left.erase(left.begin() + k);
    }
    near(gi, 40 + prev, "irecv int32" + at);
    near(gd, 0.5 + prev, "irecv double" + at);
    expect(hi->sentNs > 0 && hi->completedNs > 0, "irecv time stamps" + at);
    int32_t never = 0;
    P2PHandle hn = c.irecv(&never, 4, prev, 9);
    expect(c.waitAny({hn.get()}, p2pNowNs() + 2000000) == -1,
           "waitAny honours its deadline" + at);
    c.cancel(*hn);
  }
  c.barrier();
  c.flush();
}
