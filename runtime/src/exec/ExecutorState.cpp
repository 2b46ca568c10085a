//===- ExecutorState.cpp - training state in and out, finiteness checks ---===//
//
// What a checkpoint holds of a rank (Params and OptStates; everything else
// of the training state is a function of the step: the lr schedule, the data
// order, dropout's counter-based masks) and the per-op finiteness check the
// non-finite diagnosis re-runs a step with.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/KernelVocab.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

using namespace mapp::rt;

bool mapp::rt::stepFinite(const StepResult &r) {
  return std::isfinite(r.gradNorm) && (!r.lossKnown || std::isfinite(r.globalLoss));
}

Safetensors Executor::saveState() const {
  Safetensors st;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Param || val.kind == ValueKind::OptState)
      st.tensors[val.name] = StTensor::fromF32(
          val.type.shape, hostCopy(static_cast<int>(v)).data());
  }
  st.metadata["step"] = std::to_string(step_);
  return st;
}

void Executor::loadState(const Safetensors &st, bool pieces,
                         const std::string &where) {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param && val.kind != ValueKind::OptState)
      continue;
    auto it = st.tensors.find(val.name);
    if (it == st.tensors.end())
      fail(where, ": missing tensor '", val.name, "' (",
           valueKindName(val.kind), ", shape ", shapeStr(val.type.shape), ")");
    loadValue(static_cast<int>(v), it->second, pieces, where);
  }
}

std::string Executor::firstNonFiniteParam() const {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param)
      continue;
    for (float x : hostCopy(static_cast<int>(v)))
      if (!std::isfinite(x))
        return val.name;
  }
  return "";
}

namespace {
bool isFloat(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

/// Index of the first non-finite element, -1 if none.
int64_t firstNonFinite(const std::vector<float> &xs) {
  for (size_t i = 0; i < xs.size(); ++i)
    if (!std::isfinite(xs[i]))
      return static_cast<int64_t>(i);
  return -1;
}

/// "op 'X' (kernel K, layer L) wrote V to tensor 'T'`where` at element i of
/// n": the per-op check and the refusals to save a state (checkpoint,
/// --save, the non-finite step) name a non-finite value alike.
std::string nonFiniteWrite(const Instr *op, const Value &val,
                           const std::string &where,
                           const std::vector<float> &xs, int64_t bad) {
  std::ostringstream os;
  if (op)
    os << "op '" << (op->name.empty() ? op->kernel : op->name) << "' (kernel "
       << op->kernel
       << (op->layer >= 0 ? ", layer " + std::to_string(op->layer) : "")
       << ") wrote " << xs[bad] << " to ";
  os << "tensor '" << val.name << "'" << where;
  if (!op)
    os << " holds " << xs[bad];
  os << " at element " << bad << " of " << xs.size();
  return os.str();
}
} // namespace

std::string Executor::describeNonFinite(const std::string &tensor) const {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.name != tensor ||
        (val.kind != ValueKind::Param && val.kind != ValueKind::OptState))
      continue;
    std::vector<float> xs = hostCopy(static_cast<int>(v));
    int64_t bad = firstNonFinite(xs);
    if (bad < 0)
      break;
    // The last writer in program order: an in-place optimizer update, for
    // Params and their states.
    const Instr *writer = nullptr;
    for (const Block &b : prog_->blocks)
      for (const Instr &in : b.instrs) {
        const KernelInfo *k = findKernelInfo(in.kernel);
        bool inPlace = k && k->has(kInPlace);
        for (const std::vector<int> *ops : {&in.outputs, &in.inputs})
          if ((ops == &in.outputs || inPlace) &&
              std::count(ops->begin(), ops->end(), static_cast<int>(v)))
            writer = &in;
      }
    return nonFiniteWrite(writer, val, "", xs, bad);
  }
  return "tensor '" + tensor + "' holds non-finite values on another rank";
}

void Executor::injectNan(const Instr &in, int slot) {
  if (in.name != nanOp_ || in.outputs.empty())
    return;
  const Value &val = prog_->values[in.outputs[0]];
  if (val.type.dtype != DType::F32 || val.storedBf16)
    fail("--inject-nan: op '", in.name, "' has no f32 output");
  float nan = std::numeric_limits<float>::quiet_NaN();
  backend_.copyToStorage(valueData(in.outputs[0], slot), &nan, sizeof nan);
}

