//===- plan_loader_fuzz.cpp - fuzz the plan loader, verifier and executor -===//
//
//   mapp-fuzz-plan [--time S] [--iters N] [--seed X] [--no-exec] [--strict]
//                  [--artifact-prefix P] [--watchdog S] [-q] SEED...
//   mapp-fuzz-plan --repro FILE...
//
// SEED: .mplan files or directories of them (compiler output, runtime test
// plans); the built-in MLP test plans are always added. Each iteration
// mutates one input in one of three ways and runs mapp::rt::parsePlan
// (FlatBuffers Verifier + PlanVerify + KernelSpecs) on it:
//   * bytes: flips, inserts, deletes, splices, truncation, of the sealed file
//     (stopped by the seal's checksum) or of the body, re-sealed (mostly
//     stopped by the identifier check and the FlatBuffers Verifier);
//   * fields: interesting integers/floats written at the offsets of real
//     FlatBuffers fields, vector lengths, vtable entries and uoffsets of a
//     valid plan (found by walking the tables), so the buffer stays
//     well-formed and the semantic checks are reached;
//   * structure: the decoded plan is edited (kernel names, operand indices,
//     shapes, dtypes, kinds, attrs, tasks, sizes...) and re-serialized.
// A plan that verifies is then executed for one or two steps on the CPU
// backend with random tokens (the loader promises that no verified plan can
// make a kernel touch memory outside its operands), within a size budget.
//
// Failures: crashes, sanitizer reports, watchdog timeouts (the input is
// written to P crash-<pid> / timeout-<pid>), and with --strict any exception
// that is not mapp::rt::Error. Everything else -- a clean Error -- is the
// expected result and only counted.
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"
#include "PlanMutate.h"

#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/plan_generated.h"

#ifdef MAPP_FUZZ_HAVE_TEST_PLANS
#include "TestPlans.h"
#endif

#include <cmath>

using namespace mappfuzz;
using namespace mapp::rt;
namespace fb = mapp::plan;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-plan [--time S] [--iters N] [--seed X] [--no-exec]\n"
    "                      [--strict] [--artifact-prefix P] [--watchdog S]\n"
    "                      [-q] SEED.mplan|DIR...\n"
    "       mapp-fuzz-plan --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;

// ---- Plan -> FlatBuffers (the inverse of PlanLoader.cpp) -------------------

