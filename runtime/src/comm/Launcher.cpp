//===- Launcher.cpp - worlds, launchers and rank placement ----------------===//
#include "mapp/rt/Launcher.h"
#include "mapp/rt/Error.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

using namespace mapp::rt;

namespace {

/// A non-negative integer variable; Error naming it otherwise.
int readCount(const EnvLookup &env, const char *name, const char *launcher) {
  const char *v = env(name);
  if (!v)
    fail(launcher, " launcher: ", name, " is not set (the launcher sets it "
         "for every process it starts)");
  char *end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno || n < 0 || n > 1 << 24)
    fail(launcher, " launcher: ", name, "='", v,
         "' is not a non-negative integer");
  return static_cast<int>(n);
}

/// Slurm's tasks-per-node list, "2(x3),1": the count of node `node`.
std::optional<int> tasksOnNode(const std::string &list, int node) {
  std::stringstream ss(list);
  std::string item;
  int at = 0;
  while (std::getline(ss, item, ',')) {
    char *end = nullptr;
    long n = std::strtol(item.c_str(), &end, 10);
    long times = 1;
    if (*end == '(') {
      if (end[1] != 'x')
        return std::nullopt;
      times = std::strtol(end + 2, &end, 10);
      if (*end != ')')
        return std::nullopt;
      ++end;
    }
    if (*end != '\0' || n < 0 || times < 1)
      return std::nullopt;
    if (node < at + times)
      return static_cast<int>(n);
    at += static_cast<int>(times);
  }
  return std::nullopt;
}

LauncherEnv fromMpi(const EnvLookup &env) {
  LauncherEnv l;
  l.launcher = "mpi";
  l.rank = readCount(env, "OMPI_COMM_WORLD_RANK", "mpi");
  l.world = readCount(env, "OMPI_COMM_WORLD_SIZE", "mpi");
  l.localRank = readCount(env, "OMPI_COMM_WORLD_LOCAL_RANK", "mpi");
  l.localWorld = readCount(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "mpi");
  return l;
}

LauncherEnv fromTorchrun(const EnvLookup &env) {
  LauncherEnv l;
  l.launcher = "torchrun";
  l.rank = readCount(env, "RANK", "torchrun");
  l.world = readCount(env, "WORLD_SIZE", "torchrun");
  l.localRank = readCount(env, "LOCAL_RANK", "torchrun");
  l.localWorld = readCount(env, "LOCAL_WORLD_SIZE", "torchrun");
  return l;
}

LauncherEnv fromSlurm(const EnvLookup &env) {
  LauncherEnv l;
  l.launcher = "slurm";
  l.rank = readCount(env, "SLURM_PROCID", "slurm");
  l.world = readCount(env, "SLURM_NTASKS", "slurm");
  l.localRank = readCount(env, "SLURM_LOCALID", "slurm");
  // This node's task count: the step's list (srun's own), else the job's.
  int node = env("SLURM_NODEID") ? readCount(env, "SLURM_NODEID", "slurm") : 0;
  for (const char *name :
       {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
        "SLURM_NTASKS_PER_NODE"}) {
    const char *v = env(name);
    if (!v)
      continue;
    std::optional<int> n = tasksOnNode(v, node);
    if (!n)
      fail("slurm launcher: ", name, "='", v, "' names no task count for node ",
           node);
    l.localWorld = *n;
    return l;
  }
  fail("slurm launcher: SLURM_STEP_TASKS_PER_NODE is not set (nor "
       "SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE): start the ranks with "
       "srun");
}

} // namespace

EnvLookup mapp::rt::processEnv() {
  return [](const char *name) { return std::getenv(name); };
}

