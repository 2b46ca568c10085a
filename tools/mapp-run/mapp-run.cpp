//===- mapp-run.cpp - execute a training plan
//------------------------------===//
//
// Thin main over the runtime library: parse flags, load the plan, wire the
// data loader, weights and metrics into the executor, run N steps. Flags are
// documented in runtime/README.md and by --help.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Fbd.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Faults.h"
#include "mapp/rt/Generate.h"
#include "mapp/rt/Metrics.h"
#include "mapp/rt/Patch.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/Tokenizer.h"
#include "mapp/trace/TraceWriter.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::rt;

namespace {

const char *kUsage = R"(usage: mapp-run PLAN.mplan [flags]

  --backend=cpu|cuda         kernel backend (default cpu; cuda when built with it)
  --comm=local|mpi|nccl       local: every rank of the plan as a thread of this
                             process (default; with --backend=cuda all ranks
                             share GPU 0 and collectives stay on the device);
                             mpi: this process is one rank
                             (mpirun -np WORLD mapp-run PLAN --comm=mpi ...);
                             nccl: rank threads, rank r on GPU r (--backend=cuda)
  --comm-timeout S           fail a wait for another rank after S seconds
                             (default 300; 0 = never)
  --coordinator=on|off       MegaFBD plans: match the step-end parameter
                             transfers through the bit-vector coordinator
                             (default on; docs/megafbd.md)
  --trace-dir DIR            MegaScan trace: DIR/rank-{r}.trace.jsonl per rank
  --trace-sample E:W         trace steps with step % E < W (E = 0: every step),
                             overriding the plan's trace_every:trace_window
  --inject SPEC              fault injection, repeatable:
                               slow-compute:rank=R,factor=F
                               link-delay:src=A,dst=B,us=U
                               link-bandwidth:src=A,dst=B,gbps=G
                             each with optional ,from-step=K,to-step=L
                             (active in steps K <= step < L); a link fault
                             delays the transfer, not the sender
  --schedule static|adaptive MegaDPP task scheduler (default: adaptive for
                             plans compiled with schedule=adaptive, else
                             static = the plan's table in order)
  --mem-cap BYTES            adaptive: cap on in-flight activation stash per
                             rank (suffix K, M, G allowed; default the plan's
                             mem_cap_bytes, else none on CPU / free device
                             memory on CUDA)
  --data FILE                corpus: .jsonl ("text" field), .txt, or a Megatron
                             indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx)
  --data-format F            auto|jsonl|text|megatron (default auto: by extension,
                             or PREFIX with PREFIX.idx = megatron)
  --tokenizer T              bytes | gpt2:VOCAB.json,MERGES.txt (jsonl/text data)
  --steps N                  training steps (default 1)
  --seed S                   parameter init and data shuffle seed (default 0)
  --no-shuffle               visit samples in corpus order
  --weights FILE             initial parameters (safetensors, by name);
                             a NaN/inf value is an error naming the tensor
  --allow-nonfinite-weights  load --weights holding NaN/inf anyway
  --save FILE                write parameters after the last step (safetensors)
  --save-grads FILE          write step 0's accumulated gradients (safetensors)
  --save-dir DIR             whole-state checkpoints (parameters, optimizer
                             state, step, data position): DIR/step-NNNNNNNN/,
                             one shard per rank + manifest.json; written after
                             the last step, and on SIGTERM/SIGINT (the run
                             finishes the step, saves, exits 0)
  --save-every N             also every N steps
  --save-interval-s S        also when S seconds passed since the last save
  --save-keep K              keep the newest K checkpoints (default 3; 0 = all)
  --resume DIR               continue from a checkpoint (DIR itself or the
                             newest in a --save-dir); --steps counts the whole
                             run; another tp/pp/dp layout reshards
  --nan-check                check every op's outputs every step (slow); a
                             non-finite loss or gradient norm always stops the
                             run and re-runs that step so to name the op
  --inject-nan STEP:OP       testing: op OP (IR name) writes a NaN at step STEP
  --metrics FILE             one JSON object per step (jsonl)
  --dump-batches FILE        write every microbatch's tokens/targets (jsonl)
  --threads K                CPU worker threads per rank (default: the cores
                             divided by the ranks this process or, under
                             mpirun, this host runs)
  --probe-db FILE            MegaScope: record the plan's probes, step metrics
                             and generated tokens in a SQLite store
  --probe-control FILE|PORT  MegaScope: take perturbation switch changes from a
                             JSON file or a loopback TCP port (0 = any free)
  --probe-control-token-file FILE
                             MegaScope: where the control port's token is
                             written (mode 0600; default PROBE_DB.control-token)
  --probe-run NAME           MegaScope: run name (ranks of one job share it)
  --generate                 generate text instead of training
  --prompt TEXT              generation prompt (default: the EOT token)
  --max-new-tokens N         tokens to generate (default 32)
  --temperature T            sampling temperature (default 1)
  --top-k K                  sample among the K most likely tokens (0 = all)
  --greedy                   always take the most likely token
  --no-kv-cache              generation: run the full forward per token (a
                             sliding window) instead of prefill + KV-cache
                             decode steps
  --generate-out FILE        one JSON object per generated token (jsonl)
  --patch SPEC               activation patching: into=A.txt,from=B.txt,
                             site=resid|attn|mlp|PATH,layer=L,pos=P,target=TOK:
                             A's last-position logit of TOK with and without
                             B's site activation at (L, P); one JSON line
  --quiet                    no progress output
  --help                     this text
)";

