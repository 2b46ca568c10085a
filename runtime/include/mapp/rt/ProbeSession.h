//===- ProbeSession.h - MegaScope inside mapp-run ---------------*- C++ -*-===//
//
// Ties the pieces together for one rank: registers the plan's probes and
// switches in the store, gives kernels the switch states, applies control
// commands between steps, records step metrics and generated tokens, and
// keeps a bounded cache of the latest scalar samples for the live view.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBESESSION_H
#define MAPP_RT_PROBESESSION_H

#include "mapp/rt/Executor.h"
#include "mapp/rt/Metrics.h"
#include "mapp/rt/Probe.h"
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/ProbeStore.h"
#include "mapp/rt/Tokenizer.h"

#include <map>

namespace mapp::rt {

struct ProbeSessionOptions {
  std::string db;      // --probe-db ("" = no store)
  std::string control; // --probe-control FILE|PORT ("" = none)
  /// --probe-control-token-file ("" = ControlFiles.h's default beside db)
  std::string controlTokenFile;
  std::string runName; // --probe-run (ranks of one job share a name)
  std::string plan;    // recorded in the run's metadata
  std::string mode = "train";
  std::string extraMeta = "{}"; // JSON object merged into the run metadata
};

class ProbeSession final : public ProbeRuntime {
public:
  ProbeSession(Executor &exec, const ProbeSessionOptions &o);
  ~ProbeSession() override;

  /// Applies queued control commands; call before each step.
  void beginStep(int64_t step);
  void endStep(const StepMetrics &m);
  void recordToken(int64_t position, int32_t token, const std::string &text,
                   double prob, const std::string &topkJson);
  /// Token texts for the UI's axes (TokenRecord.cpp): every id's text once
  /// per run, and the tokens one forward saw (batch row 0 of microbatch 0
  /// in training, the context window when generating).
  void recordVocabulary(const Tokenizer &tok);
  void recordContext(int64_t step, bool generating, const int32_t *ids,
                     int64_t n);
  /// Samples still captured on a device keep the phase they were taken in.
  void setGenerating(bool g) {
    exec_.drainProbes();
    generating_ = g;
  }
  /// Commits everything; rethrows store errors.
  void flush();
  std::string controlEndpoint() const;
  /// Where the control port's token was written ("" = no port).
  std::string controlTokenFile() const {
    return control_ ? control_->tokenFile() : "";
  }
  ProbeStore *store() { return store_.get(); }

  void record(ProbeSample &&s) override;
  bool switchState(int64_t id, SwitchState &out) const override;
  bool generating() const override { return generating_; }

private:
  struct Switch {
    SwitchState state;
    std::string kind, target, point;
  };
  void registerPlan(const std::string &metaJson);
  /// MoE: every layer's tokens per expert of the step (rank 0's global
  /// counts, as metrics.jsonl) as reduction "experts" of a probe per layer.
  void recordExpertTokens(const StepMetrics &m);
  /// Ids of those probes: above any the compiler gives a plan's probes.
  static constexpr int64_t kExpertProbeBase = int64_t(1) << 30;
  std::string stateJson();

  Executor &exec_;
  ProbeSessionOptions opts_;
  std::unique_ptr<ProbeStore> store_;
  std::unique_ptr<ProbeControl> control_;
  std::map<int64_t, Switch> switches_;
  std::map<std::string, int64_t> expertProbes_; // MoE layer -> probe id
  bool generating_ = false;
  bool vocabRecorded_ = false;
  int64_t step_ = 0;
  std::mutex cacheMu_;
  /// (probe, reduction) -> (step, value); bounded by the plan's probes.
  std::map<std::pair<int64_t, std::string>, std::pair<int64_t, double>> latest_;
};

} // namespace mapp::rt

#endif
