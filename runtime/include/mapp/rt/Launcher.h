//===- Launcher.h - worlds, launchers and rank placement ---------*- C++ -*-===//
//
// The one place that decides how the ranks of a plan are made (docs/
// multi-gpu.md). A *world* is an entry of worldTable(): local threads, MPI
// processes, NCCL threads (one process, a thread per GPU) or NCCL processes
// (one process per GPU, started by a launcher). chooseWorld() maps --comm
// and the launcher environment to one entry; run/ consults it instead of
// comparing --comm strings, so a new world is one entry here.
//
// A *launcher* (mpirun, srun, torchrun) starts one process per rank and
// tells each its rank, the world size and its rank among the processes of
// its node through environment variables; detectLauncher() reads them.
// Precedence, when several are set: MAPP_LAUNCHER (mpi|slurm|torchrun|none)
// forces one; else Open MPI's OMPI_COMM_WORLD_* (mpirun sets them for this
// very process, even inside a Slurm allocation), then torchrun's RANK/
// WORLD_SIZE (torchrun under srun: RANK is the worker, SLURM_PROCID the
// agent), then Slurm's SLURM_PROCID/SLURM_NTASKS.
//
// No CUDA, MPI or sockets here: plain parsing, unit-tested for every
// launcher (test/runtime-unit/LauncherTest.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_LAUNCHER_H
#define MAPP_RT_LAUNCHER_H

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mapp::rt {

/// What a launcher told this process.
struct LauncherEnv {
  std::string launcher;            // "mpi", "slurm" or "torchrun"
  int rank = 0, world = 1;         // global
  int localRank = 0, localWorld = 1; // among the processes of this node
  /// Rank 0's rendezvous address (torchrun's MASTER_ADDR/MASTER_PORT, or
  /// set by hand under mpirun/srun); port 0 = not given.
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
};

/// Reads a variable; null when unset (tests pass a map).
using EnvLookup = std::function<const char *(const char *)>;
/// The process environment (std::getenv).
EnvLookup processEnv();

/// The launcher that started this process, or none. Error naming the
/// variable when one is missing, not a non-negative integer, or when rank
/// >= world / local rank >= local world.
std::optional<LauncherEnv> detectLauncher(const EnvLookup &env);

/// The GPU of a process with `localRank` of `localWorld` on its node, given
/// the devices it sees (cudaGetDeviceCount, which already honours
/// CUDA_VISIBLE_DEVICES; `cudaVisibleDevices` is that variable, null when
/// unset). One device listed in CUDA_VISIBLE_DEVICES means the launcher
/// bound this process to it (srun --gpus-per-task=1): device 0. Otherwise
/// local rank r gets visible device r, and a node with more processes than
/// devices is an Error: NCCL refuses two ranks of a communicator on one GPU.
int launcherDevice(int localRank, int localWorld, int visibleDevices,
                   const char *cudaVisibleDevices);

/// The worlds a plan's ranks can run in.
enum class WorldKind { LocalThreads, MpiProcesses, NcclThreads, NcclProcesses };

struct WorldEntry {
  WorldKind kind;
  const char *comm;   // the --comm value that selects it
  const char *title;  // for messages: "NCCL processes"
  bool processes;     // one rank per process, started by a launcher
  bool needsCuda;     // --backend=cuda
  bool deviceComm;    // NCCL moves device memory
};
/// Every world, in --comm order.
const std::vector<WorldEntry> &worldTable();
const WorldEntry &worldEntry(WorldKind k);
/// The --comm values, "local, mpi or nccl" (for usage messages).
std::string commChoices();
/// The world a run goes into and, for NCCL processes, its launcher.
struct WorldChoice {
  const WorldEntry *world;
  std::optional<LauncherEnv> launcher;
};
/// The world `comm` selects for a plan of `planWorld` ranks. nccl: NCCL
/// processes when a launcher started this process (read from `env` only
/// here) and its world > 1 or the plan has one rank; otherwise NCCL threads
/// (every rank a thread of this process, one GPU each). Error on an
/// unknown name or a broken launcher environment.
WorldChoice chooseWorld(const std::string &comm, int planWorld,
                        const EnvLookup &env);
/// Whether `comm` names a world of the table.
bool isCommName(const std::string &comm);

class Communicator;
/// This process's rank of NCCL processes: device from launcherDevice(),
/// rank 0's ncclGetUniqueId through rendezvous(), ncclCommInitRank over the
/// launcher's world; host operations go to `host` (rank and world must
/// match the launcher's). Error when NCCL is not built in.
std::unique_ptr<Communicator>
createNcclProcessComm(const LauncherEnv &l, std::unique_ptr<Communicator> host);

/// The plan's world against the launcher's: Error (before step 1) naming
/// both and the command that fits when they differ.
void checkLauncherWorld(const LauncherEnv &l, int planWorld);

} // namespace mapp::rt

#endif