struct Options {
  std::string coordinator = "on"; // MegaFBD step-end transfers (on | off)
  std::string plan, backend = "cpu", comm = "local", data, dataFormat = "auto",
                    tokenizer, weights, save, saveGrads, metrics, dumpBatches,
                    traceDir, probeDb, probeControl, probeControlTokenFile,
                    probeRun, prompt, patch,
                    generateOut, traceSample, injectNan, schedule, memCap;
  bool generate = false, greedy = false, promptGiven = false, kvCache = true;
  int64_t maxNewTokens = 32, topK = 0;
  double temperature = 1.0;
  std::vector<Injection> inject;
  std::pair<int, int> traceSampling{-1, -1}; // --trace-sample, parsed
  double commTimeout = 300;
  int64_t steps = 1;
  uint64_t seed = 0;
  int threads = 0;
  bool shuffle = true, quiet = false, nanCheck = false,
       allowNonfiniteWeights = false;
  int64_t nanStep = -1; // --inject-nan STEP:OP
  std::string nanOp;
  CheckpointPolicy ckpt;
};

constexpr int64_t kMaxThreads = 1024;

[[noreturn]] void usageError(const std::string &msg) {
  std::cerr << "mapp-run: " << msg << "\n(run mapp-run --help for the flags)\n";
  std::exit(2);
}

int64_t parseInt(const std::string &flag, const std::string &v, int64_t lo,
                 int64_t hi = INT64_MAX) {
  try {
    size_t pos;
    long long x = std::stoll(v, &pos);
    if (pos != v.size() || x < lo || x > hi)
      throw std::invalid_argument(v);
    return x;
  } catch (const std::exception &) {
    usageError(flag + " needs an integer " +
               (hi == INT64_MAX ? ">= " + std::to_string(lo)
                                : "in [" + std::to_string(lo) + ", " +
                                      std::to_string(hi) + "]") +
               ", got '" + v + "'");
  }
}

/// --trace-sample E:W -> {E, W}.
std::pair<int, int> parseTraceSample(const std::string &v) {
  size_t colon = v.find(':');
  if (colon == std::string::npos)
    usageError("--trace-sample needs EVERY:WINDOW (e.g. 2:1), got '" + v + "'");
  int every = static_cast<int>(
      parseInt("--trace-sample EVERY", v.substr(0, colon), 0, 1 << 30));
  int window = static_cast<int>(
      parseInt("--trace-sample WINDOW", v.substr(colon + 1), 0, 1 << 30));
  return {every, window};
}

