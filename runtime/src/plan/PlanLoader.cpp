//===- PlanLoader.cpp - FlatBuffers artifact -> Plan ----------------------===//
//
// Order matters: the seal (PlanSeal.cpp) proves the bytes are the ones the
// compiler wrote, the identifier is checked on raw bytes, then the
// FlatBuffers Verifier proves every offset is inside the buffer, and only then
// are fields read. Semantic checks follow in PlanVerify.cpp.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/rt/plan_generated.h"

#include <cstring>

using namespace mapp::rt;
namespace fb = mapp::plan;

namespace {

// FlatBuffers 2.0's Verifier checks a vector's alignment only to 4 bytes, so
// in a corrupt file the elements of a [long]/[double] vector may sit at an
// address that is not a multiple of 8 (reading them through typed pointers is
// undefined behaviour; found by mapp-fuzz-plan under UBSan). Copy the bytes.
static_assert(FLATBUFFERS_LITTLEENDIAN, "plans are little-endian");
template <typename T, typename V>
std::vector<T> toVec(const flatbuffers::Vector<V> *v) {
  std::vector<T> out;
  if (!v || v->size() == 0)
    return out;
  std::vector<V> raw(v->size());
  std::memcpy(raw.data(), v->Data(), raw.size() * sizeof(V));
  out.assign(raw.begin(), raw.end());
  return out;
}

std::string str(const flatbuffers::String *s) {
  return s ? s->str() : std::string();
}

Attrs decodeAttrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>> *v,
                  const std::string &where) {
  Attrs attrs;
  if (!v)
    return attrs;
  for (const fb::Attr *a : *v) {
    AttrValue val;
    switch (a->kind()) {
    case fb::AttrKind::Int:
      val.kind = AttrValue::Int;
      val.i = a->i();
      break;
    case fb::AttrKind::Float:
      val.kind = AttrValue::Float;
      val.f = a->f();
      break;
    case fb::AttrKind::Str:
      val.kind = AttrValue::Str;
      val.s = str(a->s());
      break;
    case fb::AttrKind::Ints:
      val.kind = AttrValue::Ints;
      val.ints = toVec<int64_t>(a->ints());
      break;
    case fb::AttrKind::Floats:
      val.kind = AttrValue::Floats;
      val.floats = toVec<double>(a->floats());
      break;
    default:
      fail("plan: ", where, ": attribute '", a->key()->str(),
           "' has unknown kind ", static_cast<int>(a->kind()));
    }
    attrs.set(a->key()->str(), std::move(val));
  }
  return attrs;
}

Program decodeProgram(const fb::Program &p, int index) {
  Program prog;
  prog.rank = p.rank();
  prog.dp = p.dp();
  prog.pp = p.pp();
  prog.tp = p.tp();
  prog.arenaBytes = p.arena_bytes();
  prog.persistentBytes = p.persistent_bytes();
  prog.slots = p.slots();
  prog.tokens = p.tokens();
  prog.targets = p.targets();
  prog.loss = p.loss();
  prog.peakBytes = p.peak_bytes();
  if (p.values())
    for (const fb::Value *v : *p.values()) {
      Value val;
      val.name = str(v->name());
      val.kind = static_cast<ValueKind>(v->kind());
      val.type.dtype = static_cast<DType>(v->dtype());
      val.type.shape = toVec<int64_t>(v->shape());
      val.offset = v->offset();
      val.bytes = v->bytes();
      val.param = v->param();
      val.shardDim = v->shard_dim();
      val.shardGroup = str(v->shard_group());
      val.shardBlocks = v->shard_blocks();
      val.storedBf16 = v->storage_bf16();
      prog.values.push_back(std::move(val));
    }
  if (p.blocks())
    for (unsigned b = 0; b < p.blocks()->size(); ++b) {
      const fb::Block *blk = p.blocks()->Get(b);
      Block block;
      block.kind = static_cast<BlockKind>(blk->kind());
      block.chunk = blk->chunk();
      if (blk->instrs())
        for (unsigned i = 0; i < blk->instrs()->size(); ++i) {
          const fb::Instr *in = blk->instrs()->Get(i);
          Instr instr;
          instr.kernel = in->kernel()->str();
          instr.inputs = toVec<int>(in->inputs());
          instr.outputs = toVec<int>(in->outputs());
          instr.attrs =
              decodeAttrs(in->attrs(), "program " + std::to_string(index) +
                                           " instr " + std::to_string(i) +
                                           " in block " + std::to_string(b));
          instr.name = str(in->name());
          instr.layer = in->layer();
          block.instrs.push_back(std::move(instr));
        }
      prog.blocks.push_back(std::move(block));
    }
  if (p.tasks())
    for (const fb::Task *t : *p.tasks())
      prog.tasks.push_back({t->block(), t->microbatch()});
  if (p.schedule_tables())
    for (const fb::ScheduleTable *st : *p.schedule_tables()) {
      ScheduleTable table;
      table.name = str(st->name());
      if (st->tasks())
        for (const fb::Task *t : *st->tasks())
          table.tasks.push_back({t->block(), t->microbatch()});
      prog.scheduleTables.push_back(std::move(table));
    }
  prog.stashBytes = p.stash_bytes();
  if (const fb::Placement *pl = p.placement()) {
    prog.placement.backend = str(pl->backend());
    prog.placement.device = pl->device();
    prog.placement.role = str(pl->role());
    prog.placement.peerRank = pl->peer_rank();
    prog.placement.tp = pl->tp();
  }
  return prog;
}

} // namespace

