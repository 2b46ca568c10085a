//===- LauncherTest.cpp - launcher environments, devices, worlds ----------===//
//
// Known answers: the variables mpirun, srun and torchrun set, written out by
// hand, and what each must give (docs/multi-gpu.md).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Launcher.h"

#include <gtest/gtest.h>

#include <map>

using namespace mapp::rt;

namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup envOf(const Vars &v) {
  return [&v](const char *name) -> const char * {
    auto it = v.find(name);
    return it == v.end() ? nullptr : it->second.c_str();
  };
}

/// The message of the Error `f` throws ("" when none).
template <typename F> std::string errorOf(F f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Launcher, NoneWithoutVariables) {
  Vars v{{"PATH", "/usr/bin"}};
  EXPECT_FALSE(detectLauncher(envOf(v)));
}

TEST(Launcher, OpenMpi) {
  Vars v{{"OMPI_COMM_WORLD_RANK", "5"},
         {"OMPI_COMM_WORLD_SIZE", "8"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  std::optional<LauncherEnv> l = detectLauncher(envOf(v));
  ASSERT_TRUE(l);
  EXPECT_EQ(l->launcher, "mpi");
  EXPECT_EQ(l->rank, 5);
  EXPECT_EQ(l->world, 8);
  EXPECT_EQ(l->localRank, 1);
  EXPECT_EQ(l->localWorld, 4);
  EXPECT_EQ(l->masterAddr, "127.0.0.1");
  EXPECT_EQ(l->masterPort, 0);
}

TEST(Launcher, Torchrun) {
  Vars v{{"RANK", "3"},        {"WORLD_SIZE", "4"},
         {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"},
         {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29500"}};
  std::optional<LauncherEnv> l = detectLauncher(envOf(v));
  ASSERT_TRUE(l);
  EXPECT_EQ(l->launcher, "torchrun");
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->world, 4);
  EXPECT_EQ(l->localRank, 1);
  EXPECT_EQ(l->localWorld, 2);
  EXPECT_EQ(l->masterAddr, "10.0.0.7");
  EXPECT_EQ(l->masterPort, 29500);
}

TEST(Launcher, SlurmTasksPerNodeLists) {
  // srun -n 7 over 3 nodes: 3, 3 and 1 tasks; this is node 2.
  Vars v{{"SLURM_PROCID", "6"},
         {"SLURM_NTASKS", "7"},
         {"SLURM_LOCALID", "0"},
         {"SLURM_NODEID", "2"},
         {"SLURM_STEP_TASKS_PER_NODE", "3(x2),1"},
         {"SLURM_TASKS_PER_NODE", "4(x2)"}};
  std::optional<LauncherEnv> l = detectLauncher(envOf(v));
  ASSERT_TRUE(l);
  EXPECT_EQ(l->launcher, "slurm");
  EXPECT_EQ(l->rank, 6);
  EXPECT_EQ(l->world, 7);
  EXPECT_EQ(l->localWorld, 1); // the step's list wins over the job's
  v["SLURM_NODEID"] = "1";
  v["SLURM_LOCALID"] = "2";
  v["SLURM_PROCID"] = "5";
  EXPECT_EQ(detectLauncher(envOf(v))->localWorld, 3);
  v.erase("SLURM_STEP_TASKS_PER_NODE");
  EXPECT_EQ(detectLauncher(envOf(v))->localWorld, 4);
  v.erase("SLURM_TASKS_PER_NODE");
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("SLURM_STEP_TASKS_PER_NODE is not set"),
            std::string::npos);
  v["SLURM_NTASKS_PER_NODE"] = "x3";
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("SLURM_NTASKS_PER_NODE='x3' names no task count"),
            std::string::npos);
}

TEST(Launcher, Precedence) {
  // mpirun inside a Slurm allocation, with a stray torchrun RANK: Open MPI's
  // per-process variables win; MAPP_LAUNCHER forces another.
  Vars v{{"OMPI_COMM_WORLD_RANK", "1"},  {"OMPI_COMM_WORLD_SIZE", "2"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
         {"RANK", "0"},          {"WORLD_SIZE", "1"},
         {"LOCAL_RANK", "0"},    {"LOCAL_WORLD_SIZE", "1"},
         {"SLURM_PROCID", "0"},  {"SLURM_NTASKS", "1"},
         {"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "1"}};
  EXPECT_EQ(detectLauncher(envOf(v))->launcher, "mpi");
  v["MAPP_LAUNCHER"] = "slurm";
  EXPECT_EQ(detectLauncher(envOf(v))->launcher, "slurm");
  v["MAPP_LAUNCHER"] = "none";
  EXPECT_FALSE(detectLauncher(envOf(v)));
  v.erase("MAPP_LAUNCHER");
  v.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(detectLauncher(envOf(v))->launcher, "torchrun");
  v.erase("RANK");
  EXPECT_EQ(detectLauncher(envOf(v))->launcher, "slurm");
  v["MAPP_LAUNCHER"] = "pbs";
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("MAPP_LAUNCHER='pbs' is not one of"),
            std::string::npos);
}

TEST(Launcher, BadValuesNameTheVariable) {
  Vars v{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}};
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("torchrun launcher: LOCAL_WORLD_SIZE is not set"),
            std::string::npos);
  v["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_TRUE(detectLauncher(envOf(v)));
  for (const char *bad : {"-1", "two", "", "3x", "99999999999"}) {
    v["WORLD_SIZE"] = bad;
    EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                  .find(std::string("WORLD_SIZE='") + bad +
                        "' is not a non-negative integer"),
              std::string::npos)
        << bad;
  }
  v["WORLD_SIZE"] = "2";
  v["RANK"] = "2";
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("rank 2 is outside the world of 2"),
            std::string::npos);
  v["RANK"] = "1";
  v["LOCAL_RANK"] = "2";
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("local rank 2 is outside the node's 2 process(es)"),
            std::string::npos);
  v["LOCAL_RANK"] = "1";
  v["MASTER_PORT"] = "70000";
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(v)); })
                .find("MASTER_PORT=70000 is not a TCP port"),
            std::string::npos);
  Vars m{{"OMPI_COMM_WORLD_RANK", "0"}};
  EXPECT_NE(errorOf([&] { detectLauncher(envOf(m)); })
                .find("mpi launcher: OMPI_COMM_WORLD_SIZE is not set"),
            std::string::npos);
}