Options parseArgs(int argc, char **argv) {
  Options o;
  std::map<std::string, std::string *> strings = {
      {"--backend", &o.backend},     {"--comm", &o.comm},
      {"--data", &o.data},           {"--data-format", &o.dataFormat},
      {"--tokenizer", &o.tokenizer}, {"--weights", &o.weights},
      {"--save", &o.save},           {"--save-grads", &o.saveGrads},
      {"--metrics", &o.metrics},     {"--dump-batches", &o.dumpBatches},
      {"--trace-dir", &o.traceDir},   {"--probe-db", &o.probeDb},
      {"--probe-control", &o.probeControl}, {"--probe-run", &o.probeRun},
      {"--probe-control-token-file", &o.probeControlTokenFile},
      {"--generate-out", &o.generateOut}, {"--trace-sample", &o.traceSample},
      {"--save-dir", &o.ckpt.saveDir},     {"--resume", &o.ckpt.resume},
      {"--inject-nan", &o.injectNan},
      {"--coordinator", &o.coordinator}, {"--patch", &o.patch},
      {"--schedule", &o.schedule}, {"--mem-cap", &o.memCap}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage << "\nbuilt with communicators: local"
                << (haveMpiComm() ? ", mpi" : "")
                << (haveNcclComm() ? ", nccl" : "") << "\n";
      std::exit(0);
    }
    if (a == "--no-shuffle") {
      o.shuffle = false;
      continue;
    }
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a == "--nan-check") {
      o.nanCheck = true;
      continue;
    }
    if (a == "--allow-nonfinite-weights") {
      o.allowNonfiniteWeights = true;
      continue;
    }
    if (a == "--no-kv-cache") {
      o.kvCache = false;
      continue;
    }
    if (a == "--generate" || a == "--greedy") {
      (a == "--generate" ? o.generate : o.greedy) = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      if (!o.plan.empty())
        usageError("unexpected argument '" + a + "' (plan already given)");
      o.plan = a;
      continue;
    }
    std::string flag = a, value;
    size_t eq = a.find('=');
    bool inlineValue = eq != std::string::npos;
    if (inlineValue) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    bool known = strings.count(flag) || flag == "--steps" || flag == "--seed" ||
                 flag == "--threads" || flag == "--inject" ||
                 flag == "--comm-timeout" || flag == "--prompt" ||
                 flag == "--max-new-tokens" || flag == "--temperature" ||
                 flag == "--top-k" || flag == "--save-every" ||
                 flag == "--save-interval-s" || flag == "--save-keep";
    if (!known)
      usageError("unknown flag '" + flag + "'");
    if (!inlineValue) {
      if (i + 1 >= argc)
        usageError(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "--prompt") {
      o.prompt = value;
      o.promptGiven = true;
      continue;
    }
    if (value.empty())
      usageError(flag + " needs a non-empty value");
    if (strings.count(flag))
      *strings[flag] = value;
    else if (flag == "--steps")
      o.steps = parseInt(flag, value, 1);
    else if (flag == "--seed")
      o.seed = static_cast<uint64_t>(parseInt(flag, value, 0));
    else if (flag == "--comm-timeout")
      o.commTimeout = static_cast<double>(parseInt(flag, value, 0));
    else if (flag == "--inject") {
      try {
        o.inject.push_back(parseInjection(value));
      } catch (const Error &e) {
        usageError(e.what());
      }
    }
    else if (flag == "--save-every")
      o.ckpt.every = parseInt(flag, value, 1);
    else if (flag == "--save-interval-s")
      o.ckpt.intervalS = static_cast<double>(parseInt(flag, value, 1));
    else if (flag == "--save-keep")
      o.ckpt.keep = static_cast<int>(parseInt(flag, value, 0, 1 << 20));
    else if (flag == "--max-new-tokens")
      o.maxNewTokens = parseInt(flag, value, 0);
    else if (flag == "--top-k")
      o.topK = parseInt(flag, value, 0);
    else if (flag == "--temperature") {
      try {
        size_t pos;
        o.temperature = std::stod(value, &pos);
        if (pos != value.size() || !(o.temperature >= 0))
          throw std::invalid_argument(value);
      } catch (const std::exception &) {
        usageError("--temperature needs a number >= 0, got '" + value + "'");
      }
    }
    else // 0 = all cores; the cap keeps a typo from spawning 10^5 threads
      o.threads = static_cast<int>(parseInt(flag, value, 0, kMaxThreads));
  }
  if (o.plan.empty())
    usageError("no plan given");
  if (!o.generate && (o.promptGiven || !o.generateOut.empty() || !o.kvCache))
    usageError("--prompt, --generate-out and --no-kv-cache need --generate");
  if (!o.patch.empty() && o.generate)
    usageError("--patch and --generate are different modes; give one");
  if (o.promptGiven && o.prompt.empty())
    usageError("--prompt is empty (leave it out to start from the EOT token)");
  if (o.comm != "local" && o.comm != "mpi" && o.comm != "nccl")
    usageError("--comm must be local, mpi or nccl, got '" + o.comm + "'");
  if (o.comm == "nccl" && o.backend != "cuda")
    usageError("--comm=nccl needs --backend=cuda (NCCL moves device memory)");
  if (!o.injectNan.empty()) {
    size_t colon = o.injectNan.find(':');
    if (colon == std::string::npos || colon + 1 == o.injectNan.size())
      usageError("--inject-nan needs STEP:OP, got '" + o.injectNan + "'");
    o.nanStep = parseInt("--inject-nan STEP", o.injectNan.substr(0, colon), 0);
    o.nanOp = o.injectNan.substr(colon + 1);
  }
  if ((o.ckpt.every || o.ckpt.intervalS) && o.ckpt.saveDir.empty())
    usageError("--save-every and --save-interval-s need --save-dir");
  if (!o.ckpt.resume.empty() && !o.weights.empty())
    usageError("--resume and --weights both set the parameters; give one");
  if (o.generate && (!o.ckpt.resume.empty() || !o.ckpt.saveDir.empty()))
    usageError("--resume and --save-dir are for training, not --generate");
  if (!o.traceSample.empty()) {
    if (o.traceDir.empty())
      usageError("--trace-sample needs --trace-dir");
    o.traceSampling = parseTraceSample(o.traceSample);
  }
  return o;
}

/// Writes one line per microbatch: {"step", "microbatch", "dp_rank",
/// "tokens": [[...] x mbs], "targets": [[...] x mbs]}.
class BatchDump {
public:
  explicit BatchDump(const std::string &path) : out_(path) {
    if (!out_)
      fail("cannot write '", path, "'");
  }
  void write(int64_t step, int mb, int dpRank, int mbs, int t,
             const int32_t *tok, const int32_t *tgt) {
    auto rows = [&](const int32_t *p) {
      nlohmann::json r = nlohmann::json::array();
      for (int b = 0; b < mbs; ++b)
        r.push_back(std::vector<int32_t>(p + b * t, p + (b + 1) * t));
      return r;
    };
    nlohmann::json j = {{"step", step},
                        {"microbatch", mb},
                        {"dp_rank", dpRank},
                        {"tokens", rows(tok)},
                        {"targets", rows(tgt)}};
    out_ << j.dump() << "\n";
  }

private:
  std::ofstream out_;
};

