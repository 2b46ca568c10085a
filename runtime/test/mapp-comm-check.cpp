//===- mapp-comm-check.cpp - communicator checks under mpirun -------------===//
//
// Test-only: mpirun -np N mapp-comm-check TP DP PP runs runCommChecks on the
// MPI communicator with that layout (TP*DP*PP = N); prints "comm-check ok"
// on rank 0 and exits 0, or names the failed check and exits 1.
// `mpirun -np 2 mapp-comm-check 1 1 2 progress`: a 64 KiB send (past MPI's
// eager limit, so it moves only inside MPI calls) completes while its
// sender computes for 1 s calling only Communicator::progress.
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
  bool progress = argc == 5 && std::string(argv[4]) == "progress";
  if (argc != 4 && !badCounts && !progress) {
    std::fprintf(stderr,
                 "usage: mapp-comm-check TP DP PP [bad-counts|progress]\n");
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
    if (progress) {
      const uint64_t busyNs = 1000000000;
      std::vector<uint8_t> msg(64 << 10, 7);
      if (rank == 0) {
        c->send(msg.data(), msg.size(), 1, 5);
        for (uint64_t t0 = p2pNowNs(); p2pNowNs() - t0 < busyNs;)
          c->progress(); // "compute" that only lets MPI progress
      } else if (rank == 1) {
        P2PHandle r = c->irecv(msg.data(), msg.size(), 0, 5);
        c->wait(*r);
        double ms = (r->completedNs - r->sentNs) / 1e6;
        std::printf("64 KiB send complete %.1f ms after it was issued, "
                    "its sender busy %.0f ms\n", ms, busyNs / 1e6);
        if (ms > busyNs / 2e6 || msg[54321] != 7)
          fail("progress: the message waited for its sender's compute");
      }
      c->barrier();
      c.reset();
      if (rank == 0)
        std::printf("comm-check progress ok\n");
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
