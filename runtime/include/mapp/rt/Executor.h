//===- Executor.h - runs one rank's program ---------------------*- C++ -*-===//
//
// Storage: a persistent pool (Param, Grad, OptState at their plan offsets)
// and `slots` arenas of arena_bytes (Temp, Input, Loss; microbatch m uses
// slot m % slots). A training step zeroes the Grad values, runs the tasks in
// table order (filling the Input values of a microbatch the first time a
// task of it touches its slot), computes the global gradient norm, runs the
// Optimizer block(s) once and advances the step counter.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_EXECUTOR_H
#define MAPP_RT_EXECUTOR_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"

#include <functional>
#include <memory>
#include <vector>

namespace mapp::rt {

struct StepResult {
  int64_t step = 0;  // 0-based index of the step just run
  double loss = 0;   // mean of the microbatch losses (nan if none)
  double gradNorm = 0;
  double lr = 0;     // scheduled lr of the step (first optimizer instr)
  int64_t tokens = 0; // tokens consumed by this rank
};

class Executor {
public:
  /// Fills tokens/targets ([micro_batch_size, seq_length] each) of
  /// microbatch `mb` of step `step`.
  using BatchFn =
      std::function<void(int64_t step, int mb, int32_t *tokens, int32_t *targets)>;
  /// Called with the executor once a step's gradients are complete, before
  /// the optimizer block runs.
  using GradHook = std::function<void(const Executor &)>;

  Executor(const Plan &plan, Backend &backend, Communicator &comm);
  ~Executor();
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  const Program &program() const { return *prog_; }
  const Plan &plan() const { return plan_; }

  /// Every Param initialized by initParam(name, shape, seed).
  void initParams(uint64_t seed);
  /// Every Param read by name from `st`; missing or mis-shaped -> Error.
  void loadParams(const Safetensors &st, const std::string &where);
  Safetensors saveParams() const;
  /// Grad values by their parameter's name.
  Safetensors saveGrads() const;

  StepResult step(const BatchFn &batches, const GradHook &afterGrads = {});
  int64_t stepsDone() const { return step_; }

  /// Float view of value `v` in `slot` (pool values ignore the slot).
  float *valueData(int v, int slot = 0) const;

private:
  struct Prepared;
  void runBlock(int block, int mb, int slot, KernelContext &ctx);
  double gradNorm() const;
  /// Host copy of a pool value (storage may be device memory).
  std::vector<float> hostCopy(int v) const;

  const Plan &plan_;
  const Program *prog_ = nullptr;
  Backend &backend_;
  Communicator &comm_;
  uint8_t *pool_ = nullptr;
  uint8_t *arena_ = nullptr;
  std::vector<std::vector<Prepared>> blocks_;
  std::vector<bool> blockWritesLoss_;
  int64_t step_ = 0;
};

} // namespace mapp::rt

#endif
