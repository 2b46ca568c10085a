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

using namespace mapp::rt;

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mapp-comm-check TP DP PP\n");
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