/// std::ifstream opens a directory without complaint on Linux and reading it
/// then fails (a stray exception) or yields nothing (an empty merges list
/// was silently accepted), so reject directories by name up front.
void rejectDirectory(const std::string &path, const char *what) {
  struct stat st;
  if (!path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail(what, ": '", path, "' is a directory, not a file");
}

/// --weights, refusing NaN/inf unless --allow-nonfinite-weights: a NaN
/// parameter trains to NaN without a word about where it came from.
Safetensors readWeights(const Options &o) {
  Safetensors st = readSafetensors(o.weights);
  if (!o.allowNonfiniteWeights)
    checkFinite(st, "--weights " + o.weights);
  return st;
}

/// Every output path is checked before the work starts, so that an
/// unwritable --save is not found after the last step. A file may exist
/// (it is not touched here) but must be a writable regular file; a new
/// one needs a writable directory. A directory output is created.
void checkOutputFile(const std::string &path, const char *flag) {
  if (path.empty())
    return;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      fail(flag, ": '", path, "' is a directory, not a file");
    if (::access(path.c_str(), W_OK) != 0)
      fail(flag, ": cannot write '", path, "' (", std::strerror(errno), ")");
    return;
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "."
                    : slash == 0               ? "/"
                                               : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(flag, ": cannot create '", path, "': directory '", dir,
         "' does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(flag, ": cannot create '", path, "' in '", dir, "' (",
         std::strerror(errno), ")");
}

void checkOutputDir(const std::string &path, const char *flag) {
  if (path.empty())
    return;
  std::string prefix;
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0 &&
        errno != EEXIST)
      fail(flag, ": cannot create directory '", prefix, "' (",
           std::strerror(errno), ")");
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(flag, ": '", path, "' is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    fail(flag, ": cannot write in '", path, "' (", std::strerror(errno), ")");
}

void checkOutputs(const Options &o) {
  checkOutputFile(o.save, "--save");
  checkOutputFile(o.saveGrads, "--save-grads");
  checkOutputFile(o.metrics, "--metrics");
  checkOutputFile(o.dumpBatches, "--dump-batches");
  checkOutputFile(o.generateOut, "--generate-out");
  checkOutputFile(o.probeDb, "--probe-db");
  checkOutputDir(o.traceDir, "--trace-dir");
}

/// --generate: weights, tokenizer, then the sampling loop (Generate.h).
int runGenerate(const Options &o, Executor &exec, ProbeSession *scope) {
  if (o.weights.empty())
    fail("--generate needs --weights FILE (trained parameters)");
  exec.loadParams(readWeights(o), o.weights);
  std::unique_ptr<Tokenizer> tok =
      createTokenizer(o.tokenizer.empty() ? "bytes" : o.tokenizer);
  GenerateOptions g;
  g.prompt = o.prompt;
  g.maxNewTokens = o.maxNewTokens;
  g.temperature = o.temperature;
  g.topK = o.topK;
  g.greedy = o.greedy;
  g.seed = o.seed;
  g.kvCache = o.kvCache;
  std::unique_ptr<std::ofstream> out;
  if (!o.generateOut.empty()) {
    out = std::make_unique<std::ofstream>(o.generateOut);
    if (!*out)
      fail("cannot write '", o.generateOut, "'");
  }
  std::vector<GeneratedToken> toks = generate(exec, *tok, g, scope, out.get());
  std::vector<int32_t> ids;
  for (const GeneratedToken &t : toks)
    ids.push_back(t.token);
  if (!o.quiet)
    std::cout << o.prompt << tok->decode(ids) << "\n";
  if (scope)
    scope->flush();
  return 0;
}

/// --mem-cap: bytes with an optional K/M/G (binary) suffix; "" = 0.
uint64_t parseBytes(const std::string &flag, const std::string &v) {
  if (v.empty())
    return 0;
  uint64_t mul = 1;
  std::string num = v;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mul = last == 'K' ? 1ull << 10 : last == 'M' ? 1ull << 20 : 1ull << 30;
    num = v.substr(0, v.size() - 1);
  }
  return static_cast<uint64_t>(parseInt(flag, num, 1)) * mul;
}

/// MegaDPP: each rank names its policy switches on stderr (the first 20 of
/// the run; all of them are instant events in the trace).
void reportSwitches(Executor &exec, int rank, bool quiet) {
  static std::atomic<int> shown{0};
  for (const SchedSwitch &s : exec.takeSchedSwitches()) {
    if (quiet || shown.fetch_add(1) >= 20 * exec.plan().worldSize)
      continue;
    std::fprintf(stderr, "mapp-run: rank %d step %lld: scheduler %s -> %s (%s)\n",
                 rank, static_cast<long long>(s.step), s.from.c_str(),
                 s.to.c_str(), s.reason.c_str());
  }
}

/// One line per rank at the end of an adaptive run or of a static pipeline
/// run (tests and bench/dpp read it); nothing for one-stage plans.
void reportScheduler(Executor &exec, int rank) {
  SchedStats st = exec.schedStats();
  if (st.mode != "adaptive" && (!st.stashBytes || exec.plan().pp == 1))
    return;
  std::fprintf(stderr,
               "mapp-run: rank %d scheduler %s: peak stash %llu bytes "
               "(cap %llu, stash %llu per chunk), %lld switches, %lld "
               "decisions, policy now %s\n",
               rank, st.mode.c_str(),
               static_cast<unsigned long long>(st.peakStashBytes),
               static_cast<unsigned long long>(st.capBytes),
               static_cast<unsigned long long>(st.stashBytes),
               static_cast<long long>(st.switches),
               static_cast<long long>(st.decisions), st.policy.c_str());
}

/// What every rank of this process shares: the plan, the token stream
/// (read once), rank 0's outputs.
struct Shared {
  const Options &o;
  const Plan &plan;
  std::vector<int32_t> tokens;
  bool haveTokens = false;
  int threadsPerRank = 0;
  /// Trace run identity: one per job (docs/trace-format.md).
  std::string runId = mapp::newRunId();
};

/// Every MPI rank drew its own run id; rank 0's wins. 64 bits as four 16-bit
/// pieces summed in doubles (exact), the other ranks adding zeros.
void shareRunId(Communicator &comm, std::string &runId) {
  uint64_t own = std::stoull(runId, nullptr, 16);
  double parts[4] = {0, 0, 0, 0};
  if (comm.rank() == 0)
    for (int i = 0; i < 4; ++i)
      parts[i] = static_cast<double>((own >> (16 * i)) & 0xffff);
  CommGroup world{"world", {}};
  for (int r = 0; r < comm.worldSize(); ++r)
    world.members.push_back(r);
  comm.allReduce(parts, 4, ReduceOp::Sum, world);
  uint64_t id = 0;
  for (int i = 0; i < 4; ++i)
    id |= static_cast<uint64_t>(parts[i]) << (16 * i);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  runId = buf;
}

std::vector<int32_t> readTokens(const Options &o) {
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer.empty())
    tok = createTokenizer(o.tokenizer);
  return loadTokens(o.data, o.dataFormat, tok.get());
}

