//===- RunFlags.cpp - mapp-run's command line into RunOptions -------------===//
//
// The flags, their checks and every message of a bad command line; the tool
// main (tools/mapp-run) only prints and exits. Flags: runtime/README.md.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/RunFlags.h"
#include "DataSplit.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Faults.h"
#include "mapp/rt/Launcher.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

using namespace mapp::rt;

namespace {

const char *const kUsage = R"(usage: mapp-run PLAN.mplan [flags]

  --backend=cpu|cuda         kernel backend (default cpu; cuda when built with it)
  --comm=local|mpi|nccl       local: every rank of the plan as a thread of this
                             process (default; with --backend=cuda all ranks
                             share GPU 0 and collectives stay on the device);
                             mpi: this process is one rank
                             (mpirun -np WORLD mapp-run PLAN --comm=mpi ...);
                             nccl: rank threads, rank r on GPU r (--backend=cuda);
                             under mpirun, srun or torchrun one process per GPU
                             (docs/multi-gpu.md)
  --comm-timeout S           fail a wait for another rank after S seconds
                             (default 300; 0 = never)
  --coordinator=on|off       MegaFBD plans: match the step-end parameter
                             transfers through the bit-vector coordinator
                             (default on; docs/megafbd.md)
  --trace-dir DIR            MegaScan trace: DIR/rank-{r}.trace.jsonl per rank
  --monitor FILE             MegaScan live: rank 0 diagnoses every step's
                             summaries of all ranks and writes slow-rank /
                             slow-link / recovered alerts to FILE (JSON lines;
                             "-" = stdout) and one line each to stderr
                             (docs/mapp-scan.md, "Live monitor")
  --monitor-every K          send the summaries in batches of K steps (one
                             message per K steps; 1..64, default 1)
  --monitor-to-dpp           the adaptive scheduler also takes the monitor's
                             slow-link verdicts (docs/megadpp.md)
  --monitor-cost N           the monitor's cost in this run: windows of N
                             steps alternate without and with the monitor
                             (records, summaries, diagnosis); rank 0 prints
                             the median step of each kind at the end
  --trace-sample E:W         trace steps with step % E < W (E = 0: every step),
                             overriding the plan's trace_every:trace_window
  --inject SPEC              fault injection, repeatable:
                               slow-compute:rank=R,factor=F
                               link-delay:src=A,dst=B,us=U
                               link-bandwidth:src=A,dst=B,gbps=G
                               monitor-silence:rank=R (--monitor testing)
                               stop:rank=R (SIGSTOP at from-step; mpi)
                               rank-crash:rank=R,at-step=K[,back-at-step=L]
                               (dies at step K: SIGKILL / thread as if killed)
                             each with optional ,from-step=K,to-step=L
                             (active in steps K <= step < L); a link fault
                             delays the transfer, not the sender
  --elastic                  rank threads: when a rank dies, restart on the
                             largest --elastic-plan layout that fits the ranks
                             left, from the newest intact checkpoint; grow
                             back at a checkpoint when ranks return (needs
                             --save-dir; docs/elastic.md)
  --elastic-plan PLAN        a layout --elastic may switch to (repeatable;
                             the same global batch as the job's plan)
  --elastic-max-restarts N   give up after N restarts (default 8)
  --repartition-plan PLAN    --elastic: another stage partition of the job's
                             layout (compiled with stage-layers=); at each
                             checkpoint the job switches to the one measured
                             stage times predict >= 1.15x faster in >= 80% of
                             the steps since (repeatable; docs/elastic.md;
                             processes: mapp-launch --repartition-plan)
  --dp-split K0,K1,...       an uneven data-parallel split: replica d runs
                             Kd microbatches a step (sum = dp x the plan's
                             microbatches; pp = 1 plans; the gradient is the
                             even split's: docs/elastic.md)
  --dp-balance N             move microbatches off a slow data-parallel
                             replica, in place, deciding every N steps as
                             --repartition-plan does (pp = 1 plans)
  --elastic-attempt K        set by mapp-launch --elastic on each attempt:
                             K > 0 a restart (outputs appended, rank-crash
                             faults done); with --repartition-plan, rank 0
                             reports a switch on stderr and the job stops
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
  --weights-format F         auto|mapp|hf: --weights under mapp's or Hugging
                             Face's names (GPT-2, LLaMA; docs/models.md);
                             auto (default) detects HF names; hf also makes
                             --save write HF names
  --save-format F            mapp|hf: names --save writes (default: mapp, hf
                             with --weights-format hf)
  --hf-vocab-size N          --save in HF names keeps N vocabulary rows (drops
                             mapp's padding; default: as many as --weights had)
  --save FILE                write parameters after the last step (safetensors)
  --save-grads FILE          write step 0's accumulated gradients (safetensors)
  --save-dir DIR             whole-state checkpoints (parameters, optimizer
                             state, step, data position): DIR/step-NNNNNNNN/,
                             one shard per rank + manifest.json; written after
                             the last step, and on SIGTERM/SIGINT (the run
                             finishes the step, saves, exits 0)
  --save-every N             also every N steps
  --save-interval-s S        also when S seconds passed since the last save
  --save-keep K              keep the newest K checkpoints of this run's lineage
                             (its own and those it resumed from; default 3;
                             0 = all); other runs' are never deleted
  --save-dir-overwrite       start even though DIR holds another run's
                             checkpoints newer than this run's start (refused
                             without it): they are removed after the first save
  --resume DIR               continue from a checkpoint (DIR itself or the
                             newest in a --save-dir); --steps counts the whole
                             run; another tp/pp/dp layout reshards
  --nan-check                check every op's outputs every step (slow); a
                             non-finite loss or gradient norm always stops the
                             run and re-runs that step so to name the op
  --inject-nan STEP:OP       testing: op OP (IR name) writes a NaN at step STEP
                             (1 = the first, as the progress lines count)
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
  --report-memory            each rank prints the storage its backend
                             allocated beside its plan's memory figures
  --quiet                    no progress output
  --calibrate -o FILE        measure this machine through the backend's
                             kernels and write a cost profile (no plan;
                             with --backend, --threads, --comm local|mpi,
                             --calibrate-seconds S (default 20), --quiet;
                             docs/auto-parallel.md, "Calibration")
  --help                     this text
)";

constexpr int64_t kMaxThreads = 1024;

[[noreturn]] void usageError(const std::string &msg) {
  throw RunUsageError(msg);
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

/// --mem-cap: bytes with an optional K/M/G (binary) suffix; "" = 0.
uint64_t parseBytes(const std::string &flag, const std::string &v) {
  if (v.empty())
    return 0;
  uint64_t mul = 1;
  std::string num = v;
  char last =
      static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mul = last == 'K' ? 1ull << 10 : last == 'M' ? 1ull << 20 : 1ull << 30;
    num = v.substr(0, v.size() - 1);
  }
  return static_cast<uint64_t>(parseInt(flag, num, 1)) * mul;
}
} // namespace

RunCommandLine mapp::rt::parseRunCommandLine(int argc, char **argv) {
  RunCommandLine cl;
  if (isCalibrateCommandLine(argc, argv)) { // its own flags (Calibrate.cpp)
    for (int i = 1; i < argc; ++i)
      cl.help |= std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
    cl.calibrate = !cl.help;
    if (cl.help)
      return cl;
    cl.calibration = parseCalibrateCommandLine(argc, argv);
    return cl;
  }
  RunOptions &o = cl.options;
  // Flags parsed further below, after every flag was read.
  std::string traceSample, injectNan,
      coordinator = "on", memCap, weightsFormat = "auto", saveFormat = "auto";
  bool promptGiven = false;
  std::map<std::string, std::string *> strings = {
      {"--backend", &o.backend},
      {"--comm", &o.comm},
      {"--data", &o.data},
      {"--data-format", &o.dataFormat},
      {"--tokenizer", &o.tokenizer},
      {"--weights", &o.weights},
      {"--save", &o.save},
      {"--save-grads", &o.saveGrads},
      {"--metrics", &o.metrics},
      {"--dump-batches", &o.dumpBatches},
      {"--trace-dir", &o.traceDir},
      {"--probe-db", &o.probeDb},
      {"--probe-control", &o.probeControl},
      {"--probe-run", &o.probeRun},
      {"--probe-control-token-file", &o.probeControlTokenFile},
      {"--generate-out", &o.generateOut},
      {"--trace-sample", &traceSample},
      {"--save-dir", &o.ckpt.saveDir},
      {"--resume", &o.ckpt.resume},
      {"--inject-nan", &injectNan},
      {"--coordinator", &coordinator},
      {"--patch", &o.patch},
      {"--schedule", &o.schedule},
      {"--mem-cap", &memCap},
      {"--monitor", &o.monitor},
      {"--weights-format", &weightsFormat},
      {"--save-format", &saveFormat}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      cl.help = true;
      return cl;
    }
    if (a == "--no-shuffle") {
      o.shuffle = false;
      continue;
    }
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a == "--report-memory") {
      o.reportMemory = true;
      continue;
    }
    if (a == "--monitor-to-dpp") {
      o.monitorToDpp = true;
      continue;
    }
    if (a == "--nan-check") {
      o.nanCheck = true;
      continue;
    }
    if (a == "--elastic") {
      o.elastic = true;
      continue;
    }
    if (a == "--save-dir-overwrite") {
      o.ckpt.overwrite = true;
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
    auto [flag, value, inlineValue] = splitFlagArg(a);
    bool known = strings.count(flag) || flag == "--steps" || flag == "--seed" ||
                 flag == "--threads" || flag == "--inject" ||
                 flag == "--comm-timeout" || flag == "--prompt" ||
                 flag == "--max-new-tokens" || flag == "--temperature" ||
                 flag == "--top-k" || flag == "--save-every" ||
                 flag == "--save-interval-s" || flag == "--save-keep" ||
                 flag == "--hf-vocab-size" || flag == "--monitor-every" ||
                 flag == "--monitor-cost" ||
                 flag == "--elastic-plan" || flag == "--elastic-max-restarts" ||
                 flag == "--elastic-attempt" || flag == "--repartition-plan" ||
                 flag == "--dp-split" || flag == "--dp-balance";
    if (!known)
      usageError("unknown flag '" + flag + "'");
    if (!inlineValue) {
      if (i + 1 >= argc)
        usageError(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "--prompt") {
      o.prompt = value;
      promptGiven = true;
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
    } else if (flag == "--save-every")
      o.ckpt.every = parseInt(flag, value, 1);
    else if (flag == "--save-interval-s")
      o.ckpt.intervalS = static_cast<double>(parseInt(flag, value, 1));
    else if (flag == "--save-keep")
      o.ckpt.keep = static_cast<int>(parseInt(flag, value, 0, 1 << 20));
    else if (flag == "--elastic-plan")
      o.elasticPlans.push_back(value);
    else if (flag == "--repartition-plan")
      o.repartitionPlans.push_back(value);
    else if (flag == "--elastic-max-restarts")
      o.elasticMaxRestarts = static_cast<int>(parseInt(flag, value, 0, 1000));
    else if (flag == "--elastic-attempt")
      o.elasticAttempt = static_cast<int>(parseInt(flag, value, 0, 1000000));
    else if (flag == "--dp-split") {
      try {
        o.dpSplit = parseDpSplit(value);
      } catch (const Error &e) {
        usageError(e.what());
      }
    } else if (flag == "--dp-balance")
      o.dpBalance = static_cast<int>(parseInt(flag, value, 2, 1 << 20));
    else if (flag == "--monitor-every")
      o.monitorEvery = static_cast<int>(parseInt(flag, value, 1, 64));
    else if (flag == "--monitor-cost")
      o.monitorCost = static_cast<int>(parseInt(flag, value, 1, 1 << 20));
    else if (flag == "--hf-vocab-size")
      o.hfVocabSize = parseInt(flag, value, 1);
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
    } else // 0 = all cores; the cap keeps a typo from spawning 10^5 threads
      o.threads = static_cast<int>(parseInt(flag, value, 0, kMaxThreads));
  }
  if (o.plan.empty())
    usageError("no plan given");
  if (!o.generate && (promptGiven || !o.generateOut.empty() || !o.kvCache))
    usageError("--prompt, --generate-out and --no-kv-cache need --generate");
  if (!o.patch.empty() && o.generate)
    usageError("--patch and --generate are different modes; give one");
  if (promptGiven && o.prompt.empty())
    usageError("--prompt is empty (leave it out to start from the EOT token)");
  if (!isCommName(o.comm))
    usageError("--comm must be " + commChoices() + ", got '" + o.comm + "'");
  if (o.comm == worldEntry(WorldKind::NcclThreads).comm && o.backend != "cuda")
    usageError("--comm=nccl needs --backend=cuda (NCCL moves device memory)");
  if (!injectNan.empty()) {
    size_t colon = injectNan.find(':');
    if (colon == std::string::npos || colon + 1 == injectNan.size())
      usageError("--inject-nan needs STEP:OP, got '" + injectNan + "'");
    // STEP as the progress lines and the messages count (1 = the first);
    // the executor counts steps done.
    o.nanStep =
        parseInt("--inject-nan STEP", injectNan.substr(0, colon), 1) - 1;
    o.nanOp = injectNan.substr(colon + 1);
  }
  if ((o.ckpt.every || o.ckpt.intervalS) && o.ckpt.saveDir.empty())
    usageError("--save-every and --save-interval-s need --save-dir");
  if (o.ckpt.overwrite && o.ckpt.saveDir.empty())
    usageError("--save-dir-overwrite needs --save-dir");
  if (!o.ckpt.resume.empty() && !o.weights.empty())
    usageError("--resume and --weights both set the parameters; give one");
  if (o.generate && (!o.ckpt.resume.empty() || !o.ckpt.saveDir.empty()))
    usageError("--resume and --save-dir are for training, not --generate");
  if (!parseWeightsFormat(weightsFormat, o.weightsFormat))
    usageError("--weights-format needs auto, mapp or hf, got '" +
               weightsFormat + "'");
  if (!parseWeightsFormat(saveFormat, o.saveFormat))
    usageError("--save-format needs mapp or hf, got '" + saveFormat + "'");
  if (o.hfVocabSize && o.saveFormat != WeightsFormat::Hf &&
      o.weightsFormat != WeightsFormat::Hf)
    usageError("--hf-vocab-size is for --save in HF names (--save-format hf)");
  if (!traceSample.empty()) {
    if (o.traceDir.empty())
      usageError("--trace-sample needs --trace-dir");
    o.traceSampling = parseTraceSample(traceSample);
  }
  if (!o.monitor.empty() && !traceSample.empty())
    usageError("--monitor summarizes every step; leave out --trace-sample");
  if (o.monitor.empty() && (o.monitorEvery != 1 || o.monitorToDpp))
    usageError(
        std::string(o.monitorToDpp ? "--monitor-to-dpp" : "--monitor-every") +
        " needs --monitor FILE");
  if (o.monitorCost && o.monitor.empty())
    usageError("--monitor-cost needs --monitor FILE");
  if (o.monitorCost && !o.traceDir.empty())
    usageError("--monitor-cost times the monitor alone; leave out --trace-dir "
               "(its file would be written in the monitored steps only)");
  if (o.monitorCost && int64_t(o.monitorCost) * 5 > o.steps)
    usageError("--monitor-cost " + std::to_string(o.monitorCost) +
               ": --steps " + std::to_string(o.steps) +
               " holds fewer than 5 windows (the first is left out, then at "
               "least two monitored and two not)");
  if (!o.monitor.empty() && o.generate)
    usageError("--monitor is for training, not --generate");
  if (o.elastic && o.ckpt.saveDir.empty())
    usageError("--elastic needs --save-dir DIR (a restart resumes from its "
               "newest checkpoint)");
  if (!o.elastic && (!o.elasticPlans.empty() || o.elasticMaxRestarts != 8))
    usageError("--elastic-plan and --elastic-max-restarts need --elastic");
  if (!o.elastic && o.elasticAttempt < 0 && !o.repartitionPlans.empty())
    usageError("--repartition-plan needs --elastic (rank threads), or "
               "mapp-launch --elastic --repartition-plan (processes)");
  if ((o.dpBalance || !o.dpSplit.empty()) &&
      (o.elastic || o.elasticAttempt >= 0 || o.generate))
    usageError("--dp-split and --dp-balance are for a training run of one "
               "layout (not --elastic or under mapp-launch, whose restarts "
               "change the replicas, nor --generate)");
  if (o.dpBalance && !o.traceDir.empty())
    usageError("--dp-balance changes each replica's microbatches in the run; "
               "leave out --trace-dir (a trace's events per step are sized "
               "at its start)");
  if (!o.repartitionPlans.empty() && o.ckpt.saveDir.empty())
    usageError("--repartition-plan needs --save-dir DIR (a switch resumes "
               "from the checkpoint it is decided at)");
  if (o.elastic && (o.generate || !o.patch.empty()))
    usageError("--elastic is for training");
  if (o.elastic && !o.ckpt.resume.empty())
    usageError("--elastic starts fresh; its restarts resume by themselves "
               "(leave out --resume)");
  if (coordinator != "on" && coordinator != "off")
    usageError("--coordinator must be on or off, got '" + coordinator + "'");
  o.coordinator = coordinator == "on";
  o.memCapBytes = parseBytes("--mem-cap", memCap);
  return cl;
}

mapp::rt::FlagArg mapp::rt::splitFlagArg(const std::string &arg) {
  size_t eq = arg.find('=');
  if (eq == std::string::npos)
    return {arg, {}, false};
  return {arg.substr(0, eq), arg.substr(eq + 1), true};
}

std::string mapp::rt::runUsage() {
  return std::string(kUsage) + "\nbuilt with communicators: local" +
         (haveMpiComm() ? ", mpi" : "") + (haveNcclComm() ? ", nccl" : "") +
         "\n";
}
