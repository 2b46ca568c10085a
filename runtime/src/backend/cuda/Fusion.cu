//===- Fusion.cu - fused instruction pairs (see Fusion.h) -----------------===//
#include "CudaBackend.h"
#include "Fusion.h"
#include "MoeInternal.h"
#include "mapp/rt/KernelVocab.h"

#include <algorithm>
#include <sstream>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// Whether two values' storage can share bytes: same region (the per-slot
/// arena or the persistent pool) and intersecting byte ranges.
bool overlap(const Program &p, int u, int v) {
  const Value &a = p.values[u], &b = p.values[v];
  if (inArena(a.kind) != inArena(b.kind))
    return false;
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

/// A reshape the memory plan made a view (its output is its input's
/// bytes): it moves no data, so it neither reads nor writes anything.
bool isView(const Instr &in) {
  const KernelInfo *info = findKernelInfo(in.kernel);
  return info && info->has(kMayAlias) && in.attrs.getInt("alias", 0);
}

bool touches(const Program &p, const Instr &in, int v) {
  if (isView(in))
    return false;
  for (int u : in.inputs)
    if (overlap(p, u, v))
      return true;
  for (int u : in.outputs)
    if (overlap(p, u, v))
      return true;
  return false;
}

/// No instruction strictly between i and j reads or writes v's bytes, so
/// writing v at i instead of at j cannot be observed.
bool untouchedBetween(const Program &p, const Block &b, size_t i, size_t j,
                      int v) {
  for (size_t k = i + 1; k < j; ++k)
    if (touches(p, b.instrs[k], v))
      return false;
  return true;
}

/// Index of the first instruction after i that runs `kernel` on input 0 = v.
size_t findConsumer(const Block &b, size_t i, const char *kernel, int v) {
  for (size_t j = i + 1; j < b.instrs.size(); ++j) {
    const Instr &in = b.instrs[j];
    if (in.kernel == kernel && !in.inputs.empty() && in.inputs[0] == v)
      return j;
  }
  return b.instrs.size();
}

bool sameAttrValue(const AttrValue &a, const AttrValue &b) {
  return a.kind == b.kind && a.i == b.i && a.f == b.f && a.s == b.s &&
         a.ints == b.ints && a.floats == b.floats;
}

/// Equal attrs apart from the ZeRO range, which each chunk carries, and
/// the parameter's name (`param`), which no kernel reads.
bool sameUpdateAttrs(const Attrs &a, const Attrs &b) {
  auto skip = [](const std::string &k) {
    return k == "zero_begin" || k == "zero_end" || k == "param";
  };
  auto ia = a.all().begin(), ea = a.all().end();
  auto ib = b.all().begin(), eb = b.all().end();
  while (true) {
    while (ia != ea && skip(ia->first))
      ++ia;
    while (ib != eb && skip(ib->first))
      ++ib;
    if (ia == ea || ib == eb)
      return ia == ea && ib == eb;
    if (ia->first != ib->first || !sameAttrValue(ia->second, ib->second))
      return false;
    ++ia;
    ++ib;
  }
}

/// No instruction strictly between i and j writes v's bytes.
bool unwrittenBetween(const Program &p, const Block &b, size_t i, size_t j,
                      int v) {
  for (size_t k = i + 1; k < j; ++k)
    if (!isView(b.instrs[k]))
      for (int u : b.instrs[k].outputs)
        if (overlap(p, u, v))
          return false;
  return true;
}

bool overlapsAny(const Program &p, const std::vector<int> &vs, int v) {
  for (int u : vs)
    if (overlap(p, u, v))
      return true;
  return false;
}

bool isF32Temp(const Value &v) {
  return v.kind == ValueKind::Temp && v.type.dtype == DType::F32;
}

struct Finder {
  const Program &p;
  const FusionSwitches &on;
  FusionTable t;
  std::vector<int> readers; // per value: number of reading instructions

  bool free(const Instr &in) const { return !t.ops.count(&in.attrs); }

  /// Operands an update reads and writes (adamw: p, g, m, v; sgd: p, g,
  /// buf), before the optional norm operand.
  static size_t stateOperands(const Instr &in) {
    return in.kernel == MAPP_KERNEL_NAME(adamw) ? 4 : 3;
  }

  /// An adamw / sgd instr whose update a multi-tensor launch can run: its
  /// state is fp32 in the persistent pool (fixed addresses).
  bool groupable(const Instr &in) const {
    bool adam = in.kernel == MAPP_KERNEL_NAME(adamw) && on.adam;
    bool sgd = in.kernel == MAPP_KERNEL_NAME(sgd) && on.sgd;
    size_t k = stateOperands(in);
    if (!(adam || sgd) || !free(in) ||
        (in.inputs.size() != k && in.inputs.size() != k + 1))
      return false;
    for (size_t i = 0; i < k; ++i) {
      const Value &v = p.values[in.inputs[i]];
      if (inArena(v.kind) || v.type.dtype != DType::F32)
        return false;
    }
    return true;
  }

  /// Whether `next` can join the group of `members`: the same update (kernel,
  /// attrs, clip source) on state no member touches.
  bool joins(const std::vector<const Instr *> &members,
             const Instr &next) const {
    const Instr &lead = *members[0];
    if (next.kernel != lead.kernel || !groupable(next) ||
        next.inputs.size() != lead.inputs.size() ||
        (next.inputs.size() > stateOperands(next) &&
         next.inputs.back() != lead.inputs.back()) ||
        !sameUpdateAttrs(next.attrs, lead.attrs))
      return false;
    for (const Instr *m : members)
      for (size_t i = 0; i < stateOperands(next); ++i)
        if (touches(p, *m, next.inputs[i]))
          return false;
    return true;
  }

  void optimGroups(const Block &b) {
    for (size_t i = 0; i < b.instrs.size();) {
      if (!groupable(b.instrs[i])) {
        ++i;
        continue;
      }
      std::vector<const Instr *> members = {&b.instrs[i]};
      size_t j = i + 1;
      while (j < b.instrs.size() && joins(members, b.instrs[j]))
        members.push_back(&b.instrs[j++]);
      i = j;
      if (members.size() < 2)
        continue;
      int g = static_cast<int>(t.optimGroups.size());
      bool adam = members[0]->kernel == MAPP_KERNEL_NAME(adamw);
      (adam ? t.adamGroups : t.sgdGroups) += 1;
      (adam ? t.adamGrouped : t.sgdGrouped) += static_cast<int>(members.size());
      FusedOp lead{FusedOp::OptimGroup, members[0]};
      lead.group = g;
      t.ops[&members[0]->attrs] = lead;
      for (size_t k = 1; k < members.size(); ++k)
        t.ops[&members[k]->attrs] = {FusedOp::Skip, members[k]};
      OptimGroup og;
      og.members = std::move(members);
      t.optimGroups.push_back(std::move(og));
    }
  }

  void linearGelu(const Block &b, size_t i) {
    const Instr &lin = b.instrs[i];
    if (lin.outputs.size() != 1 || lin.inputs.size() < 2)
      return;
    int pre = lin.outputs[0];
    if (!isF32Temp(p.values[pre]))
      return;
    size_t j = findConsumer(b, i, "gelu", pre);
    if (j == b.instrs.size())
      return;
    const Instr &gelu = b.instrs[j];
    int act = gelu.outputs[0];
    // cuBLASLt's GELU epilogue is the tanh approximation.
    if (gelu.attrs.getStr("approximate", "none") != "tanh" || !free(gelu) ||
        p.values[act].type.dtype != DType::F32 ||
        p.values[act].type.numel() != p.values[pre].type.numel() ||
        touches(p, lin, act) || !untouchedBetween(p, b, i, j, act))
      return;
    t.ops[&lin.attrs] = {FusedOp::LinearGelu, &lin, &gelu, nullptr, nullptr};
    t.ops[&gelu.attrs] = {FusedOp::Skip, &gelu};
    ++t.linearGelu;
  }

  /// An instruction whose output 0 is read by one instruction only, an
  /// elementwise add of it and another value of its shape, summed into a
  /// third: `mine` runs that add on the way out (FusedOp::LinearAdd,
  /// NormGradAdd). Writing the sum at i instead of at the add is invisible
  /// when nothing between them touches the sum or writes the other operand;
  /// the sum must not be one of instr i's operands (it is written while they
  /// are read) and either is the other operand or shares no byte with it
  /// (in place, each element is read before it is written).
  void residualAdd(const Block &b, size_t i, FusedOp::Kind mine) {
    const Instr &in = b.instrs[i];
    if (in.outputs.empty())
      return;
    int y = in.outputs[0];
    if (readers[y] != 1)
      return;
    size_t j = i + 1;
    while (j < b.instrs.size() &&
           std::find(b.instrs[j].inputs.begin(), b.instrs[j].inputs.end(),
                     y) == b.instrs[j].inputs.end())
      ++j;
    if (j == b.instrs.size())
      return;
    const Instr &add = b.instrs[j];
    if (add.kernel != MAPP_KERNEL_NAME(add) || !free(add) ||
        add.inputs.size() != 2 || add.outputs.size() != 1 ||
        add.inputs[0] == add.inputs[1])
      return;
    int other = add.inputs[0] == y ? add.inputs[1] : add.inputs[0];
    int sum = add.outputs[0];
    const Value &yv = p.values[y], &ov = p.values[other], &sv = p.values[sum];
    if (yv.type.shape != ov.type.shape || yv.type.shape != sv.type.shape ||
        yv.kind != ValueKind::Temp || sv.kind != ValueKind::Temp)
      return;
    std::vector<int> written(in.outputs.begin() + 1, in.outputs.end());
    bool inPlace = ov.kind == sv.kind && ov.offset == sv.offset &&
                   ov.bytes == sv.bytes;
    if (overlapsAny(p, in.inputs, sum) || overlapsAny(p, written, sum) ||
        overlapsAny(p, written, other) || (!inPlace && overlap(p, other, sum)) ||
        !untouchedBetween(p, b, i, j, sum) ||
        !unwrittenBetween(p, b, i, j, other))
      return;
    t.ops[&in.attrs] = {mine, &in, &add};
    t.ops[&add.attrs] = {FusedOp::Skip, &add};
    ++(mine == FusedOp::LinearAdd ? t.linearAdd : t.normGradAdd);
  }

  /// gelu_grad j (tanh) of a product y = dy·op(w) (matmul i, w 2-D) that
  /// nothing else reads: one GEMM with the DGELU epilogue runs at j, reading
  /// dy and w late, so neither may be written between i and j, nor overlap
  /// the gradient it writes (the memory plan may reuse a dead dy's bytes);
  /// the matmul is skipped and y never written.
  void dgradGelu(const Block &b, size_t j) {
    const Instr &gg = b.instrs[j];
    if (gg.attrs.getStr("approximate", "none") != "tanh" || gg.inputs.size() != 2 ||
        gg.outputs.size() != 1)
      return;
    int y = gg.inputs[0], pre = gg.inputs[1], dpre = gg.outputs[0];
    size_t i = j;
    while (i-- > 0)
      if (std::find(b.instrs[i].outputs.begin(), b.instrs[i].outputs.end(), y) !=
          b.instrs[i].outputs.end())
        break;
    if (i >= j)
      return;
    const Instr &mm = b.instrs[i];
    if (mm.kernel != MAPP_KERNEL_NAME(matmul) || !free(mm) ||
        mm.attrs.flag("transpose_a") || mm.inputs.size() != 2 ||
        mm.outputs.size() != 1 || readers[y] != 1 || y == pre)
      return;
    int dy = mm.inputs[0], w = mm.inputs[1];
    const Value &yv = p.values[y], &dv = p.values[dpre];
    if (p.values[w].type.rank() != 2 || p.values[dy].type.rank() < 2 ||
        yv.kind != ValueKind::Temp || dv.kind != ValueKind::Temp ||
        yv.type.shape != dv.type.shape || p.values[pre].type.shape != dv.type.shape ||
        overlapsAny(p, {dy, w, pre}, dpre) || !unwrittenBetween(p, b, i, j, dy) ||
        !unwrittenBetween(p, b, i, j, w) || !unwrittenBetween(p, b, i, j, pre))
      return;
    t.ops[&mm.attrs] = {FusedOp::Skip, &mm};
    t.ops[&gg.attrs] = {FusedOp::DgradGelu, &gg, &mm};
    ++t.dgradGelu;
  }

  /// The grad_accumulate that adds GEMM i's only output, and nothing else
  /// reads, into an fp32 gradient the GEMM does not touch and nothing
  /// touches in between: the GEMM can add into it with beta = 1. Null when
  /// there is none.
  const Instr *accumulation(const Block &b, size_t i) {
    const Instr &mm = b.instrs[i];
    int w = mm.outputs[0];
    if (!on.accumulate || readers[w] != 1)
      return nullptr;
    size_t j = findConsumer(b, i, "grad_accumulate", w);
    if (j == b.instrs.size())
      return nullptr;
    const Instr &acc = b.instrs[j];
    int g = acc.outputs[0];
    const Value &gv = p.values[g];
    if (free(acc) && gv.kind == ValueKind::Grad && gv.type.dtype == DType::F32 &&
        gv.type.numel() == p.values[w].type.numel() && !touches(p, mm, g) &&
        untouchedBetween(p, b, i, j, g))
      return &acc;
    return nullptr;
  }

  /// The MoE grouped wgrad (x, dy, counts) -> dw [E,K,N] before its
  /// grad_accumulate: one cuBLASLt call per expert adding into the gradient.
  void expertWgrad(const Block &b, size_t i) {
    const Instr &mm = b.instrs[i];
    if (mm.inputs.size() != 3 || mm.outputs.size() != 1 ||
        !isF32Temp(p.values[mm.outputs[0]]))
      return;
    const Instr *acc = accumulation(b, i);
    if (!acc)
      return;
    FusedOp op{FusedOp::ExpertWgrad, &mm};
    op.accumulate = acc;
    t.ops[&mm.attrs] = op;
    t.ops[&acc->attrs] = {FusedOp::Skip, acc};
    ++t.accumulate;
  }

  void wgrad(const Block &b, size_t i) {
    const Instr &mm = b.instrs[i];
    if (!mm.attrs.flag("transpose_a") || mm.attrs.flag("transpose_b") ||
        mm.inputs.size() != 2 || mm.outputs.size() != 1)
      return;
    int dy = mm.inputs[0], x = mm.inputs[1], w = mm.outputs[0];
    const TensorType &dyT = p.values[dy].type, &xT = p.values[x].type;
    if (dyT.rank() != 2 || xT.rank() != 2 || !isF32Temp(p.values[w]))
      return;
    FusedOp op{FusedOp::Wgrad, &mm};
    op.accumulate = accumulation(b, i);
    if (on.bgrad) {
      // The bias gradient sums the rows of dy, or of the tensor dy is a
      // reshape of (reshape is a row-major copy: same elements, same order).
      std::vector<int> sources = {dy};
      for (size_t k = i; k-- > 0;)
        if (!b.instrs[k].outputs.empty() && b.instrs[k].outputs[0] == dy) {
          if (b.instrs[k].kernel == MAPP_KERNEL_NAME(reshape))
            sources.push_back(b.instrs[k].inputs[0]);
          break;
        }
      for (int y : sources) {
        size_t k = findConsumer(b, i, "reduce_sum", y);
        if (k == b.instrs.size())
          continue;
        const Instr &rs = b.instrs[k];
        int r = rs.outputs[0];
        const TensorType &yT = p.values[y].type;
        std::vector<int64_t> dims = rs.attrs.getInts("dims");
        bool allButLast = static_cast<int>(dims.size()) == yT.rank() - 1;
        for (size_t d = 0; d < dims.size() && allButLast; ++d)
          allButLast = dims[d] == static_cast<int64_t>(d);
        const Value &rv = p.values[r];
        if (allButLast && free(rs) && rv.type.dtype == DType::F32 &&
            rv.type.rank() == 1 && rv.type.numel() == dyT.dim(1) &&
            !touches(p, mm, r) && untouchedBetween(p, b, i, k, r)) {
          op.biasGrad = &rs;
          break;
        }
      }
    }
    if (!op.accumulate && !op.biasGrad)
      return;
    t.ops[&mm.attrs] = op;
    if (op.accumulate) {
      t.ops[&op.accumulate->attrs] = {FusedOp::Skip, op.accumulate};
      ++t.accumulate;
    }
    if (op.biasGrad) {
      t.ops[&op.biasGrad->attrs] = {FusedOp::Skip, op.biasGrad};
      ++t.biasGrad;
    }
  }
};

} // namespace

