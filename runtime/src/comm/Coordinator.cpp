// The bit-vector coordinator (Coordinator.h).
#include "mapp/rt/Coordinator.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <sstream>

using namespace mapp::rt;

CoordinatorStats mapp::rt::coordinate(Communicator &comm,
                                      const CommGroup &world, int numOps,
                                      std::vector<CoordinatedOp> ops) {
  const int w = world.size();
  const int me = world.indexOf(comm.rank());
  if (me < 0)
    fail("coordinator: rank ", comm.rank(), " is not in ", world.str());
  std::vector<int> opOf(numOps, -1); // index into ops of a posted id
  for (size_t i = 0; i < ops.size(); ++i) {
    const CoordinatedOp &op = ops[i];
    if (op.id < 0 || op.id >= numOps)
      fail("coordinator: op id ", op.id, " outside [0, ", numOps, ")");
    if (opOf[op.id] >= 0)
      fail("coordinator: op ", op.id, " posted twice on rank ", comm.rank());
    if (std::find(op.members.begin(), op.members.end(), comm.rank()) ==
        op.members.end())
      fail("coordinator: rank ", comm.rank(), " posted op ", op.id,
           " it is no member of");
    opOf[op.id] = static_cast<int>(i);
  }
  CoordinatorStats stats;
  stats.tableBytes = int64_t(numOps) * w * sizeof(double);
  std::vector<bool> done(ops.size(), false);
  std::vector<double> table(static_cast<size_t>(numOps) * w);
  for (;;) {
    std::fill(table.begin(), table.end(), 0.0);
    for (size_t i = 0; i < ops.size(); ++i)
      if (!done[i])
        table[static_cast<size_t>(ops[i].id) * w + me] = 1;
    comm.allReduce(table.data(), static_cast<int64_t>(table.size()),
                   ReduceOp::Sum, world);
    ++stats.rounds;
    // Every rank sees the same table, so all take the same decisions.
    bool pending = false, fired = false;
    int stuck = -1;
    for (int id = 0; id < numOps; ++id) {
      const double *row = &table[static_cast<size_t>(id) * w];
      bool any = std::any_of(row, row + w, [](double x) { return x != 0; });
      if (!any)
        continue;
      pending = true;
      // Members come from the ranks that posted it; a rank that is a
      // member but has not posted leaves its entry 0. The poster's own
      // member list decides who must agree.
      int i = opOf[id];
      if (i < 0 || done[i]) {
        // Not ours: whether it fires is decided by its members alike; we
        // only need to know whether something fired this round.
        continue;
      }
      bool ready = true;
      for (int m : ops[i].members) {
        int idx = world.indexOf(m);
        if (idx < 0 || row[idx] == 0)
          ready = false;
      }
      if (ready) {
        ops[i].run();
        done[i] = true;
        fired = true;
      } else if (stuck < 0) {
        stuck = id;
      }
    }
    if (!pending)
      return stats;
    // Progress must be global: a rank with nothing ready still waits for
    // others that fired. Agree on it with a second, tiny reduction.
    double progress = fired ? 1 : 0;
    comm.allReduce(&progress, 1, ReduceOp::Sum, world);
    if (progress == 0) {
      std::ostringstream os;
      if (stuck >= 0) {
        const double *row = &table[static_cast<size_t>(stuck) * w];
        for (int m : ops[opOf[stuck]].members)
          if (world.indexOf(m) >= 0 && row[world.indexOf(m)] == 0)
            os << (os.tellp() ? "," : "") << m;
        fail("coordinator: op ", stuck, " can never fire: rank(s) ", os.str(),
             " did not post it");
      }
      fail("coordinator: no operation can fire (ranks disagree on the "
           "operations)");
    }
  }
}