Plan mapp::rt::parsePlan(const uint8_t *data, size_t fileSize) {
  uint32_t checksum = 0;
  size_t size = checkPlanSeal(data, fileSize, checksum);
  if (!flatbuffers::BufferHasIdentifier(data, fb::PlanIdentifier()))
    fail("plan: not a mapp plan (file identifier is not \"MPLN\")");
  // Generous table limit: a large model has many instrs, each a few tables.
  flatbuffers::Verifier verifier(data, size, /*max_depth=*/64,
                                 /*max_tables=*/100000000);
  if (!fb::VerifyPlanBuffer(verifier))
    fail("plan: corrupt or truncated plan (FlatBuffers verification failed)");
  const fb::Plan *p = fb::GetPlan(data);
  if (p->version() != kPlanSchemaVersion)
    fail("plan: corrupt plan: the body says schema version ", p->version(),
         " but its seal says ", kPlanSchemaVersion);

  Plan plan;
  plan.version = p->version();
  plan.checksum = checksum;
  plan.worldSize = p->world_size();
  plan.tp = p->tp();
  plan.pp = p->pp();
  plan.dp = p->dp();
  plan.ep = p->ep();
  plan.cp = p->cp();
  plan.chunks = p->chunks();
  plan.microBatchSize = p->micro_batch_size();
  plan.numMicrobatches = p->num_microbatches();
  plan.seqLength = p->seq_length();
  plan.vocabSize = p->vocab_size();
  plan.schedule = str(p->schedule());
  plan.optimizer = str(p->optimizer());
  plan.maxGradNorm = p->max_grad_norm();
  plan.traceEvery = p->trace_every();
  plan.traceWindow = p->trace_window();
  if (const fb::AdaptivePolicy *a = p->adaptive()) {
    plan.adaptive.memCapBytes = a->mem_cap_bytes();
    plan.adaptive.slowLinkRatio = a->slow_link_ratio();
    plan.adaptive.bandwidthSmoothing = a->bandwidth_smoothing();
  }
  if (p->programs())
    for (unsigned i = 0; i < p->programs()->size(); ++i)
      plan.programs.push_back(decodeProgram(*p->programs()->Get(i), i));
  verifyPlan(plan);
  return plan;
}

Plan mapp::rt::loadPlan(const std::string &path) {
  std::vector<char> bytes;
  std::string why;
  bool notRegular = false;
  if (!readRegularFile(path, bytes, why, &notRegular))
    fail("plan: ", openFailure("", path, why, notRegular));
  try {
    // Copy into an aligned buffer: FlatBuffers reads scalars in place.
    std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
    return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()),
                     bytes.size());
  } catch (const Error &e) {
    fail(path, ": ", e.what());
  }
}