Bytes serialize(const Plan &p) {
  flatbuffers::FlatBufferBuilder b(1024);
  std::vector<flatbuffers::Offset<fb::Program>> progs;
  for (const Program &pr : p.programs) {
    std::vector<flatbuffers::Offset<fb::Value>> vals;
    for (const Value &v : pr.values) {
      auto name = b.CreateString(v.name);
      auto shape = b.CreateVector(v.type.shape);
      fb::ValueBuilder vb(b);
      vb.add_name(name);
      vb.add_kind(static_cast<fb::ValueKind>(v.kind));
      vb.add_dtype(static_cast<fb::DType>(v.type.dtype));
      vb.add_shape(shape);
      vb.add_offset(v.offset);
      vb.add_bytes(v.bytes);
      vb.add_param(v.param);
      vals.push_back(vb.Finish());
    }
    std::vector<flatbuffers::Offset<fb::Block>> blks;
    for (const Block &blk : pr.blocks) {
      std::vector<flatbuffers::Offset<fb::Instr>> ins;
      for (const Instr &in : blk.instrs) {
        std::vector<flatbuffers::Offset<fb::Attr>> attrs;
        for (const auto &[key, a] : in.attrs.all()) {
          auto k = b.CreateString(key);
          flatbuffers::Offset<flatbuffers::String> s;
          flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
          flatbuffers::Offset<flatbuffers::Vector<double>> floats;
          if (a.kind == AttrValue::Str)
            s = b.CreateString(a.s);
          if (a.kind == AttrValue::Ints)
            ints = b.CreateVector(a.ints);
          if (a.kind == AttrValue::Floats)
            floats = b.CreateVector(a.floats);
          fb::AttrBuilder ab(b);
          ab.add_key(k);
          ab.add_kind(static_cast<fb::AttrKind>(a.kind));
          ab.add_i(a.i);
          ab.add_f(a.f);
          if (!s.IsNull())
            ab.add_s(s);
          if (!ints.IsNull())
            ab.add_ints(ints);
          if (!floats.IsNull())
            ab.add_floats(floats);
          attrs.push_back(ab.Finish());
        }
        auto kernel = b.CreateString(in.kernel);
        auto inputs = b.CreateVector(in.inputs);
        auto outputs = b.CreateVector(in.outputs);
        auto av = b.CreateVector(attrs);
        auto name = b.CreateString(in.name);
        fb::InstrBuilder ib(b);
        ib.add_kernel(kernel);
        ib.add_inputs(inputs);
        ib.add_outputs(outputs);
        ib.add_attrs(av);
        ib.add_name(name);
        ib.add_layer(in.layer);
        ins.push_back(ib.Finish());
      }
      auto iv = b.CreateVector(ins);
      fb::BlockBuilder bb(b);
      bb.add_kind(static_cast<fb::BlockKind>(blk.kind));
      bb.add_chunk(blk.chunk);
      bb.add_instrs(iv);
      blks.push_back(bb.Finish());
    }
    std::vector<fb::Task> tasks;
    for (const Task &t : pr.tasks)
      tasks.emplace_back(t.block, t.microbatch);
    auto vv = b.CreateVector(vals);
    auto bv = b.CreateVector(blks);
    auto tv = b.CreateVectorOfStructs(tasks);
    fb::ProgramBuilder pb(b);
    pb.add_rank(pr.rank);
    pb.add_dp(pr.dp);
    pb.add_pp(pr.pp);
    pb.add_tp(pr.tp);
    pb.add_values(vv);
    pb.add_blocks(bv);
    pb.add_tasks(tv);
    pb.add_arena_bytes(pr.arenaBytes);
    pb.add_persistent_bytes(pr.persistentBytes);
    pb.add_slots(pr.slots);
    pb.add_tokens(pr.tokens);
    pb.add_targets(pr.targets);
    pb.add_loss(pr.loss);
    pb.add_peak_bytes(pr.peakBytes);
    progs.push_back(pb.Finish());
  }
  auto sched = b.CreateString(p.schedule);
  auto opt = b.CreateString(p.optimizer);
  auto pv = b.CreateVector(progs);
  fb::PlanBuilder plb(b);
  plb.add_version(p.version);
  plb.add_world_size(p.worldSize);
  plb.add_tp(p.tp);
  plb.add_pp(p.pp);
  plb.add_dp(p.dp);
  plb.add_chunks(p.chunks);
  plb.add_micro_batch_size(p.microBatchSize);
  plb.add_num_microbatches(p.numMicrobatches);
  plb.add_seq_length(p.seqLength);
  plb.add_vocab_size(p.vocabSize);
  plb.add_schedule(sched);
  plb.add_optimizer(opt);
  plb.add_max_grad_norm(p.maxGradNorm);
  plb.add_programs(pv);
  b.Finish(plb.Finish(), fb::PlanIdentifier());
  return sealPlan(b.GetBufferPointer(), b.GetSize());
}

// ---- the seal (plan.fbs PlanSeal) ------------------------------------------
// Mutating a sealed file only tests the checksum; to reach the FlatBuffers
// Verifier and the semantic checks, most mutations edit the body and re-seal
// it, as a buggy compiler would.

Bytes bodyOf(const Bytes &file) {
  uint32_t magic = 0;
  if (file.size() >= kPlanSealBytes)
    std::memcpy(&magic, file.data() + file.size() - kPlanSealBytes, 4);
  if (magic != static_cast<uint32_t>(fb::SealMagic::MPSL))
    return file;
  return Bytes(file.begin(), file.end() - kPlanSealBytes);
}

Bytes sealed(const Bytes &body) { return sealPlan(body.data(), body.size()); }

// ---- field sites of a valid buffer -----------------------------------------

struct Site {
  uint32_t at;
  uint8_t width; // bytes available at `at`
};

