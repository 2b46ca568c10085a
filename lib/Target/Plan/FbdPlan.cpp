// MegaFBD lowering: the forward side's programs of a split module and the
// placement of every program (docs/megafbd.md, "Ranks").
#include "FbdPlan.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/rt/KernelVocab.h"

using namespace mlir;
using namespace mapp;
namespace fb = mapp::plan;

namespace {

struct Sides {
  int64_t t1 = 1, t2 = 1, dp = 1, pp = 1, nb = 0, nf = 0;
  std::string fwdBackend, bwdBackend;
  int64_t fwdIndex = 0, bwdIndex = 0;
  int64_t bwdRank(int64_t s, int64_t d, int64_t t) const {
    return s * t2 * dp + d * t2 + t;
  }
  int64_t fwdRank(int64_t s, int64_t d, int64_t t) const {
    return nb + s * t1 * dp + d * t1 + t;
  }
};

const fb::AttrT *findAttr(const fb::InstrT &in, StringRef key) {
  for (auto &a : in.attrs)
    if (a->key == key)
      return a.get();
  return nullptr;
}

void eraseAttrs(fb::InstrT &in, std::initializer_list<StringRef> keys) {
  llvm::erase_if(in.attrs, [&](const std::unique_ptr<fb::AttrT> &a) {
    return llvm::is_contained(keys, StringRef(a->key));
  });
}

void setPeer(fb::InstrT &in, int64_t peer) {
  for (auto &a : in.attrs)
    if (a->key == "peer")
      a->i = peer;
}

/// Cross transfers of a backward program: from the forward tp index its
/// fbd_src lists for this rank (a resharded activation), else from the
/// forward rank j mod t1.
void resolveBackward(const Sides &s, fb::ProgramT &p) {
  int64_t src = s.fwdRank(p.pp, p.dp, p.tp % s.t1);
  for (auto &blk : p.blocks)
    for (auto &in : blk->instrs)
      if (findAttr(*in, "fbd_cross")) {
        const fb::AttrT *from = findAttr(*in, "fbd_src");
        setPeer(*in, from && p.tp < int64_t(from->ints.size())
                         ? s.fwdRank(p.pp, p.dp, from->ints[p.tp])
                         : src);
        eraseAttrs(*in, {"fbd_cross", "fbd_q", "fbd_src"});
      }
  p.placement = std::make_unique<fb::PlacementT>();
  p.placement->backend = s.bwdBackend;
  p.placement->device = s.bwdIndex;
  p.placement->role = "bwd";
  p.placement->peer_rank = src;
  p.placement->tp = s.t2;
}

/// Forward rank j sends to backward ranks j + q·t1 < t2; its pipeline
/// transfers go to forward ranks (the builder resolved them without the
/// backward side's offset).
void resolveForward(const Sides &s, fb::ProgramT &p) {
  for (auto &blk : p.blocks) {
    std::vector<std::unique_ptr<fb::InstrT>> kept;
    for (auto &in : blk->instrs) {
      bool p2p = in->kernel == MAPP_KERNEL_NAME(send) ||
                 in->kernel == MAPP_KERNEL_NAME(recv);
      if (const fb::AttrT *from = findAttr(*in, "fbd_from")) {
        // A piece of a resharded activation: only forward tp index
        // fbd_from slices and sends it, to backward tp index fbd_to.
        if (from->i != p.tp)
          continue;
        if (const fb::AttrT *to = findAttr(*in, "fbd_to"))
          setPeer(*in, s.bwdRank(p.pp, p.dp, to->i));
        eraseAttrs(*in, {"fbd_cross", "fbd_from", "fbd_to"});
      } else if (const fb::AttrT *q = findAttr(*in, "fbd_q")) {
        int64_t t = p.tp + q->i * s.t1;
        if (t >= s.t2)
          continue;
        setPeer(*in, s.bwdRank(p.pp, p.dp, t));
        eraseAttrs(*in, {"fbd_cross", "fbd_q"});
      } else if (p2p) {
        if (const fb::AttrT *peer = findAttr(*in, "peer"))
          setPeer(*in, peer->i + s.nb);
      }
      kept.push_back(std::move(in));
    }
    blk->instrs = std::move(kept);
  }
  p.placement = std::make_unique<fb::PlacementT>();
  p.placement->backend = s.fwdBackend;
  p.placement->device = s.fwdIndex;
  p.placement->role = "fwd";
  p.placement->peer_rank = s.bwdRank(p.pp, p.dp, p.tp % s.t2);
  p.placement->tp = s.t1;
}

} // namespace