void Executor::checkOutputsFinite(const Instr &in, int block, int mb,
                                  int slot) const {
  for (size_t k = 0; k < in.outputs.size(); ++k) {
    int v = in.outputs[k];
    const Value &val = prog_->values[v];
    if (!isFloat(val.type.dtype))
      continue;
    std::vector<float> xs = readFloats(v, slot, 0, val.type.numel());
    int64_t bad = firstNonFinite(xs);
    if (bad < 0)
      continue;
    // Inputs already bad would make this op a follower, not the source; the
    // executor runs instrs in order, so that cannot happen unless an input
    // came from elsewhere (a parameter, a received activation): say so.
    std::string inputs;
    for (int u : in.inputs) {
      const Value &iv = prog_->values[u];
      if (isFloat(iv.type.dtype) &&
          firstNonFinite(readFloats(u, slot, 0, iv.type.numel())) >= 0)
        inputs += (inputs.empty() ? "" : ", ") + std::string("'") + iv.name + "'";
    }
    fail("non-finite value: step ", step_ + 1, ", microbatch ", mb, ", ",
         blockKindName(prog_->blocks[block].kind), " block ", block, ": ",
         nonFiniteWrite(&in, val, " (output " + std::to_string(k) + ")", xs,
                        bad),
         inputs.empty() ? std::string("; its inputs were finite")
                        : "; its non-finite inputs: " + inputs);
  }
}

void mapp::rt::failNonFinite(Executor &exec, const StepResult &r,
                             const Executor::BatchFn &batches) {
  std::ostringstream what;
  what << "step " << r.step + 1 << ": non-finite loss or gradient (loss "
       << r.globalLoss << ", grad norm " << r.gradNorm
       << "); the optimizer was skipped, no checkpoint written";
  std::string param = exec.firstNonFiniteParam();
  if (!param.empty())
    fail(what.str(), "; parameter '", param, "' already holds non-finite values");
  // The step left parameters and optimizer state as they were: run it again
  // with every op's outputs checked, which names the first bad one.
  exec.setStepsDone(r.step);
  exec.setCheckFinite(true);
  try {
    exec.step(batches);
  } catch (const Error &e) {
    fail(what.str(), "; re-ran the step with per-op checks: ", e.what());
  }
  fail(what.str(), "; the re-run with per-op checks found no op that wrote a "
       "non-finite value on this rank");
}

void Executor::initLossScale() {
  for (const Block &b : prog_->blocks)
    for (const Instr &in : b.instrs)
      if (in.attrs.has("loss_scale") && (in.kernel == "adamw" || in.kernel == "sgd")) {
        lsMode_ = in.attrs.getStr("loss_scale", "none");
        ls_.scale = in.attrs.getFloat("loss_scale_init", 65536);
        lsGrowth_ = in.attrs.getFloat("loss_scale_growth", 2);
        lsBackoff_ = in.attrs.getFloat("loss_scale_backoff", 0.5);
        lsInterval_ = in.attrs.getInt("loss_scale_growth_interval", 1000);
        lsMin_ = in.attrs.getFloat("loss_scale_min", 1);
        // The compute type's largest value: a scaled gradient norm beyond it
        // would have overflowed there (fp16: 65504); default fp32's range.
        lsLimit_ = in.attrs.getFloat("loss_scale_limit",
                                     std::numeric_limits<float>::max());
        if (lsMode_ != "static" && lsMode_ != "dynamic")
          fail("plan: loss_scale must be \"static\" or \"dynamic\", got '",
               lsMode_, "'");
        if (!(ls_.scale > 0) || !(lsGrowth_ >= 1) || !(lsBackoff_ > 0) ||
            !(lsBackoff_ < 1) || lsInterval_ < 1 || !(lsMin_ > 0) ||
            !(lsLimit_ > 0))
          fail("plan: loss scaling needs loss_scale_init > 0, growth >= 1, "
               "backoff in (0, 1), growth_interval >= 1, min > 0, limit > 0");
        // The CUDA kernels do not read ctx.lossScale yet: refuse rather than
        // train on gradients scaled by 2^16.
        if (backend_.name() != "cpu")
          fail("plan: loss scaling runs on the cpu backend only so far "
               "(backend '", backend_.name(), "')");
        return;
      }
}

void Executor::applyLossScale(StepResult &r) const {
  if (lsMode_ == "none")
    return;
  r.lossScale = ls_.scale;
  double scaled = r.gradNorm;
  r.gradNorm = scaled / ls_.scale;
  if (lsMode_ != "dynamic")
    return;
  // At the smallest scale an overflow is what it is: the non-finite path
  // (or, when finite, training on) decides.
  bool over = !std::isfinite(scaled) || scaled > lsLimit_;
  if (over && ls_.scale > lsMin_) {
    r.overflow = true;
    r.skipped = true;
  }
}

void Executor::advanceLossScale(const StepResult &r) {
  if (lsMode_ != "dynamic")
    return;
  if (r.overflow) {
    ls_.scale = std::max(lsMin_, ls_.scale * lsBackoff_);
    ls_.goodSteps = 0;
  } else if (++ls_.goodSteps >= lsInterval_) {
    ls_.scale *= lsGrowth_;
    ls_.goodSteps = 0;
  }
}