struct Sites {
  const uint8_t *base;
  std::vector<Site> v;
  void add(const void *p, size_t width) {
    if (!p)
      return;
    v.push_back({static_cast<uint32_t>(static_cast<const uint8_t *>(p) - base),
                 static_cast<uint8_t>(std::min<size_t>(width, 8))});
  }
  /// The table's soffset, its vtable entries and every present field; a
  /// field's width is the gap to the next field (capped at 8).
  // Generated tables inherit flatbuffers::Table privately; the object's
  // address is the table's address.
  void table(const void *obj) {
    if (!obj)
      return;
    auto t = reinterpret_cast<const flatbuffers::Table *>(obj);
    const uint8_t *tp = reinterpret_cast<const uint8_t *>(t);
    add(tp, 4);
    const uint8_t *vt = t->GetVTable();
    uint16_t vsize = flatbuffers::ReadScalar<uint16_t>(vt);
    uint16_t tsize = flatbuffers::ReadScalar<uint16_t>(vt + 2);
    add(vt, 2);
    add(vt + 2, 2);
    std::vector<uint16_t> offs;
    for (uint16_t i = 4; i + 1 < vsize; i += 2) {
      add(vt + i, 2);
      if (uint16_t fo = flatbuffers::ReadScalar<uint16_t>(vt + i))
        offs.push_back(fo);
    }
    std::sort(offs.begin(), offs.end());
    for (size_t i = 0; i < offs.size(); ++i) {
      size_t end = i + 1 < offs.size() ? offs[i + 1] : tsize;
      if (end > offs[i])
        add(tp + offs[i], end - offs[i]);
    }
  }
  template <typename T> void vec(const flatbuffers::Vector<T> *v, size_t elem) {
    if (!v)
      return;
    add(v->Data() - 4, 4); // length
    for (size_t i = 0; i < v->size() && i < 64; ++i)
      add(v->Data() + i * elem, elem);
  }
  void str(const flatbuffers::String *s) {
    if (!s)
      return;
    add(s->Data() - 4, 4);
    for (size_t i = 0; i < s->size(); ++i)
      add(s->Data() + i, 1);
  }
};

std::vector<Site> findSites(const Bytes &buf) {
  Sites s{buf.data(), {}};
  s.add(buf.data(), 4); // root uoffset
  const fb::Plan *p = fb::GetPlan(buf.data());
  s.table(p);
  s.str(p->schedule());
  if (auto progs = p->programs()) {
    s.vec(progs, 4);
    for (const fb::Program *pr : *progs) {
      s.table(pr);
      if (auto vals = pr->values()) {
        s.vec(vals, 4);
        for (const fb::Value *v : *vals) {
          s.table(v);
          s.vec(v->shape(), 8);
        }
      }
      if (auto blks = pr->blocks()) {
        s.vec(blks, 4);
        for (const fb::Block *bl : *blks) {
          s.table(bl);
          if (auto ins = bl->instrs()) {
            s.vec(ins, 4);
            for (const fb::Instr *in : *ins) {
              s.table(in);
              s.str(in->kernel());
              s.vec(in->inputs(), 4);
              s.vec(in->outputs(), 4);
              if (auto attrs = in->attrs()) {
                s.vec(attrs, 4);
                for (const fb::Attr *a : *attrs) {
                  s.table(a);
                  s.str(a->key());
                  s.vec(a->ints(), 8);
                  s.vec(a->floats(), 8);
                }
              }
            }
          }
        }
      }
      if (auto tasks = pr->tasks()) {
        s.add(reinterpret_cast<const uint8_t *>(tasks->Data()) - 4, 4);
        for (size_t i = 0; i < tasks->size() && i < 64; ++i) {
          s.add(reinterpret_cast<const uint8_t *>(tasks->Get(i)), 4);
          s.add(reinterpret_cast<const uint8_t *>(tasks->Get(i)) + 4, 4);
        }
      }
    }
  }
  return s.v;
}

