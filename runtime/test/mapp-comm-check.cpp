//===- mapp-comm-check.cpp - communicator checks under mpirun -------------===//
//
// Test-only: mpirun -np N mapp-comm-check TP DP PP runs runCommChecks on the
// MPI communicator with that layout (TP*DP*PP = N); prints "comm-check ok"
// on rank 0 and exits 0, or names the failed check and exits 1.
//
//===----------------------------------------------------------------------===//
#include "CommChecks.h"
#include "mapp/rt/Error.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mapp::rt;

int main(int argc, char **argv) {
  bool badCounts = argc == 5 && std::string(argv[4]) == "bad-counts";
  if (argc != 4 && !badCounts) {
    std::fprintf(stderr, "usage: mapp-comm-check TP DP PP [bad-counts]\n");
    return 2;
  }
  int rank = -1;
  try {
    std::unique_ptr<Communicator> c = createMpiComm();
    rank = c->rank();
    Layout l{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3])};
    if (l.world() != c->worldSize())
      fail("layout ", l.tp, "x", l.dp, "x", l.pp, " != world ", c->worldSize());
    c->setLayout(l);
    c->setTimeout(60);
    if (badCounts) {
      // Rank 1 sends rank 2 (of the world) 12 bytes where 2 expects 8:
      // every rank must fail with the same message before payloads move.
      CommGroup g = c->group(Group::World);
      int n = g.size();
      std::vector<uint64_t> sb(n, 8), rb(n, 8);
      if (rank == 1)
        sb[2] = 12;
      std::vector<float> in(3 * n + 3), out(3 * n + 3);
      std::string err;
      try {
        c->allToAllv(in.data(), sb, out.data(), rb, g);
      } catch (const Error &e) {
        err = e.what();
      }
      if (err.find("rank 1 sends 12 bytes to rank 2, which expects 8") ==
          std::string::npos)
        fail("bad-counts: expected the count disagreement, got '", err, "'");
      c->barrier();
      c.reset();
      if (rank == 0)
        std::printf("comm-check bad-counts ok\n");
      mpiFinalize();
      return 0;
    }
    test::runCommChecks(*c);
    c.reset();
    if (rank == 0)
      std::printf("comm-check ok\n");
    mpiFinalize();
    return 0;
  } catch (const std::exception &e) {
    std::string msg = "mapp-comm-check: rank " + std::to_string(rank) + ": " +
                      e.what() + "\n";
    std::fputs(msg.c_str(), stderr);
    mpiAbort(1);
    return 1;
  }
}