FusionTable cuda::planFusions(const Program &p, const FusionSwitches &on) {
  Finder f{p, on, {}, std::vector<int>(p.values.size(), 0)};
  for (const Block &b : p.blocks)
    for (const Instr &in : b.instrs)
      for (size_t k = 0; k < in.inputs.size(); ++k) {
        bool repeated = false; // an instr reading v twice is one reader
        for (size_t l = 0; l < k; ++l)
          repeated |= in.inputs[l] == in.inputs[k];
        f.readers[in.inputs[k]] += !repeated;
      }
  for (const Block &b : p.blocks)
    for (size_t i = 0; i < b.instrs.size(); ++i) {
      const Instr &in = b.instrs[i];
      if (!f.free(in))
        continue;
      if (in.kernel == MAPP_KERNEL_NAME(linear) && on.gelu)
        f.linearGelu(b, i);
      else if (in.kernel == MAPP_KERNEL_NAME(matmul) &&
               (on.bgrad || on.accumulate))
        f.wgrad(b, i);
      else if (in.kernel == MAPP_KERNEL_NAME(moe_grouped_matmul_wgrad))
        f.expertWgrad(b, i);
      if (in.kernel == MAPP_KERNEL_NAME(gelu_grad) && on.dgelu && f.free(in))
        f.dgradGelu(b, i);
      if (!f.free(in) || !on.residual)
        continue;
      if (in.kernel == MAPP_KERNEL_NAME(linear))
        f.residualAdd(b, i, FusedOp::LinearAdd);
      else if (in.kernel == MAPP_KERNEL_NAME(layer_norm_grad) ||
               in.kernel == MAPP_KERNEL_NAME(rms_norm_grad))
        f.residualAdd(b, i, FusedOp::NormGradAdd);
    }
  if (on.adam || on.sgd)
    for (const Block &b : p.blocks)
      f.optimGroups(b);
  return std::move(f.t);
}

