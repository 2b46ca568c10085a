//===- Metrics.h - per-step metrics and console progress --------*- C++ -*-===//
#ifndef MAPP_RT_METRICS_H
#define MAPP_RT_METRICS_H

#include "mapp/rt/ExpertTally.h"

#include <cstdint>
#include <fstream>
#include <string>

namespace mapp::rt {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, gradNorm = 0;
  double tokensPerS = 0, stepMs = 0;
  int64_t tokens = 0;
  double lossScale = 1; // the step's loss scale (1 without loss scaling)
  bool skipped = false; // the optimizer did not run (a loss-scale overflow)
  ExpertTokens expertTokens; // MoE: rows per expert per layer (may be empty)
};

/// One JSON object per line: step, loss, lr, grad_norm, tokens_per_s,
/// step_ms, tokens, loss_scale, skipped (nan losses are written as null);
/// MoE plans add expert_tokens {moe_assign name: [rows per expert]}.
class MetricsWriter {
public:
  /// `append`: an elastic restart continues the file (trimmed before).
  explicit MetricsWriter(const std::string &path, bool append = false);
  void write(const StepMetrics &m);

private:
  std::ofstream out_;
  std::string path_;
};

/// A redrawn bar when stdout is a terminal, one plain line per step otherwise.
class Progress {
public:
  Progress(int64_t totalSteps, bool tty, bool quiet);
  void update(const StepMetrics &m);
  void finish();

private:
  int64_t total_;
  bool tty_, quiet_;
};

} // namespace mapp::rt

#endif
