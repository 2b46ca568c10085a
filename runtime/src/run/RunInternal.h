//===- RunInternal.h - pieces of the run object shared by its files -------===//
#ifndef MAPP_RT_RUN_INTERNAL_H
#define MAPP_RT_RUN_INTERNAL_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/HfNames.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Run.h"
#include "mapp/rt/Safetensors.h"
#include "mapp/trace/TraceWriter.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

/// What every rank of this process shares: the plan, the token stream
/// (read once), the job's trace identity.
struct RunShared {
  const RunOptions &o;
  const Plan &plan;
  std::shared_ptr<const TokenStream> tokens;
  bool haveTokens = false;
  int threadsPerRank = 0;
  std::string runId = mapp::newRunId(); // docs/trace-format.md
  // Re-partitioning (--elastic --repartition-plan): the layer counts per
  // stage of each partition, the running one, the job's first (home);
  // rank 0 reports a switch.
  std::vector<std::vector<int>> partitions = {};
  int partition = -1, homePartition = 0;
  int switchTo = -1;
  std::string switchEvidence = {};
  // The first window's median slowest-stage compute (ms) of an attempt that
  // began with a repartition (rank 0; 0: none measured).
  bool measureAfterSwitch = false;
  double measuredStepMs = 0;
  /// Every rank is a process of its own (a launcher's world, Launcher.h):
  /// an injected rank crash kills the process.
  bool processes = false;
};

/// One rank's whole run: executor, data, steps, outputs (rank 0 prints and
/// writes metrics, batch dumps and checkpoints).
void runRank(RunShared &sh, std::unique_ptr<Communicator> comm);

// RunIO.cpp: inputs and outputs checked before the work starts.
void checkInputsAndOutputs(const RunOptions &o);
/// --inject-nan names an op of `plan` with an f32 output.
void checkInjectNan(const RunOptions &o, const Plan &plan);
/// --weights in mapp's names (Hugging Face names mapped by `naming`).
Safetensors readWeights(const RunOptions &o, CheckpointNaming &naming,
                        const Plan &plan);
std::shared_ptr<const TokenStream> readTokens(const RunOptions &o);

/// --dump-batches: one line per microbatch: {"step", "microbatch",
/// "dp_rank", "tokens": [[...] x mbs], "targets": [[...] x mbs]}.
class BatchDump {
public:
  explicit BatchDump(const std::string &path, bool append = false);
  void write(int64_t step, int mb, int dpRank, int mbs, int t,
             const int32_t *tok, const int32_t *tgt);

private:
  std::ofstream out_;
};

} // namespace mapp::rt

#endif // MAPP_RT_RUN_INTERNAL_H
