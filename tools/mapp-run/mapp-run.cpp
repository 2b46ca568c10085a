//===- mapp-run.cpp - execute a training plan ------------------------------===//
//
// Thin main over the runtime library: parse flags, load the plan, wire the
// data loader, weights and metrics into the executor, run N steps. Flags are
// documented in runtime/README.md and by --help.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Metrics.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <unistd.h>

using namespace mapp::rt;

namespace {

const char *kUsage = R"(usage: mapp-run PLAN.mplan [flags]

  --backend=cpu|cuda         kernel backend (default cpu; cuda when built with it)
  --comm=local               communicator (default local: one rank)
  --data FILE                corpus: .jsonl ("text" field), .txt, or a Megatron
                             indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx)
  --data-format F            auto|jsonl|text|megatron (default auto: by extension)
  --tokenizer T              bytes | gpt2:VOCAB.json,MERGES.txt (jsonl/text data)
  --steps N                  training steps (default 1)
  --seed S                   parameter init and data shuffle seed (default 0)
  --no-shuffle               visit samples in corpus order
  --weights FILE             initial parameters (safetensors, by name)
  --save FILE                write parameters after the last step (safetensors)
  --save-grads FILE          write step 0's accumulated gradients (safetensors)
  --metrics FILE             one JSON object per step (jsonl)
  --dump-batches FILE        write every microbatch's tokens/targets (jsonl)
  --threads K                CPU worker threads (default: all cores)
  --quiet                    no progress output
  --help                     this text
)";

struct Options {
  std::string plan, backend = "cpu", comm = "local", data, dataFormat = "auto",
                    tokenizer, weights, save, saveGrads, metrics, dumpBatches;
  int64_t steps = 1;
  uint64_t seed = 0;
  int threads = 0;
  bool shuffle = true, quiet = false;
};

[[noreturn]] void usageError(const std::string &msg) {
  std::cerr << "mapp-run: " << msg << "\n(run mapp-run --help for the flags)\n";
  std::exit(2);
}

int64_t parseInt(const std::string &flag, const std::string &v, int64_t lo) {
  try {
    size_t pos;
    long long x = std::stoll(v, &pos);
    if (pos != v.size() || x < lo)
      throw std::invalid_argument(v);
    return x;
  } catch (const std::exception &) {
    usageError(flag + " needs an integer >= " + std::to_string(lo) +
               ", got '" + v + "'");
  }
}

Options parseArgs(int argc, char **argv) {
  Options o;
  std::map<std::string, std::string *> strings = {
      {"--backend", &o.backend},       {"--comm", &o.comm},
      {"--data", &o.data},             {"--data-format", &o.dataFormat},
      {"--tokenizer", &o.tokenizer},   {"--weights", &o.weights},
      {"--save", &o.save},             {"--save-grads", &o.saveGrads},
      {"--metrics", &o.metrics},       {"--dump-batches", &o.dumpBatches}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
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
    bool known = strings.count(flag) || flag == "--steps" ||
                 flag == "--seed" || flag == "--threads";
    if (!known)
      usageError("unknown flag '" + flag + "'");
    if (!inlineValue) {
      if (i + 1 >= argc)
        usageError(flag + " needs a value");
      value = argv[++i];
    }
    if (value.empty())
      usageError(flag + " needs a non-empty value");
    if (strings.count(flag))
      *strings[flag] = value;
    else if (flag == "--steps")
      o.steps = parseInt(flag, value, 0);
    else if (flag == "--seed")
      o.seed = static_cast<uint64_t>(parseInt(flag, value, 0));
    else
      o.threads = static_cast<int>(parseInt(flag, value, 0));
  }
  if (o.plan.empty())
    usageError("no plan given");
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
    nlohmann::json j = {{"step", step},       {"microbatch", mb},
                        {"dp_rank", dpRank},  {"tokens", rows(tok)},
                        {"targets", rows(tgt)}};
    out_ << j.dump() << "\n";
  }

private:
  std::ofstream out_;
};

int run(const Options &o) {
  Plan plan = loadPlan(o.plan);
  std::unique_ptr<Communicator> comm = createComm(o.comm);
  std::unique_ptr<Backend> backend = createBackend(o.backend, o.threads);
  Executor exec(plan, *backend, *comm);
  const Program &prog = exec.program();

  // Data: needed when this rank's program consumes tokens or targets.
  std::unique_ptr<BatchLoader> loader;
  bool needsData = prog.tokens >= 0 || prog.targets >= 0;
  if (needsData && o.steps > 0) {
    if (o.data.empty())
      fail("the plan reads tokens; give --data FILE");
    std::unique_ptr<Tokenizer> tok;
    if (!o.tokenizer.empty())
      tok = createTokenizer(o.tokenizer);
    std::vector<int32_t> tokens = loadTokens(o.data, o.dataFormat, tok.get());
    loader = std::make_unique<BatchLoader>(std::move(tokens), plan.seqLength,
                                           o.seed, o.shuffle);
    if (loader->maxToken() >= plan.vocabSize)
      fail("data: token id ", loader->maxToken(), " is outside the plan's vocab_size ",
           plan.vocabSize, " (wrong --tokenizer?)");
  }

  if (!o.weights.empty())
    exec.loadParams(readSafetensors(o.weights), o.weights);
  else
    exec.initParams(o.seed);

  std::unique_ptr<MetricsWriter> metrics;
  if (!o.metrics.empty())
    metrics = std::make_unique<MetricsWriter>(o.metrics);
  std::unique_ptr<BatchDump> dump;
  if (!o.dumpBatches.empty())
    dump = std::make_unique<BatchDump>(o.dumpBatches);

  int dpRank = prog.dp;
  Executor::BatchFn batches = [&](int64_t step, int mb, int32_t *tok,
                                  int32_t *tgt) {
    loader->microbatch(step, dpRank, plan.dp, plan.numMicrobatches, mb,
                       plan.microBatchSize, tok, tgt);
    if (dump)
      dump->write(step, mb, dpRank, plan.microBatchSize, plan.seqLength, tok,
                  tgt);
  };
  Executor::GradHook gradHook = [&](const Executor &e) {
    if (!o.saveGrads.empty() && e.stepsDone() == 0)
      writeSafetensors(o.saveGrads, e.saveGrads());
  };

  Progress progress(o.steps, isatty(STDOUT_FILENO) != 0, o.quiet);
  for (int64_t s = 0; s < o.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = exec.step(loader ? batches : Executor::BatchFn(), gradHook);
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    StepMetrics m;
    m.step = r.step;
    m.loss = r.loss;
    m.lr = r.lr;
    m.gradNorm = r.gradNorm;
    m.tokens = r.tokens;
    m.stepMs = ms;
    m.tokensPerS = ms > 0 ? r.tokens / (ms / 1000.0) : 0;
    if (metrics)
      metrics->write(m);
    progress.update(m);
  }
  progress.finish();
  if (!o.save.empty())
    writeSafetensors(o.save, exec.saveParams());
  return 0;
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
