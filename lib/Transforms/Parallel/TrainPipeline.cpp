// --mapp-train-pipeline: the named pass pipeline from a forward graph to a
// parallel training step (tensor → expert → pipeline → autodiff → optimizer
// → data parallel → [fuse] → schedule).
#include "mapp/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace {

struct TrainPipelineOptions
    : public PassPipelineOptions<TrainPipelineOptions> {
  Option<int64_t> tp{*this, "tp", llvm::cl::desc("Tensor-parallel degree"),
                     llvm::cl::init(1)};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("Sequence parallelism between the tp blocks"),
      llvm::cl::init(false)};
  Option<int64_t> pp{*this, "pp", llvm::cl::desc("Pipeline stages"),
                     llvm::cl::init(1)};
  Option<int64_t> chunks{*this, "chunks",
                         llvm::cl::desc("Virtual chunks per pipeline stage"),
                         llvm::cl::init(1)};
  ListOption<int64_t> stageLayers{
      *this, "stage-layers",
      llvm::cl::desc("Layers of each virtual pipeline stage (uneven stages)")};
  ListOption<double> stageWeights{
      *this, "stage-weights",
      llvm::cl::desc("Relative time per FLOP of each pipeline stage")};
  Option<int64_t> dp{*this, "dp", llvm::cl::desc("Data-parallel degree"),
                     llvm::cl::init(1)};
  Option<int64_t> ep{*this, "ep",
                     llvm::cl::desc("Expert-parallel degree (inside dp: ep "
                                    "divides dp; --mapp-expert-parallel)"),
                     llvm::cl::init(1)};
  Option<int64_t> cp{*this, "cp",
                     llvm::cl::desc("Context-parallel degree (inside dp: the "
                                    "world is tp·pp·dp·cp; "
                                    "--mapp-context-parallel)"),
                     llvm::cl::init(1)};
  Option<std::string> cpComm{*this, "cp-comm",
                             llvm::cl::desc("ring | a2a (context-parallel "
                                            "attention)"),
                             llvm::cl::init("ring")};
  Option<double> bucketMb{*this, "bucket-mb",
                          llvm::cl::desc("Gradient bucket size (MiB)"),
                          llvm::cl::init(25.0)};
  Option<bool> zero1{*this, "zero1",
                     llvm::cl::desc("Shard optimizer state over dp"),
                     llvm::cl::init(false)};
  Option<int64_t> microbatches{*this, "microbatches",
                               llvm::cl::desc("Microbatches per step"),
                               llvm::cl::init(1)};
  Option<std::string> schedule{
      *this, "schedule",
      llvm::cl::desc("gpipe | 1f1b | interleaved | dfc | bfc | zb-h1 | "
                     "adaptive (--mapp-pipeline-schedule)"),
      llvm::cl::init("1f1b")};
  Option<int64_t> group{*this, "group",
                        llvm::cl::desc("interleaved: microbatch group N"),
                        llvm::cl::init(0)};
  Option<std::string> memCap{*this, "mem-cap",
                             llvm::cl::desc("adaptive: memory cap (bytes)"),
                             llvm::cl::init("")};
  Option<double> slowLinkRatio{*this, "slow-link-ratio",
                               llvm::cl::desc("adaptive: slow-link ratio"),
                               llvm::cl::init(1.5)};
  Option<double> bandwidthSmoothing{
      *this, "bandwidth-smoothing",
      llvm::cl::desc("adaptive: bandwidth EMA weight"), llvm::cl::init(0.25)};
  Option<std::string> recompute{
      *this, "recompute",
      llvm::cl::desc("none | selective | full | activations (--mapp-recompute policy)"),
      llvm::cl::init("none")};
  Option<std::string> recomputeLayers{
      *this, "recompute-layers",
      llvm::cl::desc("--mapp-recompute layers: all | 0,1 | 0-3,6"),
      llvm::cl::init("all")};
  Option<std::string> optimizer{*this, "optimizer",
                                llvm::cl::desc("adamw | sgd"),
                                llvm::cl::init("adamw")};
  Option<double> lr{*this, "lr", llvm::cl::desc("Peak learning rate"),
                    llvm::cl::init(3.0e-4)};
  Option<double> beta1{*this, "beta1", llvm::cl::init(0.9)};
  Option<double> beta2{*this, "beta2", llvm::cl::init(0.999)};
  Option<double> eps{*this, "eps", llvm::cl::init(1.0e-8)};
  Option<double> weightDecay{*this, "weight-decay", llvm::cl::init(0.01)};
  Option<bool> skipDecay1d{*this, "skip-decay-1d", llvm::cl::init(false)};
  Option<double> momentum{*this, "momentum", llvm::cl::init(0.0)};
  Option<double> maxGradNorm{*this, "max-grad-norm", llvm::cl::init(0.0)};
  Option<std::string> lrSchedule{*this, "lr-schedule",
                                 llvm::cl::init("constant")};
  Option<int64_t> warmup{*this, "warmup", llvm::cl::init(0)};
  Option<int64_t> totalSteps{*this, "total-steps", llvm::cl::init(0)};
  Option<double> minLr{*this, "min-lr", llvm::cl::init(0.0)};
  // On by default: regions leave the GEMM epilogues alone, and on the GPU
  // the fused LLaMA-style step measured as fast as the unfused one with
  // the same loss curve (docs/fusion.md, "On by default").
  Option<bool> fuse{*this, "fuse",
                    llvm::cl::desc("Fuse elementwise chains (--mapp-fuse) "
                                   "after the optimizer and data parallelism"),
                    llvm::cl::init(true)};
  // MegaFBD (--mapp-split-fwd-bwd; tp= is the backward side's degree).
  Option<bool> fbd{*this, "fbd",
                   llvm::cl::desc("Split forward and backward (MegaFBD)"),
                   llvm::cl::init(false)};
  Option<int64_t> fwdTp{*this, "fwd-tp",
                        llvm::cl::desc("Forward side's tp (0: tp)"),
                        llvm::cl::init(0)};
  Option<std::string> fwdDevice{*this, "fwd-device", llvm::cl::init("cpu")};
  Option<std::string> bwdDevice{*this, "bwd-device", llvm::cl::init("cpu")};
  Option<int64_t> fwdIndex{*this, "fwd-index", llvm::cl::init(0)};
  Option<int64_t> bwdIndex{*this, "bwd-index", llvm::cl::init(0)};
  Option<std::string> transfer{*this, "transfer",
                               llvm::cl::desc("activations | recompute"),
                               llvm::cl::init("recompute")};
};

