// MegaFBD run-time pieces: the placement table and the parameter copy from
// the backward ranks to the forward ranks after each update.
#include "mapp/rt/Fbd.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Coordinator.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

using namespace mapp::rt;

namespace {

/// Piece `idx` of `n` of a full tensor cut along `dim` into `blocks` blocks
/// (plan.fbs shard_dim): copied into (toPiece) or out of `piece`.
void copyPiece(float *full, float *piece, const Shape &pieceShape, int dim,
               int blocks, int n, int idx, bool toPiece) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i)
    outer *= pieceShape[i];
  for (size_t i = dim + 1; i < pieceShape.size(); ++i)
    inner *= pieceShape[i];
  int64_t run = pieceShape[dim] / blocks * inner;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      float *f = full + ((o * blocks + b) * n + idx) * run;
      float *p = piece + (o * blocks + b) * run;
      if (toPiece)
        std::memcpy(p, f, run * sizeof(float));
      else
        std::memcpy(f, p, run * sizeof(float));
    }
}

int findParam(const Program &p, const std::string &name) {
  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].kind == ValueKind::Param && p.values[v].name == name)
      return static_cast<int>(v);
  return -1;
}

/// What backward rank `b` sends for `v`: its piece when sharded, the whole
/// tensor from tp index 0 only when replicated.
bool sends(const Program &b, const Value &v) {
  return v.shardDim >= 0 || b.tp == 0;
}

} // namespace

Layout mapp::rt::fbdForwardLayout(const Plan &plan) {
  // Roles, peers and the forward side's one tp were checked by the plan
  // verifier (PlanVerify.cpp verifyLayout).
  Layout l{0, plan.dp, plan.pp, plan.ep};
  for (const Program &p : plan.programs)
    if (p.placement.role == "fwd")
      l.tp = p.placement.tp;
  return l;
}

std::string mapp::rt::placedBackend(const Program &p,
                                    const std::string &fallback) {
  return p.placement.backend.empty() ? fallback : p.placement.backend;
}

int mapp::rt::placedDevice(const Program &p, int fallback) {
  return p.placement.device >= 0 ? p.placement.device : fallback;
}

void mapp::rt::checkPlacements(const Plan &plan, const std::string &fallback) {
  for (const Program &p : plan.programs) {
    std::string b = placedBackend(p, fallback);
    std::string where = "plan: placement of rank " + std::to_string(p.rank) +
                        " on " + b + ":" +
                        std::to_string(std::max(0, p.placement.device));
    if (b != "cpu" && b != "cuda")
      fail(where, ": unknown backend '", b, "' (cpu | cuda)");
    if (b == "cuda" && !cudaBackendBuilt())
      fail(where, ": this runtime is built without the CUDA backend");
    if (b == "cpu" && p.placement.device > 0)
      fail(where, ": no such device (the CPU backend has device 0 only)");
  }
}

std::string mapp::rt::placementTable(const Plan &plan,
                                     const std::string &fallback) {
  std::ostringstream os;
  os << "rank  role  stage  dp  tp  device    peer\n";
  std::vector<const Program *> ps;
  for (const Program &p : plan.programs)
    ps.push_back(&p);
  std::sort(ps.begin(), ps.end(),
            [](const Program *a, const Program *b) { return a->rank < b->rank; });
  for (const Program *p : ps) {
    std::string dev = placedBackend(*p, fallback);
    if (p->placement.device >= 0)
      dev += ":" + std::to_string(p->placement.device);
    char line[128];
    std::snprintf(line, sizeof line, "%4d  %-4s  %5d  %2d  %2d  %-8s  %4s\n",
                  p->rank, p->placement.role.empty() ? "-" : p->placement.role.c_str(),
                  p->pp, p->dp, p->tp, dev.c_str(),
                  p->placement.peerRank >= 0
                      ? std::to_string(p->placement.peerRank).c_str()
                      : "-");
    os << line;
  }
  return os.str();
}