LogicalResult mapp::addFbdPrograms(ModuleOp module, fb::PlanT &plan,
                                   bool aliasReshapes) {
  auto dict = module->getAttrOfType<DictionaryAttr>("mapp.fbd");
  auto num = [&](StringRef k) -> int64_t {
    auto a = dict ? dict.getAs<IntegerAttr>(k) : IntegerAttr();
    return a ? a.getInt() : -1;
  };
  auto str = [&](StringRef k) -> std::string {
    auto a = dict ? dict.getAs<StringAttr>(k) : StringAttr();
    return a ? a.str() : "";
  };
  Sides s;
  s.t1 = num("fwd_tp");
  s.t2 = num("bwd_tp");
  s.nb = num("bwd_ranks");
  s.nf = num("fwd_ranks");
  s.fwdIndex = num("fwd_index");
  s.bwdIndex = num("bwd_index");
  s.fwdBackend = str("fwd_device");
  s.bwdBackend = str("bwd_device");
  s.dp = plan.dp;
  s.pp = plan.pp;
  if (s.t1 < 1 || s.t2 != plan.tp || s.nb != plan.world_size ||
      s.nf != s.t1 * s.dp * s.pp || s.fwdIndex < 0 || s.bwdIndex < 0 ||
      s.fwdBackend.empty() || s.bwdBackend.empty())
    return module.emitError("plan: mapp.fbd does not match the module's "
                            "layout (run --mapp-split-fwd-bwd to make it)");
  for (auto &p : plan.programs)
    resolveBackward(s, *p);

  SmallVector<SubgraphOp> fwds(s.pp);
  for (SubgraphOp sg : module.getOps<SubgraphOp>())
    if (sg.getPhase() == "forward") {
      int64_t st = sg.getStageAttr().getInt();
      if (st >= s.pp || fwds[st])
        return sg.emitError("plan: forward subgraph of stage ")
               << st << " is out of range or repeated";
      fwds[st] = sg;
    }
  for (int64_t st = 0; st < s.pp; ++st) {
    if (!fwds[st] || fwds[st].getBody().front().empty())
      return module.emitError("plan: stage ")
             << st << " has no forward subgraph";
    auto inner = dyn_cast<ModuleOp>(fwds[st].getBody().front().front());
    if (!inner)
      return fwds[st].emitError("plan: a forward subgraph holds a module");
    FailureOr<StepStructure> step = StepStructure::analyze(inner);
    if (failed(step))
      return failure();
    FailureOr<StageMemory> mem =
        planStageMemory(inner, *step, st, aliasReshapes);
    if (failed(mem))
      return failure();
    for (int64_t d = 0; d < s.dp; ++d)
      for (int64_t t = 0; t < s.t1; ++t) {
        auto prog = std::make_unique<fb::ProgramT>();
        prog->rank = s.fwdRank(st, d, t);
        prog->tp = t;
        prog->dp = d;
        prog->pp = st;
        if (failed(buildStageProgram(inner, *step, *mem, *prog)))
          return failure();
        resolveForward(s, *prog);
        plan.programs.push_back(std::move(prog));
      }
  }
  plan.world_size = s.nb + s.nf;
  return success();
}
