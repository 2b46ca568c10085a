//===- plan_mutate.cpp - mapp-fuzz-plan's structured plan mutations ------===//
//
// Edits of a decoded plan that keep it close to valid (a kernel, an
// attribute, an operand, a size, a schedule entry changed), so the
// verifier's semantic checks and the executor are reached rather than the
// FlatBuffers verifier alone.
//
//===----------------------------------------------------------------------===//
#include "PlanMutate.h"

#include "mapp/rt/Kernels.h"

using namespace mappfuzz;
using namespace mapp::rt;

namespace {

const std::vector<std::string> &kernelNames() {
  static std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const KernelSpec &s : allKernelSpecs())
      n.push_back(s.name);
    n.push_back("no_such_kernel");
    n.push_back("");
    n.push_back("trace_begin");
    return n;
  }();
  return names;
}

const std::vector<std::string> kAttrKeys = {
    "heads",     "scale",       "causal",      "rotary",      "rotary_base",
    "dim",       "start",       "end",         "perm",        "dims",
    "factor",    "value",       "p",           "seed",        "eps",
    "lr",        "beta1",       "beta2",       "weight_decay", "max_norm",
    "schedule",  "warmup",      "total_steps", "min_lr",      "momentum",
    "dampening", "nesterov",    "transpose_a", "transpose_b", "approximate",
    "vocab",     "ignore_index", "group",      "reduction",   "peer",
    "tag",       "rotary_dim",  "softcap",     "sliding_window", "dropout",
    "dropout_seed", "weight_offset", "cap"};

AttrValue randomAttr(Rng &r, const Program &p) {
  AttrValue a;
  switch (r.below(5)) {
  case 0:
    a.kind = AttrValue::Int;
    a.i = r.chance(50) ? interestingInt(r) : static_cast<int64_t>(r.below(9)) - 2;
    break;
  case 1:
    a.kind = AttrValue::Float;
    a.f = interestingFloat(r);
    break;
  case 2: {
    a.kind = AttrValue::Str;
    static const char *s[] = {"none", "tanh", "constant", "cosine", "dp",
                              "tp",   "sum",  "",         "\xff\xfe", "x"};
    a.s = s[r.below(10)];
    break;
  }
  case 3: {
    a.kind = AttrValue::Ints;
    size_t n = r.below(6);
    for (size_t i = 0; i < n; ++i)
      a.ints.push_back(r.chance(70) ? static_cast<int64_t>(r.below(5)) - 1
                                    : interestingInt(r));
    break;
  }
  case 4: {
    a.kind = AttrValue::Floats;
    size_t n = r.below(4);
    for (size_t i = 0; i < n; ++i)
      a.floats.push_back(interestingFloat(r));
    break;
  }
  }
  (void)p;
  return a;
}

Instr *randomInstr(Rng &r, Program &p) {
  std::vector<Instr *> all;
  for (Block &b : p.blocks)
    for (Instr &in : b.instrs)
      all.push_back(&in);
  return all.empty() ? nullptr : all[r.below(all.size())];
}

int randomValueIndex(Rng &r, const Program &p) {
  if (r.chance(90) && !p.values.empty())
    return static_cast<int>(r.below(p.values.size()));
  static const int k[] = {-1, -2, 1 << 20, 0x7fffffff, (int)0x80000000};
  return r.chance(30) ? static_cast<int>(p.values.size()) : k[r.below(5)];
}

/// Make a value's bytes agree with its type and fit its storage, so that
/// shape/dtype edits get past the byte checks and reach the kernel rules.
void fixBytes(Program &p, Value &v) {
  uint64_t n = 1;
  for (int64_t d : v.type.shape) {
    if (d < 0 || d > (1 << 24))
      return;
    n *= static_cast<uint64_t>(d);
    if (n > (uint64_t(1) << 26))
      return;
  }
  if (static_cast<uint8_t>(v.type.dtype) > static_cast<uint8_t>(DType::I64))
    return;
  v.bytes = n * dtypeSize(v.type.dtype);
  uint64_t &limit = inArena(v.kind) ? p.arenaBytes : p.persistentBytes;
  if (v.offset + v.bytes > limit)
    limit = (v.offset + v.bytes + 63) / 64 * 64;
}

} // namespace

