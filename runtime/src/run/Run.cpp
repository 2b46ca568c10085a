//===- Run.cpp - a job's world: rank threads or this process as one rank --===//
#include "DataSplit.h"
#include "RankThreads.h"
#include "RunInternal.h"

#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Elastic.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Fbd.h"
#include "mapp/rt/Launcher.h"

#include <algorithm>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

namespace mapp::rt {
namespace {

void printCoords(const Plan &plan, int rank, int threads) {
  Layout l{plan.tp, plan.dp, plan.pp};
  if (rank >= l.world()) { // MegaFBD forward side: see the placement table
    std::printf("mapp-run: rank %d = forward side of world %d, %d CPU "
                "thread(s)\n", rank, plan.worldSize, threads);
    return;
  }
  std::printf("mapp-run: rank %d = (dp %d, pp %d, tp %d) of world %d "
              "(tp %d, dp %d, pp %d), %d CPU thread(s)\n",
              rank, l.dpOf(rank), l.ppOf(rank), l.tpOf(rank), plan.worldSize,
              plan.tp, plan.dp, plan.pp, threads);
}

int hardwareThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

/// Every process of a launcher's world must run the same plan (its seal's
/// checksum): one gather before step 1, the same Error on every rank naming
/// the first that differs from rank 0.
void checkSamePlan(Communicator &comm, const Plan &plan) {
  int n = comm.worldSize();
  CommGroup world{"world", {}};
  for (int r = 0; r < n; ++r)
    world.members.push_back(r);
  // 16-bit halves are exact in a float.
  float own[2] = {static_cast<float>(plan.checksum & 0xffff),
                  static_cast<float>(plan.checksum >> 16)};
  std::vector<float> all(2 * n);
  comm.allGather(own, all.data(), 2, world);
  auto sumOf = [&](int r) {
    return static_cast<uint32_t>(all[2 * r]) |
           static_cast<uint32_t>(all[2 * r + 1]) << 16;
  };
  for (int r = 1; r < n; ++r)
    if (sumOf(r) != sumOf(0)) {
      char a[16], b[16];
      std::snprintf(a, sizeof a, "0x%08x", sumOf(r));
      std::snprintf(b, sizeof b, "0x%08x", sumOf(0));
      fail("rank ", r, " loaded another plan (checksum ", a, ") than rank 0 (",
           b, "): every process must run the same plan file");
    }
}

/// Every MPI rank drew its own run id; rank 0's wins. 64 bits as four 16-bit
/// pieces summed in doubles (exact), the other ranks adding zeros.
void shareRunId(Communicator &comm, std::string &runId) {
  uint64_t own = std::stoull(runId, nullptr, 16);
  double parts[4] = {0, 0, 0, 0};
  if (comm.rank() == 0)
    for (int i = 0; i < 4; ++i)
      parts[i] = static_cast<double>((own >> (16 * i)) & 0xffff);
  CommGroup world{"world", {}};
  for (int r = 0; r < comm.worldSize(); ++r)
    world.members.push_back(r);
  comm.allReduce(parts, 4, ReduceOp::Sum, world);
  uint64_t id = 0;
  for (int i = 0; i < 4; ++i)
    id |= static_cast<uint64_t>(parts[i]) << (16 * i);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  runId = buf;
}

/// A fault that kills or hangs its rank: it happens once in an elastic job
/// (the restart runs without that rank; its numbers name other ranks).
bool losesTheRank(const Injection &i) {
  return i.kind == Injection::RankCrash || i.kind == Injection::Stop;
}

/// Faults name ranks of the plan's world.
void checkInjections(const RunOptions &o, const Plan &plan,
                     const WorldEntry &world) {
  checkInjectNan(o, plan);
  for (const Injection &i : o.inject) {
    int r = i.kind == Injection::SlowCompute ||
                    i.kind == Injection::MonitorSilence ||
                    i.kind == Injection::Stop ||
                    i.kind == Injection::RankCrash
                ? i.rank
                : std::max(i.src, i.dst);
    if (r >= plan.worldSize)
      fail("--inject: rank ", r, " is outside the plan's world of ",
           plan.worldSize);
    if (i.kind == Injection::Stop && !world.processes)
      fail("--inject stop: needs --comm=mpi (the ranks of --comm=", o.comm,
           " are threads of one process, which would stop them all)");
  }
}

/// MegaFBD: placements must exist and be reachable from this world; the
/// placement table is printed.
void checkFbdWorld(const RunOptions &o, const Plan &plan,
                   const WorldEntry &world) {
  checkPlacements(plan, o.backend);
  if (world.deviceComm) // NCCL puts rank r on GPU r; placements decide here
    fail("MegaFBD plans run over --comm=local or --comm=mpi, not nccl");
  // Rank threads of one process share device pointers (the CUDA backend
  // moves payloads itself): a CPU rank cannot read them.
  bool cpu = false, cuda = false;
  for (const Program &p : plan.programs)
    (placedBackend(p, o.backend) == "cuda" ? cuda : cpu) = true;
  const char *cudaComm = std::getenv("MAPP_CUDA_COMM");
  bool hostStaged = cudaComm && std::string(cudaComm) == "host";
  if (cpu && cuda && world.kind != WorldKind::MpiProcesses &&
      !(world.kind == WorldKind::LocalThreads && hostStaged))
    fail("the plan places ranks on both cpu and cuda: run them as "
         "processes, mpirun -np ", plan.worldSize,
         " mapp-run PLAN --comm=mpi, or as threads with MAPP_CUDA_COMM=host "
         "--comm=local (CUDA ranks then stage their transfers through host "
         "memory)");
  if (!o.quiet)
    std::printf("mapp-run: placement (MegaFBD, %d ranks)\n%s",
                plan.worldSize, placementTable(plan, o.backend).c_str());
}

/// One process's rank, over the communicator `makeComm` builds (inside the
/// guard: building it can fail too): every rank checks it loaded rank 0's
/// plan, then runs. A failure is said once, naming the rank, and ends every
/// process of the job.
template <typename MakeComm>
int runProcessRank(RunShared &sh, int rank, MakeComm makeComm) {
  try {
    std::unique_ptr<Communicator> comm = makeComm();
    checkSamePlan(*comm, sh.plan);
    if (!sh.o.quiet)
      printCoords(sh.plan, rank, sh.threadsPerRank), std::fflush(stdout);
    if (!sh.o.traceDir.empty() || !sh.o.ckpt.saveDir.empty())
      shareRunId(*comm, sh.runId); // names traces and checkpoint temporaries
    runRank(sh, std::move(comm));
  } catch (const std::exception &e) {
    // One write, so ranks' messages do not interleave mid-line.
    std::string msg =
        "mapp-run: rank " + std::to_string(rank) + ": " + e.what() + "\n";
    std::fwrite(msg.data(), 1, msg.size(), stderr);
    std::fflush(stderr);
    mpiAbort(1); // the other processes end too, naming this rank
    return 1;
  }
  mpiFinalize();
  return 0;
}

/// This process is one rank of an mpirun job.
int runMpiRank(RunShared &sh) {
  const Plan &plan = sh.plan;
  std::unique_ptr<Communicator> comm = createMpiComm();
  int rank = comm->rank();
  if (comm->worldSize() != plan.worldSize) {
    // Every rank sees this alike: rank 0 says it, all leave cleanly.
    if (rank == 0) {
      std::string split;
      if (isFbdPlan(plan)) {
        int bwd = plan.tp * plan.dp * plan.pp;
        split = "; a split plan: " + std::to_string(bwd) + " backward + " +
                std::to_string(plan.worldSize - bwd) + " forward ranks";
      }
      std::cerr << "mapp-run: plan is for world_size " << plan.worldSize
                << " but mpirun started " << comm->worldSize()
                << " process(es) (use mpirun -np " << plan.worldSize << split
                << ")\n";
    }
    comm.reset();
    mpiFinalize();
    return 1;
  }
  // Processes that share a host share its cores: as many threads each as
  // leaves one per core, the same split as one process's rank threads.
  if (!sh.threadsPerRank)
    sh.threadsPerRank = std::max(1, hardwareThreads() / comm->ranksOnThisHost());
  return runProcessRank(sh, rank, [&] { return std::move(comm); });
}

/// This process is one rank of a launcher's NCCL world (one GPU each). The
/// host side (the executor's host collectives, pipeline transfers staged
/// through host memory) runs over MPI under mpirun; a one-process world
/// needs none.
int runNcclProcess(RunShared &sh, const LauncherEnv &l) {
  std::unique_ptr<Communicator> host;
  if (l.launcher == "mpi")
    host = createMpiComm();
  else if (l.world == 1)
    host = createLocalComm();
  else
    fail("--comm=nccl under ", l.launcher, " with ", l.world,
         " processes: the host side of NCCL processes runs over MPI; start "
         "them with mpirun (or srun --mpi=pmix with MAPP_LAUNCHER=mpi)");
  int rank = l.rank;
  if (!sh.threadsPerRank)
    sh.threadsPerRank = std::max(1, hardwareThreads() / l.localWorld);
  return runProcessRank(sh, rank, [&] {
    return createNcclProcessComm(l, std::move(host));
  });
}

/// How a world of rank threads ended, for --elastic.
struct ThreadsEnd {
  std::vector<int> crashed; // ranks a rank-crash fault killed
  std::string why;          // the first failure
};

/// Every rank of the plan as a thread of this process (local or NCCL world).
int runRankThreads(RunShared &sh, const WorldEntry &kind,
                   ThreadsEnd *end = nullptr) {
  const RunOptions &o = sh.o;
  int n = sh.plan.worldSize;
  if (!sh.threadsPerRank)
    sh.threadsPerRank = std::max(1, hardwareThreads() / n);
  if (!o.data.empty() && o.steps > 0) {
    sh.tokens = readTokens(o);
    sh.haveTokens = true;
  }
  if (!o.quiet)
    for (int r = 0; r < n; ++r)
      printCoords(sh.plan, r, sh.threadsPerRank);
  // NCCL_NVLS_ENABLE=0 unless set: NVLink SHARP multicast is not usable on
  // the lent machines and a failed probe for it costs a hang at init.
  if (kind.deviceComm)
    setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::unique_ptr<LocalWorld> world =
      kind.deviceComm ? createNcclWorld(n) : createLocalWorld(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(world->connect(r));
  RankThreadsEnd e = runOnRankThreads(
      *world, [&](int r) { runRank(sh, std::move(comms[r])); });
  if (e.firstFailed < 0)
    return 0;
  // The root cause first; the others' "rank R failed" follow-ups are noise.
  const std::string &why = e.errors[e.firstFailed];
  std::cerr << "mapp-run: rank " << e.firstFailed << ": " << why << "\n";
  if (end) {
    end->crashed = e.crashed;
    end->why = why;
  }
  return 1;
}

/// --elastic over rank threads: every attempt a fresh world of threads in
/// the layout ElasticJob chose, resumed from its checkpoint.
int runElasticThreads(const RunOptions &o) {
  ElasticJob::Options eo;
  eo.plans.push_back(o.plan);
  eo.plans.insert(eo.plans.end(), o.elasticPlans.begin(), o.elasticPlans.end());
  eo.saveDir = o.ckpt.saveDir;
  eo.metrics = o.metrics;
  eo.monitor = o.monitor;
  eo.dumpBatches = o.dumpBatches;
  eo.steps = o.steps;
  eo.maxRestarts = o.elasticMaxRestarts;
  ElasticJob job(eo);
  // Other stage partitions of the job's own layout (docs/elastic.md).
  PartitionSet parts;
  if (!o.repartitionPlans.empty())
    parts = loadPartitionSet(o.plan, o.repartitionPlans);
  std::string lastSwitch; // the evidence of the repartition that began
                          // this attempt ("" if none)
  while (true) {
    const ElasticAttempt &a = job.attempt();
    RunOptions ao = o;
    ao.plan = a.layout.plan;
    ao.elasticAttempt = a.index;
    ao.stopAtSaveFrom = a.stopAtSaveFrom;
    if (a.index > 0) {
      ao.ckpt.resume = a.resume;
      // Faults name ranks of the first layout; a crash happens once.
      ao.inject.clear();
      for (const Injection &i : o.inject)
        if (!losesTheRank(i) &&
            std::max({i.rank, i.src, i.dst}) < a.layout.world)
          ao.inject.push_back(i);
    }
    Plan plan = loadPlan(ao.plan);
    const WorldEntry &threads = worldEntry(WorldKind::LocalThreads);
    checkInjections(ao, plan, threads);
    RunShared sh{ao, plan, {}, false, o.threads};
    sh.partition = parts.indexOf(a.layout.plan);
    if (sh.partition >= 0) {
      sh.partitions = parts.layers;
      sh.homePartition = parts.home;
      sh.measureAfterSwitch = !lastSwitch.empty();
    }
    ThreadsEnd end;
    int status = plan.worldSize == 1 ? (runRank(sh, createLocalComm()), 0)
                                     : runRankThreads(sh, threads, &end);
    AttemptEnd ae;
    ae.status = status;
    ae.lost = end.crashed;
    ae.why = end.why;
    if (a.index == 0)
      for (const Injection &i : o.inject)
        if (i.kind == Injection::RankCrash && i.toStep >= 0 &&
            std::count(end.crashed.begin(), end.crashed.end(), i.rank))
          job.ranksReturnAt(i.toStep, 1);
    if (sh.measuredStepMs > 0)
      job.measuredAfterRepartition(lastSwitch, sh.measuredStepMs);
    lastSwitch.clear();
    if (status == 0 && sh.switchTo >= 0) {
      job.repartition(parts.plans[sh.switchTo], sh.switchEvidence);
      lastSwitch = sh.switchEvidence;
      continue;
    }
    if (!job.next(ae))
      return job.exitStatus();
  }
}

} // namespace

int runJob(const RunOptions &given) {
  RunOptions o = given;
  if (o.elasticAttempt > 0 && !o.elastic) // mapp-launch's restart
    o.inject.erase(std::remove_if(o.inject.begin(), o.inject.end(),
                                  [](const Injection &i) {
                                    return losesTheRank(i);
                                  }),
                   o.inject.end());
  checkInputsAndOutputs(o);
  if (!o.ckpt.saveDir.empty())
    installStopSignals();
  if (o.elastic) {
    if (o.comm != worldEntry(WorldKind::LocalThreads).comm)
      fail("--elastic restarts rank threads (--comm=local); for processes "
           "run mapp-launch --elastic -- mpirun ... mapp-run ...");
    return runElasticThreads(o);
  }
  Plan plan = loadPlan(o.plan);
  // The one place the world is chosen (mapp/rt/Launcher.h's table).
  WorldChoice choice = chooseWorld(o.comm, plan.worldSize, processEnv());
  const WorldEntry &world = *choice.world;
  checkInjections(o, plan, world);
  if (!o.dpSplit.empty() || o.dpBalance)
    DataSplit(o, plan); // its errors once, before any rank starts
  if (isFbdPlan(plan))
    checkFbdWorld(o, plan, world);
  RunShared sh{o, plan, {}, false, o.threads};
  sh.processes = world.processes;
  // Under mapp-launch --repartition-plan: the ranks decide at checkpoints
  // as rank threads do; rank 0 tells the supervisor on stderr.
  PartitionSet parts;
  if (!o.repartitionPlans.empty()) {
    // mapp-launch passes the job's first plan first (Launch.cpp).
    parts = loadPartitionSet(o.plan, o.repartitionPlans,
                             o.elasticAttempt > 0 ? o.repartitionPlans[0] : "");
    sh.partitions = parts.layers;
    sh.partition = 0;
    sh.homePartition = parts.home;
    sh.measureAfterSwitch = o.elasticAttempt > 0;
  }
  auto report = [&](int status) {
    ElasticReport r;
    if (status == 0 && sh.switchTo >= 0) {
      r.switchTo = parts.plans[sh.switchTo];
      r.evidence = sh.switchEvidence;
    }
    r.windowStepMs = sh.measuredStepMs;
    if (!r.switchTo.empty() || r.windowStepMs > 0) {
      std::string line = formatElasticReport(r);
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
    }
    return status;
  };
  switch (world.kind) {
  case WorldKind::MpiProcesses:
    return report(runMpiRank(sh));
  case WorldKind::NcclProcesses:
    checkLauncherWorld(*choice.launcher, plan.worldSize);
    return report(runNcclProcess(sh, *choice.launcher));
  case WorldKind::LocalThreads:
    if (plan.worldSize == 1) {
      runRank(sh, createLocalComm());
      return report(0);
    }
    [[fallthrough]];
  case WorldKind::NcclThreads:
    break;
  }
  return report(runRankThreads(sh, world));
}

} // namespace mapp::rt