void mapp::rt::syncFbdParams(Executor &exec, bool coordinated) {
  const Plan &plan = exec.plan();
  const Program &me = exec.program();
  Communicator &comm = exec.comm();
  // Every (backward, forward) pair of one (stage, dp), in rank order: the
  // same list on every rank, so its index is the coordinator's op id.
  std::vector<std::pair<const Program *, const Program *>> pairs;
  for (const Program &b : plan.programs)
    for (const Program &f : plan.programs)
      if (b.placement.role == "bwd" && f.placement.role == "fwd" &&
          b.pp == f.pp && b.dp == f.dp)
        pairs.push_back({&b, &f});
  std::sort(pairs.begin(), pairs.end(), [](const auto &x, const auto &y) {
    return std::make_pair(x.first->rank, x.second->rank) <
           std::make_pair(y.first->rank, y.second->rank);
  });
  // The backward programs of this rank's stage and dp index, by tp.
  std::vector<const Program *> bwds;
  for (const Program &q : plan.programs)
    if (q.placement.role == "bwd" && q.pp == me.pp && q.dp == me.dp)
      bwds.push_back(&q);
  std::sort(bwds.begin(), bwds.end(),
            [](const Program *a, const Program *b) { return a->tp < b->tp; });
  int n = static_cast<int>(bwds.size());
  std::vector<std::vector<float>> bufs(n);
  std::vector<CoordinatedOp> ops;
  for (size_t id = 0; id < pairs.size(); ++id) {
    const Program &b = *pairs[id].first, &f = *pairs[id].second;
    if (b.rank == me.rank) {
      ops.push_back({static_cast<int>(id), {b.rank, f.rank}, [&, fp = &f] {
                       std::vector<float> buf;
                       for (const Value &fv : fp->values) {
                         if (fv.kind != ValueKind::Param)
                           continue;
                         int v = findParam(me, fv.name);
                         if (v < 0)
                           fail("fbd: forward rank ", fp->rank,
                                " holds parameter '", fv.name,
                                "' that backward rank ", me.rank, " does not");
                         const Value &val = me.values[v];
                         if (!sends(me, val))
                           continue;
                         std::vector<float> h =
                             exec.readFloats(v, 0, 0, val.type.numel());
                         buf.insert(buf.end(), h.begin(), h.end());
                       }
                       comm.send(buf.data(), buf.size() * sizeof(float),
                                 fp->rank, kFbdParamTag);
                     }});
    } else if (f.rank == me.rank) {
      int i = b.tp;
      ops.push_back({static_cast<int>(id), {b.rank, f.rank}, [&, bp = &b, i] {
                       size_t count = 0;
                       for (const Value &fv : me.values)
                         if (fv.kind == ValueKind::Param) {
                           int v = findParam(*bp, fv.name);
                           if (v < 0)
                             fail("fbd: backward rank ", bp->rank,
                                  " lacks parameter '", fv.name, "'");
                           if (sends(*bp, bp->values[v]))
                             count += bp->values[v].type.numel();
                         }
                       bufs[i].resize(count);
                       comm.recv(bufs[i].data(), count * sizeof(float),
                                 bp->rank, kFbdParamTag);
                     }});
    }
  }
  if (coordinated) {
    std::vector<int> all(comm.worldSize());
    for (int r = 0; r < comm.worldSize(); ++r)
      all[r] = r;
    coordinate(comm, CommGroup{"world", all}, static_cast<int>(pairs.size()),
               std::move(ops));
  } else {
    for (CoordinatedOp &op : ops)
      op.run();
  }
  if (me.placement.role != "fwd")
    return;
  std::vector<size_t> at(n, 0);
  for (size_t mv = 0; mv < me.values.size(); ++mv) {
    const Value &mine = me.values[mv];
    if (mine.kind != ValueKind::Param)
      continue;
    // Reassemble the full tensor from the backward pieces, then cut ours.
    const Value &b0 = bwds[0]->values[findParam(*bwds[0], mine.name)];
    Shape full = b0.type.shape;
    if (b0.shardDim >= 0)
      full[b0.shardDim] *= n;
    std::vector<float> whole(numel(full));
    for (int i = 0; i < n; ++i) {
      const Value &bv = bwds[i]->values[findParam(*bwds[i], mine.name)];
      if (!sends(*bwds[i], bv))
        continue;
      float *src = bufs[i].data() + at[i];
      at[i] += bv.type.numel();
      if (bv.shardDim < 0)
        std::memcpy(whole.data(), src, whole.size() * sizeof(float));
      else
        copyPiece(whole.data(), src, bv.type.shape, bv.shardDim,
                  bv.shardBlocks, n, i, false);
    }
    std::vector<float> piece(mine.type.numel());
    if (mine.shardDim < 0) {
      if (piece.size() != whole.size())
        fail("fbd: parameter '", mine.name, "' has ", piece.size(),
             " elements on forward rank ", me.rank, ", ", whole.size(),
             " on the backward side");
      piece = std::move(whole);
    } else {
      int t1 = me.placement.tp;
      copyPiece(whole.data(), piece.data(), mine.type.shape, mine.shardDim,
                mine.shardBlocks, t1, me.tp, true);
    }
    exec.backend().copyToStorage(exec.valueData(static_cast<int>(mv)),
                                 piece.data(), piece.size() * sizeof(float));
  }
}