/// One rank's whole run: executor, data, steps, outputs (rank 0 prints and
/// writes metrics, batch dumps and checkpoints).
void runRank(Shared &sh, std::unique_ptr<Communicator> commIn) {
  const Options &o = sh.o;
  const Plan &plan = sh.plan;
  commIn->setTimeout(o.commTimeout);
  std::unique_ptr<Communicator> comm =
      withLinkFaults(std::move(commIn), o.inject);
  const int rank = comm->rank();
  // MegaFBD: the plan's placement picks this rank's backend and device.
  std::string backendName = o.backend;
  int device = comm->deviceOrdinal();
  for (const Program &p : plan.programs)
    if (p.rank == rank) {
      backendName = placedBackend(p, o.backend);
      device = placedDevice(p, device);
    }
  std::unique_ptr<Backend> backend;
  try {
    backend = createBackend(backendName, sh.threadsPerRank, device);
  } catch (const Error &e) {
    if (!isFbdPlan(plan))
      throw;
    fail("placement of rank ", rank, " on ", backendName, ":", device, ": ",
         e.what());
  }
  Executor exec(plan, *backend, *comm);
  exec.setCoordinator(o.coordinator == "on");
  if (!o.schedule.empty() || !o.memCap.empty()) {
    SchedOptions so;
    so.mode = o.schedule;
    so.memCapBytes = parseBytes("--mem-cap", o.memCap);
    exec.setScheduler(so);
  }
  const Program &prog = exec.program();

  // MegaScope: probe store and live switches, when asked for (every rank
  // reports into the same store).
  std::unique_ptr<ProbeSession> scope;
  if (!o.probeDb.empty() || !o.probeControl.empty()) {
    ProbeSessionOptions so;
    so.db = o.probeDb;
    so.control = o.probeControl;
    so.controlTokenFile = o.probeControlTokenFile;
    so.runName = o.probeRun;
    so.plan = o.plan;
    so.mode = o.generate ? "generate" : "train";
    nlohmann::json extra = {{"steps", o.steps}, {"prompt", o.prompt}};
    so.extraMeta = extra.dump(-1, ' ', false,
                              nlohmann::json::error_handler_t::replace);
    scope = std::make_unique<ProbeSession>(exec, so);
    if (!o.generate && o.patch.empty() && !o.tokenizer.empty())
      scope->recordVocabulary(*createTokenizer(o.tokenizer)); // UI labels
    if (!scope->controlEndpoint().empty() && !o.quiet)
      std::cerr << "mapp-run: probe control at " << scope->controlEndpoint()
                << (scope->controlTokenFile().empty()
                        ? std::string()
                        : " (token in " + scope->controlTokenFile() + ")")
                << "\n";
  }
  if (!o.patch.empty()) {
    PatchOptions po = parsePatchSpec(o.patch);
    if (o.weights.empty())
      fail("--patch needs --weights FILE (trained parameters)");
    exec.loadParams(readSafetensors(o.weights), o.weights);
    std::unique_ptr<Tokenizer> tok =
        createTokenizer(o.tokenizer.empty() ? "bytes" : o.tokenizer);
    PatchResult r = runPatch(exec, *tok, po);
    nlohmann::json j = {{"value", r.value},
                        {"layer", po.layer},
                        {"pos", po.pos},
                        {"target", r.target},
                        {"position", r.lastA},
                        {"clean_logit", r.cleanLogit},
                        {"patched_logit", r.patchedLogit},
                        {"source_logit", r.sourceLogit},
                        {"delta", r.patchedLogit - r.cleanLogit}};
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << "\n";
    if (scope)
      scope->flush();
    return;
  }
  if (o.generate) {
    if (plan.worldSize != 1)
      fail("--generate runs single-rank plans (this plan has world_size ",
           plan.worldSize, ")");
    runGenerate(o, exec, scope.get());
    return;
  }

  // Data: needed when this rank's program consumes tokens or targets.
  std::unique_ptr<BatchLoader> loader;
  bool needsData = prog.tokens >= 0 || prog.targets >= 0;
  if (needsData && o.steps > 0) {
    if (o.data.empty())
      fail("the plan reads tokens; give --data FILE");
    loader = std::make_unique<BatchLoader>(
        sh.haveTokens ? sh.tokens : readTokens(o), plan.seqLength, o.seed,
        o.shuffle);
    if (loader->maxToken() >= plan.vocabSize)
      fail("data: token id ", loader->maxToken(),
           " is outside the plan's vocab_size ", plan.vocabSize,
           " (wrong --tokenizer?)");
  }

  if (!o.weights.empty())
    exec.loadParams(readWeights(o), o.weights);
  else
    exec.initParams(o.seed);

  std::unique_ptr<mapp::MappTraceWriter> trace;
  if (!o.traceDir.empty()) {
    mapp::TraceHeader h;
    h.rank = rank;
    h.world = plan.worldSize;
    h.dp = prog.dp;
    h.pp = prog.pp;
    h.tp = prog.tp;
    h.dpSize = plan.dp;
    h.ppSize = plan.pp;
    h.tpSize = plan.tp;
    h.device = o.backend == "cuda" ? "cuda:0" : o.backend;
    h.runId = sh.runId;
    char planHash[16];
    std::snprintf(planHash, sizeof planHash, "0x%08x", plan.checksum);
    h.plan = planHash;
    // The ring holds two steps of events: with CUDA timestamps a step's
    // events arrive together after the step (runtime/README.md, "Tracing").
    size_t capacity = size_t(1) << 16;
    while (capacity < 2 * exec.traceEventsPerStep() && capacity < (size_t(1) << 22))
      capacity <<= 1;
    std::string err;
    trace = mapp::MappTraceWriter::open(o.traceDir, h, &err, capacity);
    if (!trace)
      fail("--trace-dir: ", err);
    exec.setTraceWriter(trace.get());
    if (o.traceSampling.first >= 0)
      exec.setTraceSampling(o.traceSampling.first, o.traceSampling.second);
  }
  // Detaches the writer (appending what the executor still holds) before
  // the writer closes, also when a step throws.
  struct DetachTrace {
    Executor &exec;
    ~DetachTrace() { exec.setTraceWriter(nullptr); }
  } detachTrace{exec};

  const bool lead = rank == 0;
  std::unique_ptr<MetricsWriter> metrics;
  if (lead && !o.metrics.empty())
    metrics = std::make_unique<MetricsWriter>(o.metrics);
  std::unique_ptr<BatchDump> dump;
  if (lead && !o.dumpBatches.empty())
    dump = std::make_unique<BatchDump>(o.dumpBatches);

  // Rank 0 (dp 0, pp 0, tp 0) dumps the microbatches of every dp rank: the
  // split is a pure function of (step, dp rank, microbatch).
  int dpRank = prog.dp;
  std::vector<int32_t> otherTok, otherTgt;
  Executor::BatchFn batches = [&](int64_t step, int mb, int32_t *tok,
                                  int32_t *tgt) {
    loader->microbatch(step, dpRank, plan.dp, plan.numMicrobatches, mb,
                       plan.microBatchSize, tok, tgt);
    if (scope && mb == 0) // the UI's token axes (TokenRecord.cpp)
      scope->recordContext(step, false, tok, plan.seqLength);
    if (!dump)
      return;
    dump->write(step, mb, dpRank, plan.microBatchSize, plan.seqLength, tok,
                tgt);
    size_t n = static_cast<size_t>(plan.microBatchSize) * plan.seqLength;
    otherTok.resize(n);
    otherTgt.resize(n);
    for (int d = 0; d < plan.dp; ++d)
      if (d != dpRank) {
        loader->microbatch(step, d, plan.dp, plan.numMicrobatches, mb,
                           plan.microBatchSize, otherTok.data(),
                           otherTgt.data());
        dump->write(step, mb, d, plan.microBatchSize, plan.seqLength,
                    otherTok.data(), otherTgt.data());
      }
  };
  Executor::GradHook gradHook = [&](Executor &e) {
    if (o.saveGrads.empty() || e.stepsDone() != 0)
      return;
    Safetensors g = plan.worldSize > 1 ? e.gatherParams(true) : e.saveGrads();
    if (lead)
      writeSafetensors(o.saveGrads, g);
  };

  CheckpointMeta meta{o.seed, o.shuffle, loader ? loader->numTokens() : -1};
  TrainControl control(exec, o.ckpt, meta);
  const int64_t first = control.start();
  exec.setSkipNonFinite(true); // a non-finite step never touches the state
  exec.setCheckFinite(o.nanCheck);
  if (o.nanStep >= 0)
    exec.setInjectNan(o.nanStep, o.nanOp);
  Progress progress(o.steps, lead && isatty(STDOUT_FILENO) != 0,
                    o.quiet || !lead);
  for (int64_t s = first; s < o.steps; ++s) {
    if (scope)
      scope->beginStep(s);
    exec.setSlowCompute(slowComputeFactor(o.inject, rank, s));
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = exec.step(loader ? batches : Executor::BatchFn(), gradHook);
    if (r.overflow) {
      if (lead && !o.quiet)
        std::fprintf(stderr,
                     "mapp-run: step %lld: gradient overflow at loss scale %g: "
                     "skipped, scale now %g\n",
                     static_cast<long long>(r.step), r.lossScale,
                     exec.lossScaleState().scale);
    } else if (!stepFinite(r)) {
      failNonFinite(exec, r, loader ? batches : Executor::BatchFn());
    }
    reportSwitches(exec, rank, o.quiet);
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    StepMetrics m;
    m.step = r.step;
    m.loss = r.globalLoss;
    m.lr = r.lr;
    m.gradNorm = r.gradNorm;
    m.tokens = r.globalTokens;
    m.stepMs = ms;
    m.tokensPerS = ms > 0 ? r.globalTokens / (ms / 1000.0) : 0;
    m.lossScale = r.lossScale;
    m.skipped = r.skipped;
    if (scope)
      scope->endStep(m);
    if (lead) {
      if (metrics)
        metrics->write(m);
      progress.update(m);
    }
    if (control.afterStep(s + 1 == o.steps)) {
      if (lead && !o.quiet)
        std::fprintf(stderr, "mapp-run: stop signal: saved step %lld, exiting\n",
                     static_cast<long long>(exec.stepsDone()));
      break;
    }
  }
  progress.finish();
  reportScheduler(exec, rank);
  // One line even with --quiet: bench/gpu/summary.py reads it.
  if (lead && exec.backend().peakDeviceGiB() > 0)
    std::fprintf(stderr, "mapp-run: peak device memory %.2f GiB\n",
                 exec.backend().peakDeviceGiB());
  if (scope)
    scope->flush();
  if (!o.save.empty()) {
    Safetensors st = plan.worldSize > 1 ? exec.gatherParams() : exec.saveParams();
    if (lead) {
      std::string bad = firstNonFiniteTensor(st);
      if (!bad.empty())
        fail("--save: refusing to write '", o.save, "': parameter '", bad,
             "' holds non-finite values");
      writeSafetensors(o.save, st);
    }
  }
  comm->flush();
  exec.setTraceWriter(nullptr);
  if (trace)
    trace->close();
}