void tweakField(Rng &r, Bytes &b, const std::vector<Site> &sites) {
  int n = 1 + static_cast<int>(r.below(3));
  for (int k = 0; k < n && !sites.empty(); ++k) {
    Site s = r.pick(sites);
    if (s.at + s.width > b.size())
      continue;
    size_t w = s.width >= 8 ? (r.chance(60) ? 8 : 4) : s.width >= 4 ? 4
               : s.width >= 2                                       ? 2
                                                                    : 1;
    uint8_t *p = &b[s.at];
    switch (r.below(4)) {
    case 0:
    case 1: {
      int64_t v = interestingInt(r);
      std::memcpy(p, &v, w);
      break;
    }
    case 2: { // small delta
      int64_t v = 0;
      std::memcpy(&v, p, w);
      v += static_cast<int64_t>(r.below(9)) - 4;
      std::memcpy(p, &v, w);
      break;
    }
    case 3:
      if (w == 8) {
        double d = interestingFloat(r);
        std::memcpy(p, &d, 8);
      } else {
        uint64_t v = r.next();
        std::memcpy(p, &v, w);
      }
      break;
    }
  }
}

// ---- running an input ------------------------------------------------------

struct Runner {
  std::unique_ptr<Backend> backend = createCpuBackend(1);
  std::unique_ptr<Communicator> comm = createComm("local");
  uint64_t executed = 0, stepsRun = 0;

  /// Rough work estimate, to keep one execution well under the watchdog.
  static bool withinBudget(const Plan &plan) {
    if (plan.worldSize != 1)
      return true; // the Executor refuses it before allocating
    // The Executor runs the last program of rank 0.
    const Program *pp = nullptr;
    for (const Program &q : plan.programs)
      if (q.rank == 0)
        pp = &q;
    if (!pp)
      return true;
    const Program &p = *pp;
    uint64_t mem = p.persistentBytes + p.arenaBytes * uint64_t(p.slots);
    if (mem > (uint64_t(64) << 20))
      return false;
    double work = 0;
    size_t instrs = 0;
    for (const Block &b : p.blocks)
      for (const Instr &in : b.instrs) {
        ++instrs;
        double w = 0;
        for (int v : in.outputs)
          w += static_cast<double>(p.values[v].type.numel());
        double inner = 1;
        if ((in.kernel == "linear" || in.kernel == "matmul") &&
            !in.inputs.empty())
          inner = static_cast<double>(
              std::max<int64_t>(1, p.values[in.inputs[0]].type.shape.empty()
                                       ? 1
                                       : p.values[in.inputs[0]].type.dim(-1)));
        if (in.kernel.rfind("attention", 0) == 0 && !in.inputs.empty() &&
            p.values[in.inputs[0]].type.rank() >= 2)
          inner = static_cast<double>(p.values[in.inputs[0]].type.dim(1));
        for (int v : in.inputs)
          w += static_cast<double>(p.values[v].type.numel());
        work += w * inner;
      }
    size_t tasks = p.tasks.empty()
                       ? p.blocks.size() * size_t(plan.numMicrobatches)
                       : p.tasks.size();
    return instrs < 20000 && tasks < 20000 &&
           work * static_cast<double>(std::max<size_t>(1, tasks)) /
                   std::max<size_t>(1, p.blocks.size()) <
               4e8;
  }

  void execute(Rng &r, const Plan &plan) {
    Executor ex(plan, *backend, *comm);
    ++executed;
    if (r.chance(10)) {
      // Initial weights from a safetensors round trip of the plan's own.
      Safetensors st = ex.saveParams();
      ex.loadParams(st, "fuzz");
    } else
      ex.initParams(r.next());
    int vocab = plan.vocabSize;
    bool badIds = r.chance(5);
    uint64_t dataSeed = r.next();
    Executor::BatchFn batches = [&](int64_t step, int mb, int32_t *tok,
                                    int32_t *tgt) {
      Rng d(dataSeed + static_cast<uint64_t>(step) * 977 + mb);
      size_t n = size_t(plan.microBatchSize) * size_t(plan.seqLength);
      for (size_t i = 0; i < n; ++i) {
        tok[i] = static_cast<int32_t>(d.below(static_cast<uint64_t>(vocab)));
        tgt[i] = static_cast<int32_t>(d.below(static_cast<uint64_t>(vocab)));
      }
      if (badIds && n)
        (d.chance(50) ? tok : tgt)[d.below(n)] =
            d.chance(50) ? vocab : -1 - static_cast<int32_t>(d.below(5));
    };
    int steps = 1 + static_cast<int>(r.below(2));
    for (int s = 0; s < steps; ++s) {
      ex.step(batches, [&](const Executor &e) {
        if (r.chance(10))
          (void)e.saveGrads();
      });
      ++stepsRun;
    }
  }
};