TEST(Launcher, DeviceOfLocalRank) {
  EXPECT_EQ(launcherDevice(0, 4, 8, nullptr), 0);
  EXPECT_EQ(launcherDevice(3, 4, 8, nullptr), 3);
  EXPECT_EQ(launcherDevice(2, 4, 4, "4,5,6,7"), 2); // ordinals are visible ones
  EXPECT_EQ(launcherDevice(3, 4, 1, "6"), 0); // bound: srun --gpus-per-task=1
  EXPECT_NE(errorOf([] { launcherDevice(2, 4, 2, nullptr); })
                .find("4 processes on this node but 2 visible GPU(s)"),
            std::string::npos);
  EXPECT_NE(errorOf([] { launcherDevice(1, 2, 1, nullptr); }), "");
  EXPECT_NE(errorOf([] { launcherDevice(0, 1, 0, ""); })
                .find("no CUDA device is visible"),
            std::string::npos);
}

TEST(Worlds, TableChoosesTheWorld) {
  Vars none;
  EXPECT_EQ(chooseWorld("local", 4, envOf(none)).world->kind,
            WorldKind::LocalThreads);
  EXPECT_EQ(chooseWorld("mpi", 4, envOf(none)).world->kind,
            WorldKind::MpiProcesses);
  EXPECT_EQ(chooseWorld("nccl", 4, envOf(none)).world->kind,
            WorldKind::NcclThreads);
  Vars mpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  WorldChoice c = chooseWorld("nccl", 4, envOf(mpi));
  EXPECT_EQ(c.world->kind, WorldKind::NcclProcesses);
  ASSERT_TRUE(c.launcher);
  EXPECT_EQ(c.launcher->world, 4);
  // mpi's world comes from MPI itself, not from the variables.
  EXPECT_FALSE(chooseWorld("mpi", 4, envOf(mpi)).launcher);
  // One process of a launcher: NCCL processes for a one-rank plan (the
  // one-GPU check), NCCL threads for a bigger one (sbatch -n 1, 4 GPUs).
  Vars one{{"RANK", "0"}, {"WORLD_SIZE", "1"},
           {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}};
  EXPECT_EQ(chooseWorld("nccl", 1, envOf(one)).world->kind,
            WorldKind::NcclProcesses);
  EXPECT_EQ(chooseWorld("nccl", 4, envOf(one)).world->kind,
            WorldKind::NcclThreads);
  EXPECT_NE(errorOf([&] { chooseWorld("gloo", 1, envOf(none)); })
                .find("--comm must be local, mpi or nccl, got 'gloo'"),
            std::string::npos);
  EXPECT_EQ(commChoices(), "local, mpi or nccl");
}

TEST(Worlds, PlanAgainstLauncherWorld) {
  LauncherEnv l;
  l.launcher = "mpi";
  l.world = 2;
  checkLauncherWorld(l, 2);
  EXPECT_NE(errorOf([&] { checkLauncherWorld(l, 4); })
                .find("the plan is for world_size 4 but mpi started 2 "
                      "process(es) (start 4: mpirun -np 4)"),
            std::string::npos);
}
