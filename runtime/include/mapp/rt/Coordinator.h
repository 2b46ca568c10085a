//===- Coordinator.h - MegaFBD's bit-vector collective matcher --*- C++ -*-===//
//
// MegatronApp's FBD coordinator done as its paper describes it (the code
// ships it switched off and uses a central server rank instead): every rank
// writes the operations it is ready for into its own column of a table, one
// all-reduce (a sum of disjoint columns is their OR) shows every rank who is
// ready for what, and an operation fires only when all its members are.
// Fired operations run in ascending id on every member, so no two ranks can
// wait on each other in opposite orders (docs/megafbd.md, "Coordinator").
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_COORDINATOR_H
#define MAPP_RT_COORDINATOR_H

#include "mapp/rt/Comm.h"

#include <functional>
#include <vector>

namespace mapp::rt {

struct CoordinatedOp {
  /// The same id on every member, in [0, numOps).
  int id = 0;
  /// Ascending global ranks; a P2P transfer is the pair {src, dst}.
  std::vector<int> members;
  /// The collective or transfer itself (run once, on this rank).
  std::function<void()> run;
};

struct CoordinatorStats {
  int rounds = 0;          ///< all-reduces of the table
  int64_t tableBytes = 0;  ///< bytes of one table (numOps x world doubles)
};

/// Runs `ops` — the operations this rank is ready for, in any order — in an
/// order every rank of `world` agrees on. Every rank of `world` calls it
/// (with its own, possibly empty, list). Rounds repeat until no rank has an
/// operation left; a round in which nothing can fire is an Error naming the
/// first waiting operation and the ranks that never posted it.
CoordinatorStats coordinate(Communicator &comm, const CommGroup &world,
                            int numOps, std::vector<CoordinatedOp> ops);

} // namespace mapp::rt

#endif