void printCoords(const Plan &plan, int rank, int threads) {
  Layout l{plan.tp, plan.dp, plan.pp};
  if (rank >= l.world()) { // MegaFBD forward side: see the placement table
    std::printf("mapp-run: rank %d = forward side of world %d, %d CPU "
                "thread(s)\n", rank, plan.worldSize, threads);
    return;
  }
  std::printf("mapp-run: rank %d = (dp %d, pp %d, tp %d) of world %d "
              "(tp %d, dp %d, pp %d), %d CPU thread(s)\n",
              rank, l.dpOf(rank), l.ppOf(rank), l.tpOf(rank), plan.worldSize,
              plan.tp, plan.dp, plan.pp, threads);
}

int hardwareThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

int run(const Options &o) {
  checkOutputs(o);
  rejectDirectory(o.plan, "plan");
  rejectDirectory(o.data, "data");
  rejectDirectory(o.weights, "weights");
  if (o.tokenizer.rfind("gpt2:", 0) == 0) {
    std::string files = o.tokenizer.substr(5);
    size_t comma = files.find(',');
    rejectDirectory(files.substr(0, comma), "tokenizer vocab");
    if (comma != std::string::npos)
      rejectDirectory(files.substr(comma + 1), "tokenizer merges");
  }
  Plan plan = loadPlan(o.plan);
  if (!o.ckpt.saveDir.empty())
    installStopSignals();
  for (const Injection &i : o.inject) {
    int r = i.kind == Injection::SlowCompute ? i.rank : std::max(i.src, i.dst);
    if (r >= plan.worldSize)
      fail("--inject: rank ", r, " is outside the plan's world of ",
           plan.worldSize);
  }
  Shared sh{o, plan, {}, false, o.threads};
  if (o.coordinator != "on" && o.coordinator != "off")
    usageError("--coordinator must be on or off, got '" + o.coordinator + "'");
  if (isFbdPlan(plan)) {
    checkPlacements(plan, o.backend);
    if (o.comm == "nccl") // NCCL puts rank r on GPU r; placements decide here
      fail("MegaFBD plans run over --comm=local or --comm=mpi, not nccl");
    // Rank threads of one process share device pointers (the CUDA backend
    // moves payloads itself): a CPU rank cannot read them.
    bool cpu = false, cuda = false;
    for (const Program &p : plan.programs)
      (placedBackend(p, o.backend) == "cuda" ? cuda : cpu) = true;
    const char *cudaComm = std::getenv("MAPP_CUDA_COMM");
    bool hostStaged = cudaComm && std::string(cudaComm) == "host";
    if (cpu && cuda && o.comm != "mpi" && !(o.comm == "local" && hostStaged))
      fail("the plan places ranks on both cpu and cuda: run them as "
           "processes, mpirun -np ", plan.worldSize,
           " mapp-run PLAN --comm=mpi, or as threads with MAPP_CUDA_COMM=host "
           "--comm=local (CUDA ranks then stage their transfers through host "
           "memory)");
    if (!o.quiet)
      std::printf("mapp-run: placement (MegaFBD, %d ranks)\n%s",
                  plan.worldSize, placementTable(plan, o.backend).c_str());
  }

  if (o.comm == "mpi") {
    std::unique_ptr<Communicator> comm = createMpiComm();
    int rank = comm->rank();
    if (comm->worldSize() != plan.worldSize) {
      // Every rank sees this alike: rank 0 says it, all leave cleanly.
      if (rank == 0)
        std::cerr << "mapp-run: plan is for world_size " +
                         std::to_string(plan.worldSize) + " but mpirun started " +
                         std::to_string(comm->worldSize()) +
                         " process(es) (use mpirun -np " +
                         std::to_string(plan.worldSize) +
                         (isFbdPlan(plan)
                              ? "; a split plan: " +
                                    std::to_string(plan.tp * plan.dp * plan.pp) +
                                    " backward + " +
                                    std::to_string(plan.worldSize -
                                                   plan.tp * plan.dp * plan.pp) +
                                    " forward ranks"
                              : std::string()) +
                         ")\n";
      comm.reset();
      mpiFinalize();
      return 1;
    }
    // Processes that share a host share its cores: as many threads each as
    // leaves one per core, the same split as one process's rank threads.
    if (!sh.threadsPerRank)
      sh.threadsPerRank =
          std::max(1, hardwareThreads() / comm->ranksOnThisHost());
    try {
      if (!o.quiet)
        printCoords(plan, rank, sh.threadsPerRank), std::fflush(stdout);
      if (!o.traceDir.empty())
        shareRunId(*comm, sh.runId);
      runRank(sh, std::move(comm));
    } catch (const std::exception &e) {
      // One write, so ranks' messages do not interleave mid-line.
      std::string msg = "mapp-run: rank " + std::to_string(rank) + ": " +
                        e.what() + "\n";
      std::fwrite(msg.data(), 1, msg.size(), stderr);
      std::fflush(stderr);
      mpiAbort(1);
      return 1;
    }
    mpiFinalize();
    return 0;
  }

  if (plan.worldSize == 1 && o.comm == "local") {
    runRank(sh, createLocalComm());
    return 0;
  }

  // --comm=local with several ranks, or nccl: one thread per rank.
  int n = plan.worldSize;
  if (!sh.threadsPerRank)
    sh.threadsPerRank = std::max(1, hardwareThreads() / n);
  if (!o.data.empty() && o.steps > 0) {
    sh.tokens = readTokens(o);
    sh.haveTokens = true;
  }
  if (!o.quiet)
    for (int r = 0; r < n; ++r)
      printCoords(plan, r, sh.threadsPerRank);
  // NCCL_NVLS_ENABLE=0 unless set: NVLink SHARP multicast is not usable on
  // the lent machines and a failed probe for it costs a hang at init.
  if (o.comm == "nccl")
    setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::unique_ptr<LocalWorld> world =
      o.comm == "nccl" ? createNcclWorld(n) : createLocalWorld(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(world->connect(r));
  std::mutex errMu;
  std::vector<std::string> errors(n);
  int firstFailed = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        runRank(sh, std::move(comms[r]));
      } catch (const std::exception &e) {
        {
          std::lock_guard<std::mutex> lk(errMu);
          errors[r] = e.what();
          if (firstFailed < 0)
            firstFailed = r;
        }
        world->abort(r, e.what());
      } catch (...) {
        std::lock_guard<std::mutex> lk(errMu);
        errors[r] = "unknown error";
        if (firstFailed < 0)
          firstFailed = r;
        world->abort(r, "unknown error");
      }
    });
  for (std::thread &t : threads)
    t.join();
  if (firstFailed < 0)
    return 0;
  // The root cause first; the others' "rank R failed" follow-ups are noise.
  std::cerr << "mapp-run: rank " << firstFailed << ": " << errors[firstFailed]
            << "\n";
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  Options o = parseArgs(argc, argv);
  try {
    return run(o);
  } catch (const Error &e) {
    std::cerr << "mapp-run: " << e.what() << "\n";
  } catch (const std::bad_alloc &) {
    std::cerr << "mapp-run: out of memory\n";
  } catch (const std::exception &e) {
    std::cerr << "mapp-run: " << e.what() << "\n";
  }
  return 1;
}