std::optional<LauncherEnv> mapp::rt::detectLauncher(const EnvLookup &env) {
  std::string forced = env("MAPP_LAUNCHER") ? env("MAPP_LAUNCHER") : "";
  std::optional<LauncherEnv> l;
  if (forced == "none")
    return std::nullopt;
  if (forced == "mpi" || (forced.empty() && env("OMPI_COMM_WORLD_RANK")))
    l = fromMpi(env);
  else if (forced == "torchrun" || (forced.empty() && env("RANK")))
    l = fromTorchrun(env);
  else if (forced == "slurm" || (forced.empty() && env("SLURM_PROCID")))
    l = fromSlurm(env);
  else if (!forced.empty())
    fail("MAPP_LAUNCHER='", forced, "' is not one of mpi, slurm, torchrun, "
         "none");
  else
    return std::nullopt;
  if (l->world < 1)
    fail(l->launcher, " launcher: the world size is 0");
  if (l->rank >= l->world)
    fail(l->launcher, " launcher: rank ", l->rank,
         " is outside the world of ", l->world);
  if (l->localWorld < 1 || l->localRank >= l->localWorld)
    fail(l->launcher, " launcher: local rank ", l->localRank,
         " is outside the node's ", l->localWorld, " process(es)");
  if (l->localWorld > l->world)
    fail(l->launcher, " launcher: ", l->localWorld,
         " processes on this node but a world of ", l->world);
  if (const char *a = env("MASTER_ADDR"); a && *a)
    l->masterAddr = a;
  if (env("MASTER_PORT")) {
    l->masterPort = readCount(env, "MASTER_PORT", l->launcher.c_str());
    if (l->masterPort < 1 || l->masterPort > 65535)
      fail(l->launcher, " launcher: MASTER_PORT=", l->masterPort,
           " is not a TCP port (1..65535)");
  }
  return l;
}

int mapp::rt::launcherDevice(int localRank, int localWorld, int visibleDevices,
                             const char *cudaVisibleDevices) {
  if (visibleDevices < 1)
    fail("--comm=nccl: no CUDA device is visible to local rank ", localRank,
         cudaVisibleDevices ? " (CUDA_VISIBLE_DEVICES='" : "",
         cudaVisibleDevices ? cudaVisibleDevices : "",
         cudaVisibleDevices ? "')" : "");
  bool bound = cudaVisibleDevices && visibleDevices == 1 &&
               std::string(cudaVisibleDevices).find(',') == std::string::npos;
  if (bound)
    return 0;
  if (localWorld > visibleDevices)
    fail("--comm=nccl: ", localWorld, " processes on this node but ",
         visibleDevices, " visible GPU(s) (NCCL needs one GPU per rank); "
         "start at most ", visibleDevices,
         " per node or bind one GPU per process (CUDA_VISIBLE_DEVICES)");
  return localRank;
}

const std::vector<WorldEntry> &mapp::rt::worldTable() {
  static const std::vector<WorldEntry> table = {
      {WorldKind::LocalThreads, "local", "local threads", false, false, false},
      {WorldKind::MpiProcesses, "mpi", "MPI processes", true, false, false},
      {WorldKind::NcclThreads, "nccl", "NCCL threads", false, true, true},
      {WorldKind::NcclProcesses, "nccl", "NCCL processes", true, true, true},
  };
  return table;
}

const WorldEntry &mapp::rt::worldEntry(WorldKind k) {
  for (const WorldEntry &e : worldTable())
    if (e.kind == k)
      return e;
  fail("no world entry for kind ", static_cast<int>(k));
}

std::string mapp::rt::commChoices() {
  std::vector<std::string> names;
  for (const WorldEntry &e : worldTable())
    if (names.empty() || names.back() != e.comm)
      names.push_back(e.comm);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

bool mapp::rt::isCommName(const std::string &comm) {
  for (const WorldEntry &e : worldTable())
    if (comm == e.comm)
      return true;
  return false;
}

WorldChoice mapp::rt::chooseWorld(const std::string &comm, int planWorld,
                                  const EnvLookup &env) {
  if (!isCommName(comm))
    fail("--comm must be ", commChoices(), ", got '", comm, "'");
  const WorldEntry &threads = worldEntry(WorldKind::NcclThreads);
  if (comm != threads.comm) // only NCCL's world depends on a launcher
    for (const WorldEntry &e : worldTable())
      if (comm == e.comm)
        return {&e, std::nullopt};
  std::optional<LauncherEnv> l = detectLauncher(env);
  if (l && (l->world > 1 || planWorld == 1))
    return {&worldEntry(WorldKind::NcclProcesses), l};
  return {&threads, std::nullopt};
}

void mapp::rt::checkLauncherWorld(const LauncherEnv &l, int planWorld) {
  if (l.world == planWorld)
    return;
  fail("the plan is for world_size ", planWorld, " but ", l.launcher,
       " started ", l.world, " process(es) (start ", planWorld,
       l.launcher == "mpi"        ? ": mpirun -np "
       : l.launcher == "torchrun" ? ": torchrun with nnodes x nproc-per-node = "
                                  : ": srun -n ",
       planWorld, ")");
}