void mappfuzz::mutatePlan(Rng &r, Plan &plan) {
  if (plan.programs.empty())
    return;
  Program &p = plan.programs[r.below(plan.programs.size())];
  int n = 1 + static_cast<int>(r.below(r.chance(70) ? 2 : 6));
  for (int k = 0; k < n; ++k) {
    switch (r.below(24)) {
    case 0: { // plan-level scalar
      int *f[] = {&plan.worldSize, &plan.tp,        &plan.pp,
                  &plan.dp,        &plan.chunks,    &plan.microBatchSize,
                  &plan.numMicrobatches, &plan.seqLength, &plan.vocabSize};
      *f[r.below(9)] = r.chance(50) ? static_cast<int>(interestingInt(r))
                                    : static_cast<int>(r.below(5));
      break;
    }
    case 1:
      plan.maxGradNorm = interestingFloat(r);
      break;
    case 2: { // program scalars
      int *f[] = {&p.rank, &p.slots, &p.tokens, &p.targets, &p.loss};
      int i = static_cast<int>(r.below(5));
      *f[i] = i >= 2 ? randomValueIndex(r, p)
                     : (r.chance(50) ? static_cast<int>(interestingInt(r))
                                     : static_cast<int>(r.below(4)));
      break;
    }
    case 3: {
      uint64_t &f = r.chance(50) ? p.arenaBytes : p.persistentBytes;
      f = r.chance(50) ? static_cast<uint64_t>(interestingInt(r))
                       : f + r.below(129) - 64;
      break;
    }
    case 4: { // value kind
      if (p.values.empty())
        break;
      Value &v = p.values[r.below(p.values.size())];
      v.kind = static_cast<ValueKind>(r.below(r.chance(90) ? 6 : 256));
      if (r.chance(70))
        fixBytes(p, v);
      break;
    }
    case 5: { // value dtype
      if (p.values.empty())
        break;
      Value &v = p.values[r.below(p.values.size())];
      v.type.dtype = static_cast<DType>(r.below(r.chance(90) ? 5 : 256));
      if (r.chance(80))
        fixBytes(p, v);
      break;
    }
    case 6: { // value shape
      if (p.values.empty())
        break;
      Value &v = p.values[r.below(p.values.size())];
      Shape &s = v.type.shape;
      switch (r.below(5)) {
      case 0:
        if (!s.empty())
          s[r.below(s.size())] = r.chance(60)
                                     ? static_cast<int64_t>(r.below(9))
                                     : interestingInt(r);
        break;
      case 1:
        s.insert(s.begin() + r.below(s.size() + 1),
                 static_cast<int64_t>(1 + r.below(4)));
        break;
      case 2:
        if (!s.empty())
          s.erase(s.begin() + r.below(s.size()));
        break;
      case 3:
        std::reverse(s.begin(), s.end());
        break;
      case 4:
        s = p.values[r.below(p.values.size())].type.shape;
        break;
      }
      if (r.chance(85))
        fixBytes(p, v);
      break;
    }
    case 7: { // value offset / bytes
      if (p.values.empty())
        break;
      Value &v = p.values[r.below(p.values.size())];
      if (r.chance(50))
        v.offset = r.chance(50) ? v.offset + r.below(9) - 4
                                : static_cast<uint64_t>(interestingInt(r));
      else
        v.bytes = r.chance(50) ? v.bytes + r.below(9) - 4
                               : static_cast<uint64_t>(interestingInt(r));
      break;
    }
    case 8: { // value param
      if (p.values.empty())
        break;
      p.values[r.below(p.values.size())].param = randomValueIndex(r, p);
      break;
    }
    case 9: { // copy the whole type (and storage) of another value
      if (p.values.size() < 2)
        break;
      Value &a = p.values[r.below(p.values.size())];
      const Value &b = p.values[r.below(p.values.size())];
      a.type = b.type;
      if (r.chance(50)) {
        a.offset = b.offset;
        a.bytes = b.bytes;
      } else
        fixBytes(p, a);
      break;
    }
    case 10: { // kernel name
      if (Instr *in = randomInstr(r, p))
        in->kernel = r.pick(kernelNames());
      break;
    }
    case 11:
    case 12: { // operand index
      Instr *in = randomInstr(r, p);
      if (!in)
        break;
      std::vector<int> &ops = r.chance(60) ? in->inputs : in->outputs;
      if (!ops.empty())
        ops[r.below(ops.size())] = randomValueIndex(r, p);
      break;
    }
    case 13: { // operand count
      Instr *in = randomInstr(r, p);
      if (!in)
        break;
      std::vector<int> &ops = r.chance(60) ? in->inputs : in->outputs;
      if (!ops.empty() && r.chance(50))
        ops.erase(ops.begin() + r.below(ops.size()));
      else
        ops.insert(ops.begin() + r.below(ops.size() + 1),
                   randomValueIndex(r, p));
      break;
    }
    case 14:
    case 15: { // attribute: change, retype, add, drop
      Instr *in = randomInstr(r, p);
      if (!in)
        break;
      Attrs fresh;
      bool changed = false;
      std::vector<std::string> keys;
      for (auto &[key, a] : in->attrs.all())
        keys.push_back(key);
      std::string target =
          keys.empty() || r.chance(30) ? r.pick(kAttrKeys) : r.pick(keys);
      bool drop = r.chance(20);
      for (auto &[key, a] : in->attrs.all()) {
        if (key == target) {
          changed = true;
          if (drop)
            continue;
          AttrValue v = a;
          if (v.kind == AttrValue::Int && r.chance(60))
            v.i = r.chance(50) ? interestingInt(r) : v.i + r.below(5) - 2;
          else if (v.kind == AttrValue::Float && r.chance(60))
            v.f = interestingFloat(r);
          else if (v.kind == AttrValue::Ints && !v.ints.empty() && r.chance(60))
            v.ints[r.below(v.ints.size())] =
                r.chance(50) ? interestingInt(r) : r.below(5);
          else
            v = randomAttr(r, p);
          fresh.set(key, v);
        } else
          fresh.set(key, a);
      }
      if (!changed && !drop)
        fresh.set(target, randomAttr(r, p));
      in->attrs = fresh;
      break;
    }
    case 16: { // instr order / duplication / removal
      if (p.blocks.empty())
        break;
      Block &b = p.blocks[r.below(p.blocks.size())];
      if (b.instrs.empty())
        break;
      size_t i = r.below(b.instrs.size()), j = r.below(b.instrs.size());
      switch (r.below(3)) {
      case 0:
        std::swap(b.instrs[i], b.instrs[j]);
        break;
      case 1:
        b.instrs.insert(b.instrs.begin() + j, b.instrs[i]);
        break;
      case 2:
        b.instrs.erase(b.instrs.begin() + i);
        break;
      }
      break;
    }
    case 17: { // move an instr into another block
      if (p.blocks.size() < 2)
        break;
      Block &a = p.blocks[r.below(p.blocks.size())];
      Block &b = p.blocks[r.below(p.blocks.size())];
      if (a.instrs.empty() || &a == &b)
        break;
      size_t i = r.below(a.instrs.size());
      b.instrs.insert(b.instrs.begin() + r.below(b.instrs.size() + 1),
                      a.instrs[i]);
      a.instrs.erase(a.instrs.begin() + i);
      break;
    }
    case 18: { // block kind / removal / duplication
      if (p.blocks.empty())
        break;
      size_t i = r.below(p.blocks.size());
      switch (r.below(3)) {
      case 0:
        p.blocks[i].kind = static_cast<BlockKind>(r.below(r.chance(90) ? 5 : 256));
        break;
      case 1:
        p.blocks.erase(p.blocks.begin() + i);
        break;
      case 2:
        p.blocks.push_back(p.blocks[i]);
        break;
      }
      break;
    }
    case 19: { // tasks
      switch (r.below(4)) {
      case 0:
        p.tasks.clear();
        break;
      case 1:
        p.tasks.push_back(
            {static_cast<int>(r.below(p.blocks.size() + 1)),
             static_cast<int>(r.below(plan.numMicrobatches + 1))});
        break;
      case 2:
        if (!p.tasks.empty()) {
          Task &t = p.tasks[r.below(p.tasks.size())];
          (r.chance(50) ? t.block : t.microbatch) =
              r.chance(70) ? static_cast<int>(r.below(4))
                           : static_cast<int>(interestingInt(r));
        }
        break;
      case 3:
        if (!p.tasks.empty())
          std::swap(p.tasks[r.below(p.tasks.size())],
                    p.tasks[r.below(p.tasks.size())]);
        break;
      }
      break;
    }
    case 20: // more microbatches (exercises slots and the data path)
      plan.numMicrobatches = 1 + static_cast<int>(r.below(4));
      p.slots = 1 + static_cast<int>(r.below(plan.numMicrobatches));
      break;
    case 21: { // a second program / a different rank
      if (r.chance(50) && plan.programs.size() < 3) {
        plan.programs.push_back(p);
        plan.programs.back().rank = static_cast<int>(r.below(3));
        return; // p may dangle now
      }
      p.rank = static_cast<int>(r.below(2));
      break;
    }
    case 22: // schema version
      plan.version = r.chance(50) ? kPlanSchemaVersion + 1
                                  : static_cast<uint32_t>(r.next());
      break;
    case 23: { // value name (parameters are looked up by name)
      if (p.values.empty())
        break;
      Value &v = p.values[r.below(p.values.size())];
      v.name = r.chance(50) ? p.values[r.below(p.values.size())].name
                            : std::string(r.below(4), '\0');
      break;
    }
    }
  }
}