struct Entry {
  Bytes data;
  bool valid = false; // decodes and verifies
  std::vector<Site> sites;
  Plan plan;
};

/// Aligned copy: FlatBuffers reads scalars in place (as loadPlan does).
Plan parseAligned(const Bytes &b) {
  std::vector<uint64_t> aligned((b.size() + 7) / 8 + 1);
  if (!b.empty())
    std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()),
                   b.size());
}

} // namespace

int main(int argc, char **argv) {
  Options o = parseCommon(argc, argv, kUsage);
  installCrashHandlers(o.artifactPrefix);

  std::vector<Bytes> seeds;
  for (const std::string &in : o.inputs)
    if (!addSeedPath(in, seeds)) {
      std::fprintf(stderr, "mapp-fuzz-plan: cannot read '%s'\n", in.c_str());
      return 2;
    }

  Runner runner;
  Rng rng(o.seed);
  Outcomes outcomes;
  uint64_t contract = 0; // non-Error exceptions

  // One input through loader (+ executor). Returns the outcome message.
  auto runOne = [&](const Bytes &b, Plan *decoded, bool *ok) -> std::string {
    setCurrentInput(b);
    alarm(o.watchdog);
    std::string msg;
    *ok = false;
    try {
      Plan plan = parseAligned(b);
      *ok = true;
      msg = "ok";
      if (o.exec && Runner::withinBudget(plan)) {
        try {
          runner.execute(rng, plan);
          msg = "ok: executed";
        } catch (const Error &e) {
          msg = std::string("exec: ") + e.what();
        }
      } else if (o.exec)
        msg = "ok: over the execution budget";
      if (decoded)
        *decoded = std::move(plan);
    } catch (const Error &e) {
      msg = e.what();
    } catch (const std::exception &e) {
      ++contract;
      msg = std::string("NON-ERROR EXCEPTION: ") + e.what();
      std::fprintf(stderr, "mapp-fuzz-plan: %s\n", msg.c_str());
      if (o.strict) {
        writeArtifact(crashState().crashPath);
        std::exit(1);
      }
    }
    alarm(0);
    return msg;
  };

  if (o.repro) {
    for (size_t i = 0; i < seeds.size(); ++i) {
      bool ok;
      std::printf("%s: %s\n", o.inputs.size() == seeds.size()
                                  ? o.inputs[i].c_str()
                                  : "input",
                  runOne(seeds[i], nullptr, &ok).c_str());
    }
    return 0;
  }

#ifdef MAPP_FUZZ_HAVE_TEST_PLANS
  for (const char *opt : {"sgd", "adamw"})
    for (int mbs : {1, 2}) {
      test::MlpOptions m;
      m.optimizer = opt;
      m.microbatches = mbs;
      m.maxGradNorm = mbs == 2 ? 1.0 : 0.0;
      m.schedule = mbs == 2 ? "cosine" : "constant";
      seeds.push_back(test::mlpPlan(m).build());
    }
#endif
  if (seeds.empty()) {
    std::fprintf(stderr, "mapp-fuzz-plan: no seeds\n%s", kUsage);
    return 2;
  }

  std::vector<Entry> corpus;
  std::vector<Bytes> allBytes;
  size_t validSeeds = 0;
  for (Bytes &s : seeds) {
    Entry e;
    e.data = s;
    bool ok;
    std::string msg = runOne(s, &e.plan, &ok);
    outcomes.add(signature(msg), msg);
    e.valid = ok;
    if (ok) {
      ++validSeeds;
      e.sites = findSites(s);
    } else if (!o.quiet)
      std::fprintf(stderr, "mapp-fuzz-plan: note: seed %zu does not load: %s\n",
                   corpus.size(), msg.c_str());
    allBytes.push_back(s);
    corpus.push_back(std::move(e));
  }
  if (!validSeeds) {
    std::fprintf(stderr, "mapp-fuzz-plan: no seed loads; structured mutations "
                         "need at least one valid plan\n");
    return 2;
  }
  std::vector<size_t> validIdx;
  for (size_t i = 0; i < corpus.size(); ++i)
    if (corpus[i].valid)
      validIdx.push_back(i);

  std::printf("mapp-fuzz-plan: %zu seeds (%zu valid), seed %llu, %s build, "
              "%s%.0f s\n",
              corpus.size(), validSeeds,
              static_cast<unsigned long long>(o.seed),
              sanitized() ? "ASan+UBSan" : "unsanitized",
              o.iters ? "iteration-bounded, " : "", o.seconds);
  std::fflush(stdout);

  Clock clock;
  uint64_t iters = 0, accepted = 0, added = 0;
  uint64_t byKind[3] = {0, 0, 0};
  double lastReport = 0;
  Bytes cur;
  while (true) {
    if (o.iters ? iters >= o.iters : clock.seconds() >= o.seconds)
      break;
    ++iters;
    int kind = static_cast<int>(rng.below(10));
    kind = kind < 3 ? 0 : kind < 6 ? 1 : 2;
    ++byKind[kind];
    if (kind == 0) { // bytes: of the file (the seal) or of the body
      cur = rng.pick(corpus).data;
      if (rng.chance(30))
        mutateBytes(rng, cur, allBytes, kMaxLen);
      else {
        cur = bodyOf(cur);
        mutateBytes(rng, cur, allBytes, kMaxLen);
        cur = sealed(cur);
      }
    } else if (kind == 1) { // fields of a valid plan
      const Entry &e = corpus[rng.pick(validIdx)];
      cur = bodyOf(e.data);
      tweakField(rng, cur, e.sites);
      if (rng.chance(10))
        mutateBytes(rng, cur, allBytes, kMaxLen);
      cur = sealed(cur);
    } else { // structure
      Plan p = corpus[rng.pick(validIdx)].plan;
      mutatePlan(rng, p);
      cur = serialize(p);
    }
    bool ok;
    Plan decoded;
    std::string msg = runOne(cur, &decoded, &ok);
    accepted += ok;
    if (outcomes.add(signature(msg), msg) && corpus.size() < 4000) {
      Entry e;
      e.data = cur;
      e.valid = ok;
      if (ok) {
        e.plan = std::move(decoded);
        e.sites = findSites(cur);
        validIdx.push_back(corpus.size());
      }
      allBytes.push_back(cur);
      corpus.push_back(std::move(e));
      ++added;
    }
    double t = clock.seconds();
    if (!o.quiet && t - lastReport >= 30) {
      lastReport = t;
      std::printf("  %6.0f s  %10llu iters  %8.0f/s  accepted %llu  executed "
                  "%llu  outcomes %zu  corpus %zu\n",
                  t, static_cast<unsigned long long>(iters), iters / t,
                  static_cast<unsigned long long>(accepted),
                  static_cast<unsigned long long>(runner.executed),
                  outcomes.seen.size(), corpus.size());
      std::fflush(stdout);
    }
  }
  double t = clock.seconds();
  std::printf("mapp-fuzz-plan: done: %llu iterations in %.1f s (%.0f/s; bytes "
              "%llu, fields %llu, structure %llu); %llu verified, %llu "
              "executed (%llu steps); %zu distinct outcomes; corpus %zu (+%llu); "
              "%llu non-Error exceptions; no crash\n",
              static_cast<unsigned long long>(iters), t, iters / t,
              static_cast<unsigned long long>(byKind[0]),
              static_cast<unsigned long long>(byKind[1]),
              static_cast<unsigned long long>(byKind[2]),
              static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(runner.executed),
              static_cast<unsigned long long>(runner.stepsRun),
              outcomes.seen.size(), corpus.size(),
              static_cast<unsigned long long>(added),
              static_cast<unsigned long long>(contract));
  if (!o.quiet) {
    std::printf("most frequent outcomes:\n");
    outcomes.print(stdout, 25);
  }
  return contract && o.strict ? 1 : 0;
}