void buildTrainPipeline(OpPassManager &pm, const TrainPipelineOptions &o) {
  // A forward side of another degree is built again from the forward graph.
  if (o.fbd && o.fwdTp > 0 && o.fwdTp != o.tp)
    pm.addPass(mapp::createMappFbdKeepSource());
  mapp::MappTensorParallelOptions tpOpts;
  tpOpts.tp = o.tp;
  tpOpts.sequenceParallel = o.sequenceParallel;
  pm.addPass(mapp::createMappTensorParallel(tpOpts));

  // Experts over the ep group (inside dp) on the forward graph, before the
  // stages are cut: dispatch/combine land in their layer's stage.
  mapp::MappExpertParallelOptions epOpts;
  epOpts.ep = o.ep;
  epOpts.dp = o.dp;
  pm.addPass(mapp::createMappExpertParallel(epOpts));

  // The sequence over cp (inside dp): the data-parallel pass then averages
  // gradients over dp·cp ranks.
  mapp::MappContextParallelOptions cpOpts;
  cpOpts.cp = o.cp;
  cpOpts.comm = o.cpComm;
  cpOpts.dp = o.dp * o.cp;
  pm.addPass(mapp::createMappContextParallel(cpOpts));

  mapp::MappPipelinePartitionOptions ppOpts;
  ppOpts.pp = o.pp;
  ppOpts.chunks = o.chunks;
  ppOpts.stageLayers = o.stageLayers;
  ppOpts.stageWeights = o.stageWeights;
  pm.addPass(mapp::createMappPipelinePartition(ppOpts));

  // Gradients accumulate over microbatches: seeding d(loss) with 1/m makes
  // the accumulated gradient that of the mean loss.
  mapp::MappAutodiffOptions adOpts;
  adOpts.lossScale = 1.0 / std::max<int64_t>(1, o.microbatches);
  pm.addPass(mapp::createMappAutodiff(adOpts));

  // Recomputation rewrites the forward/backward pairs autodiff made, before
  // data parallelism adds grad_syncs and zb-h1 splits the backward.
  if (o.recompute != "none") {
    mapp::MappRecomputeOptions rcOpts;
    rcOpts.policy = o.recompute;
    rcOpts.layers = o.recomputeLayers;
    pm.addPass(mapp::createMappRecompute(rcOpts));
  }

  // The optimizer comes before data parallelism so ZeRO-1 can shard its
  // updates; the grad_syncs it adds still run before the optimizer step.
  mapp::MappOptimizerOptions optOpts;
  optOpts.optimizer = o.optimizer;
  optOpts.lr = o.lr;
  optOpts.beta1 = o.beta1;
  optOpts.beta2 = o.beta2;
  optOpts.eps = o.eps;
  optOpts.weightDecay = o.weightDecay;
  optOpts.skipDecay1d = o.skipDecay1d;
  optOpts.momentum = o.momentum;
  optOpts.maxGradNorm = o.maxGradNorm;
  optOpts.schedule = o.lrSchedule;
  optOpts.warmup = o.warmup;
  optOpts.totalSteps = o.totalSteps;
  optOpts.minLr = o.minLr;
  pm.addPass(mapp::createMappOptimizer(optOpts));

  mapp::MappDataParallelOptions dpOpts;
  dpOpts.dp = o.dp * std::max<int64_t>(o.cp, 1);
  dpOpts.bucketMb = o.bucketMb;
  dpOpts.zero1 = o.zero1;
  pm.addPass(mapp::createMappDataParallel(dpOpts));

  // Zero-bubble schedules run the weight gradients as their own tasks.
  if (o.schedule == "zb-h1")
    pm.addPass(mapp::createMappSplitBackward());

  // Fusion sees the final graph: gradients, the optimizer's updates and the
  // data-parallel collectives (a value a collective reads stays whole).
  if (o.fuse)
    pm.addPass(mapp::createMappFuse());

  mapp::MappPipelineScheduleOptions schedOpts;
  schedOpts.schedule = o.schedule;
  schedOpts.microbatches = o.microbatches;
  schedOpts.group = o.group;
  schedOpts.memCap = o.memCap;
  schedOpts.slowLinkRatio = o.slowLinkRatio;
  schedOpts.bandwidthSmoothing = o.bandwidthSmoothing;
  pm.addPass(mapp::createMappPipelineSchedule(schedOpts));
  pm.addPass(mapp::createMappVerifySchedule());

  if (o.fbd) {
    mapp::MappSplitFwdBwdOptions fbdOpts;
    fbdOpts.fwdTp = o.fwdTp;
    fbdOpts.bwdTp = o.tp;
    fbdOpts.fwdDevice = o.fwdDevice;
    fbdOpts.bwdDevice = o.bwdDevice;
    fbdOpts.fwdIndex = o.fwdIndex;
    fbdOpts.bwdIndex = o.bwdIndex;
    fbdOpts.transfer = o.transfer;
    pm.addPass(mapp::createMappSplitFwdBwd(fbdOpts));
  }

  // The plan follows: --mapp-plan-memory and --mapp-lower-to-plan (or
  // mapp-translate --mapp-to-plan); test/python/test_parallel_e2e.py runs
  // the result against the single-rank step.
}

} // namespace

void mapp::registerMappPipelines() {
  PassPipelineRegistration<TrainPipelineOptions>(
      "mapp-train-pipeline",
      "Forward graph → parallel training step: tensor-parallel, "
      "expert-parallel (ep=, inside dp), context-parallel (cp=, cp-comm=, inside dp), pipeline-partition, autodiff (loss-scale 1/microbatches), recompute "
      "(recompute=selective|full|activations), optimizer, "
      "data-parallel, fuse (fuse=true), pipeline-schedule, verify-schedule (fbd=true: then "
      "split-fwd-bwd)",
      buildTrainPipeline);
}