namespace {

void call(KernelFn fn, const Attrs &attrs, std::vector<Tensor> in,
          std::vector<Tensor> out, KernelContext &ctx) {
  fn({attrs, in.data(), static_cast<int>(in.size()), out.data(),
      static_cast<int>(out.size()), ctx});
}

} // namespace

bool cuda::runFused(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const FusedOp *f = be.fusions().find(a.attrs);
  if (!f)
    return false;
  if (f->kind == FusedOp::Skip)
    return true; // its partner or group leader did the work
  if (f->kind == FusedOp::OptimGroup) {
    runOptimGroup(a, be.fusions().optimGroups[f->group]);
    return true;
  }
  const Instr &self = *f->self;
  // Partner operands live in the same arena slot as this call's output.
  auto partnerValue = [&](int v) {
    return be.valueTensor(v, a.out[0], self.outputs[0]);
  };
  if (f->kind == FusedOp::DgradGelu) {
    // a: gelu_grad(y, pre) -> dpre; the partner matmul made y = dy·op(w).
    const Instr &mm = *f->partner;
    Tensor dy = be.valueTensor(mm.inputs[0], a.in[0], self.inputs[0]);
    Tensor w = be.valueTensor(mm.inputs[1], a.in[0], self.inputs[0]);
    if (__nv_bfloat16 *shadow = be.shadowOf(w.data))
      w = {shadow, {DType::BF16, w.type.shape}};
    if (dgradGelu(be, dy, w, mm.attrs.flag("transpose_b"), a.in[1], a.out[0]))
      return true;
    call(cuda::matmul, mm.attrs, {dy, w}, {a.in[0]}, a.ctx); // unfused
    cuda::gelu_grad(a);
    return true;
  }
  if (f->kind == FusedOp::LinearAdd || f->kind == FusedOp::NormGradAdd) {
    const Instr &add = *f->partner;
    int otherValue = add.inputs[0] == self.outputs[0] ? add.inputs[1] : add.inputs[0];
    Tensor other = partnerValue(otherValue), sum = partnerValue(add.outputs[0]);
    if (f->kind == FusedOp::NormGradAdd) {
      normGradResidual(a, self.kernel == MAPP_KERNEL_NAME(rms_norm_grad), other,
                       sum);
      return true;
    }
    if (linearAdd(be, a.in[0], a.in[1], linearBias(a), other, sum))
      return true;
    cuda::linear(a); // unfused, in the plan's order
    call(cuda::add, add.attrs, {partnerValue(add.inputs[0]),
                                partnerValue(add.inputs[1])}, {sum}, a.ctx);
    return true;
  }
  if (f->kind == FusedOp::LinearGelu) {
    Tensor act = partnerValue(f->partner->outputs[0]);
    if (linearGelu(be, a.in[0], a.in[1], linearBias(a), a.out[0], act))
      return true;
    cuda::linear(a); // unfused, in the plan's order
    call(cuda::gelu, f->partner->attrs, {a.out[0]}, {act}, a.ctx);
    return true;
  }
  if (f->kind == FusedOp::ExpertWgrad) {
    moe::groupedWgrad(be, a.in[0], a.in[1], a.in[2],
                      partnerValue(f->accumulate->outputs[0]), 1.0f);
    return true;
  }
  Tensor dw = a.out[0];
  float beta = 0.0f;
  if (f->accumulate) {
    dw = partnerValue(f->accumulate->outputs[0]);
    beta = 1.0f;
  }
  Tensor biasGrad;
  if (f->biasGrad)
    biasGrad = partnerValue(f->biasGrad->outputs[0]);
  if (!isBf16(biasGrad) &&
      wgradGemm(be, a.in[0], a.in[1], dw, f->biasGrad ? biasGrad.f32() : nullptr,
                beta))
    return true;
  cuda::matmul(a);
  if (f->biasGrad)
    call(cuda::reduce_sum, f->biasGrad->attrs,
         {partnerValue(f->biasGrad->inputs[0])}, {biasGrad}, a.ctx);
  if (f->accumulate)
    call(cuda::grad_accumulate, f->accumulate->attrs, {a.out[0]}, {dw}, a.ctx);
  return true;
}

std::string cuda::fusionSummary(Backend &b) {
  const FusionTable &t = static_cast<CudaBackend &>(b).fusions();
  std::ostringstream os;
  os << "linear+gelu " << t.linearGelu << ", bgrad " << t.biasGrad
     << ", accumulate " << t.accumulate << ", adam " << t.adamGroups << " ("
     << t.adamGrouped << " instrs), sgd " << t.sgdGroups << " ("
     << t.sgdGrouped << " instrs), linear+add " << t.linearAdd
     << ", norm_grad+add " << t.normGradAdd << ", matmul+gelu_grad "
     << t.dgradGelu;
  return os.str();
}
