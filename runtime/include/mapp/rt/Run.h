//===- Run.h - one job: world, placements, backends, data, sinks ----------===//
//
// The run object behind mapp-run: RunOptions is everything a job is started
// with (mapp-run only parses flags into it), runJob sets up the world (rank
// threads over a local or NCCL world, or this process as one MPI rank) and
// runs every rank's training, generation or patching to the end.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_RUN_H
#define MAPP_RT_RUN_H

#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Faults.h"
#include "mapp/rt/HfNames.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mapp::rt {

struct RunOptions {
  std::string plan;
  std::string backend = "cpu";  // cpu | cuda
  std::string comm = "local";   // local | mpi | nccl
  double commTimeout = 300;     // seconds; 0 = never
  int threads = 0;              // CPU workers per rank; 0 = cores / ranks
  bool coordinator = true;      // MegaFBD step-end transfers matched

  // Data and parameters.
  std::string data, dataFormat = "auto", tokenizer, weights;
  bool shuffle = true, allowNonfiniteWeights = false;
  // --weights / --save under mapp's or Hugging Face's names (HfNames.h).
  WeightsFormat weightsFormat = WeightsFormat::Auto,
                saveFormat = WeightsFormat::Auto;
  int64_t hfVocabSize = 0; // HF save: vocabulary rows kept; 0 = as loaded
  uint64_t seed = 0;
  int64_t steps = 1;

  // Outputs.
  std::string save, saveGrads, metrics, dumpBatches, traceDir;
  std::string monitor; // MegaScan live alerts ("-" = stdout)
  int monitorEvery = 1;      // summaries per message
  int monitorCost = 0;       // --monitor-cost N: N-step windows, on and off
  bool monitorToDpp = false; // the adaptive scheduler takes link verdicts
  std::pair<int, int> traceSampling{-1, -1}; // --trace-sample E:W
  CheckpointPolicy ckpt;
  bool quiet = false;
  bool reportMemory = false; // allocated storage beside the plan's figures

  // Faults and non-finite values.
  std::vector<Injection> inject;
  bool nanCheck = false;
  int64_t nanStep = -1; // --inject-nan STEP:OP
  std::string nanOp;

  // Elastic restarts (docs/elastic.md).
  bool elastic = false;                  // rank threads: restart without lost ranks
  std::vector<std::string> elasticPlans; // other layouts it may switch to
  int elasticMaxRestarts = 8;
  int elasticAttempt = -1;    // >= 0: under a supervisor (mapp-launch);
                              // > 0: a restart (outputs appended, crashes done)
  int64_t stopAtSaveFrom = -1; // stop after the first save at >= this step
  std::vector<std::string> repartitionPlans; // other stage partitions
  std::vector<int> dpSplit; // microbatches per dp replica ({}: even)
  int dpBalance = 0;        // > 0: rebalance the split every N steps

  // MegaDPP.
  std::string schedule; // "" = the plan's; static | adaptive
  uint64_t memCapBytes = 0;

  // MegaScope.
  std::string probeDb, probeControl, probeControlTokenFile, probeRun;
  std::string patch; // activation patching spec (a mode of its own)

  // Generation (a mode of its own).
  bool generate = false, greedy = false, kvCache = true;
  std::string prompt, generateOut;
  int64_t maxNewTokens = 32, topK = 0;
  double temperature = 1.0;
};

/// Runs the job to its end. Returns the process exit status (0, or 1 after
/// a rank failed, its error printed first); throws Error for problems found
/// before any rank starts (unreadable plan, unwritable output, ...).
int runJob(const RunOptions &o);

} // namespace mapp::rt

#endif // MAPP_RT_RUN_H
