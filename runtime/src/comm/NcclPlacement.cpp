//===- NcclPlacement.cpp - rank → GPU placement of the NCCL world ---------===//
//
// Plain C++ so it is testable without CUDA or NCCL; the fallbacks below
// stand in for the NCCL communicator in builds without it (MAPP_HAVE_NCCL
// unset).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Launcher.h"

using namespace mapp::rt;

int mapp::rt::ncclDeviceOf(int rank, int worldSize, int deviceCount) {
  if (deviceCount < 1)
    fail("--comm=nccl: no CUDA device is visible");
  if (worldSize > deviceCount)
    // NCCL refuses two ranks of one communicator on one GPU.
    fail("--comm=nccl: the plan has ", worldSize, " ranks but only ",
         deviceCount, " GPU(s) are visible (NCCL needs one GPU per rank); "
         "use --comm=local to run every rank on one GPU");
  if (rank < 0 || rank >= worldSize)
    fail("--comm=nccl: no rank ", rank, " in a world of ", worldSize);
  return rank % deviceCount;
}

#ifndef MAPP_HAVE_NCCL
std::unique_ptr<Communicator>
mapp::rt::createNcclProcessComm(const LauncherEnv &,
                                std::unique_ptr<Communicator>) {
  fail("--comm=nccl is not built into this runtime (configure with "
       "-DMAPP_ENABLE_CUDA=ON where nccl.h and libnccl are found)");
}
bool mapp::rt::haveNcclComm() { return false; }
std::unique_ptr<LocalWorld> mapp::rt::createNcclWorld(int) {
  fail("--comm=nccl is not built into this runtime (configure with "
       "-DMAPP_ENABLE_CUDA=ON where nccl.h and libnccl are found)");
}
#endif
