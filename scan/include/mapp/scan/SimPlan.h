//===- SimPlan.h - replay a compiled plan's schedule on a model -*- C++ -*-===//
//
// mapp-sim's plan mode: every rank's task table of a `.mplan` (Program.tasks
// or one of an adaptive plan's schedule tables) becomes a program of the
// discrete-event engine (Sim.h): a task's recv/send instructions are
// point-to-point ops on the modeled links, its collectives synchronize their
// tp/dp group, the rest is compute costed from the instructions (FLOPs over
// the device's TFLOP/s, bytes over its memory bandwidth) or from uniform
// per-task costs. Peak memory per rank counts the (chunk, microbatch)
// activations in flight: persistent + one arena slot + (in flight − 1) ·
// stash_bytes. A split (MegaFBD) plan also gets what the runtime does
// outside the instructions: the forward side's layout for its groups, the
// step-end parameter copy (SimFbd.h), and per-placement device speeds.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_SIMPLAN_H
#define MAPP_SCAN_SIMPLAN_H

#include "mapp/cost/CostModel.h"
#include "mapp/rt/Plan.h"
#include "mapp/scan/Sim.h"

#include <map>
#include <string>
#include <vector>

namespace mapp::scan {

/// The modeled cluster and cost model of a plan replay.
struct PlanCluster {
  double gbps = 100, latencyUs = 5;          // every link (network.gbps, ...)
  double intraGbps = 1800, intraLatencyUs = 2;
  int gpusPerNode = 1;                       // ranks r / gpusPerNode share a node
  double deviceTflops = 100, memGBps = 2000; // instruction cost model
  /// Per instruction (µs) and attention's share of the GEMM rate: the cost
  /// model's (mapp/cost/CostModel.h); 0 and 1 unless a profile says.
  double opOverheadUs = 0, attentionEfficiency = 1;
  /// The profile's GEMM rates by size (CostModel.h, gemm_rates): a matmul
  /// or linear is priced at its smallest dimension's rate.
  std::vector<mapp::cost::Profile::RatePoint> gemmRates;
  /// The activation functions' rate (G elements/s, activation_gelems); 0:
  /// their bytes are their cost.
  double activationGelems = 0;
  /// Uniform per-task costs in µs (forward, fused backward, backward-input,
  /// backward-weight); < 0: costs from the instructions.
  double forwardUs = -1, backwardUs = -1, backwardInputUs = -1,
         backwardWeightUs = -1;
  std::vector<Fault> faults; // link-delay, link-bandwidth, slow-compute
  int steps = 2;
  uint64_t memCapBytes = 0; // adaptive: 0 = the plan's, then unlimited
  /// Relative compute speed by placement backend ("cpu", "cuda") and role
  /// ("fwd", "bwd"); a rank's compute time is divided by the product of
  /// the factors that match it (--device-speed).
  std::map<std::string, double> deviceSpeed;
  /// Split plans: the step-end parameter copy goes through the coordinator
  /// (three world all-reduces around it), as mapp-run --coordinator=on.
  bool fbdCoordinator = true;
};

struct PlanSimResult {
  std::string schedule; // the table replayed ("adaptive" resolves to one)
  /// adaptive: "dfc", "bfc" or "bfc under the cap"; else = schedule.
  std::string chosen;
  std::string reason; // adaptive: why
  /// adaptive: the largest in-flight stash of a rank.
  uint64_t peakStashBytes = 0;
  double stepUs = 0;    // mean step time
  std::vector<int64_t> peakInFlight; // per program (rank order)
  std::vector<uint64_t> peakBytes;   // per program
  // Split plans (empty / 0 otherwise):
  std::vector<std::string> roles;      // per program: "fwd" | "bwd"
  uint64_t paramCopyBytes = 0;         // per step, all pairs
  std::vector<uint64_t> stagingBytes;  // per program: the copy's host buffers
};

/// Parses `--device-speed KEY=S,...` (KEY: cpu, cuda, fwd, bwd; S > 0).
/// False with a message naming the bad item.
bool parseDeviceSpeed(const std::string &text,
                      std::map<std::string, double> &out, std::string *error);

/// The tables a plan offers by name: its Plan.schedule (Program.tasks), the
/// names of its schedule tables, and "adaptive" when it has dfc and bfc.
std::vector<std::string> planSchedules(const rt::Plan &plan);

/// Replays `schedule` (one of planSchedules) of `plan`. Adaptive is the
/// policy: bfc while a link the schedule uses is at least slow_link_ratio
/// times slower than without faults and bfc's peak fits the cap on every
/// rank, else dfc. False with a message in `error`.
bool simulatePlan(const rt::Plan &plan, const std::string &schedule,
                  const PlanCluster &cluster, PlanSimResult &out,
                  std::string *error);

} // namespace mapp::scan

#endif // MAPP_SCAN_SIMPLAN_H
