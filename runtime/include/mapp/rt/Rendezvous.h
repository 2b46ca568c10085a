//===- Rendezvous.h - rank 0's bootstrap blob to every process ---*- C++ -*-===//
//
// NCCL processes agree on a communicator through a unique id (128 opaque
// bytes) that rank 0 creates and every other rank must receive before
// ncclCommInitRank. Three ways, chosen by rendezvous() (docs/multi-gpu.md):
//
//  - mpi:  the launcher is mpirun: MPI_Bcast over COMM_WORLD.
//  - file: MAPP_RENDEZVOUS_FILE=PATH (Slurm with a shared file system):
//          rank 0 writes PATH atomically (it must not exist: a fresh path
//          per job), the others poll for it and leave PATH.arrived.R; rank 0
//          removes all once everyone arrived.
//  - tcp:  otherwise: rank 0 listens on exactly MASTER_ADDR:MASTER_PORT
//          (default address 127.0.0.1), the others connect with retries.
//          Every greeting carries a magic, a version, the world size and the
//          rank, so a stray client is ignored and a process of another world
//          is rejected with a clear error on both sides.
//
// Every path waits at most `timeoutS` (MAPP_RENDEZVOUS_TIMEOUT, default
// 300 s); rank 0 then names the ranks that never arrived, and the ranks
// that did get the same message. No GPU, no NCCL here: the blob is bytes.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_RENDEZVOUS_H
#define MAPP_RT_RENDEZVOUS_H

#include "mapp/rt/Launcher.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt {

using Blob = std::vector<uint8_t>;

/// Rank 0's `blob` (ignored on other ranks) at every rank, over TCP.
Blob rendezvousTcp(const std::string &addr, int port, int rank, int world,
                   const Blob &blob, double timeoutS);
/// The same through a file on a file system every rank sees.
Blob rendezvousFile(const std::string &path, int rank, int world,
                    const Blob &blob, double timeoutS);
/// The same over MPI_COMM_WORLD (initializes MPI; Error when the runtime
/// has no MPI or MPI's world is not `world`).
Blob rendezvousMpi(int rank, int world, const Blob &blob, double timeoutS);

/// The path for this launcher and environment: "mpi", "file" or "tcp".
std::string rendezvousPath(const LauncherEnv &l, const EnvLookup &env);
/// MAPP_RENDEZVOUS_TIMEOUT in seconds (default 300); Error when not a
/// positive number.
double rendezvousTimeout(const EnvLookup &env);
/// Rank 0's blob at every rank of the launcher's world, by
/// rendezvousPath(). tcp without MASTER_PORT is an Error naming it.
Blob rendezvous(const LauncherEnv &l, const EnvLookup &env, const Blob &blob);

} // namespace mapp::rt

#endif
