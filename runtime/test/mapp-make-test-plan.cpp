//===- mapp-make-test-plan.cpp - write the hand-built MLP plan ------------===//
//
// Test-only: mapp-make-test-plan OUT.mplan [key=value ...] with keys vocab,
// hidden, ffn, batch, seq, microbatches, optimizer (sgd|adamw), lr,
// max_grad_norm, schedule (constant|cosine), and for the multi-rank variant
// (parallelMlpPlan) tp, pp, dp, chunks, trace (0|1), trace_every,
// trace_window, and MegaDPP's dpp (dfc|bfc|adaptive), mem_cap, stash
// (TestPlans.h ParallelOptions). Used by
// test/python/test_kernels_e2e.py to compare mapp-run with PyTorch.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"

#include <fstream>
#include <iostream>
#include <string>

using namespace mapp::rt::test;

int main(int argc, char **argv) {
  const char *usage = "usage: mapp-make-test-plan OUT.mplan [key=value ...]\n";
  if (argc < 2) {
    std::cerr << usage;
    return 2;
  }
  // An option where the output path goes (--help) must not become a file.
  std::string out = argv[1];
  if (out == "-h" || out == "--help") {
    std::cout << usage;
    return 0;
  }
  if (out.empty() || out[0] == '-') {
    std::cerr << "mapp-make-test-plan: '" << out << "' is not an output path\n" << usage;
    return 2;
  }
  MlpOptions o;
  ParallelOptions po;
  bool parallel = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (eq == std::string::npos) {
      std::cerr << "bad argument '" << a << "'\n";
      return 2;
    }
    std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    try { // std::stoi & co. throw on "abc" and out-of-range values
      if (k == "vocab")
        o.vocab = std::stoi(v);
      else if (k == "hidden")
        o.hidden = std::stoi(v);
      else if (k == "ffn")
        o.ffn = std::stoi(v);
      else if (k == "batch")
        o.batch = std::stoi(v);
      else if (k == "seq")
        o.seq = std::stoi(v);
      else if (k == "microbatches")
        o.microbatches = std::stoi(v);
      else if (k == "optimizer")
        o.optimizer = v;
      else if (k == "lr")
        o.lr = std::stod(v);
      else if (k == "max_grad_norm")
        o.maxGradNorm = std::stod(v);
      else if (k == "schedule")
        o.schedule = v;
      else if (k == "loss_scale")
        o.lossScale = v;
      else if (k == "loss_scale_init")
        o.lossScaleInit = std::stod(v);
      else if (k == "loss_scale_growth")
        o.lossScaleGrowth = std::stod(v);
      else if (k == "loss_scale_backoff")
        o.lossScaleBackoff = std::stod(v);
      else if (k == "loss_scale_growth_interval")
        o.lossScaleGrowthInterval = std::stoll(v);
      else if (k == "loss_scale_limit")
        o.lossScaleLimit = std::stod(v);
      else if (k == "tp")
        po.tp = std::stoi(v), parallel = true;
      else if (k == "pp")
        po.pp = std::stoi(v), parallel = true;
      else if (k == "dp")
        po.dp = std::stoi(v), parallel = true;
      else if (k == "chunks")
        po.chunks = std::stoi(v), parallel = true;
      else if (k == "trace")
        po.traceInstrs = std::stoi(v) != 0, parallel = true;
      else if (k == "trace_every")
        po.traceEvery = std::stoi(v), parallel = true;
      else if (k == "trace_window")
        po.traceWindow = std::stoi(v), parallel = true;
      else if (k == "dpp")
        po.dpp = v, parallel = true;
      else if (k == "mem_cap")
        po.adaptive.memCapBytes = std::stoull(v), parallel = true;
      else if (k == "stash")
        po.stashBytes = std::stoull(v), parallel = true;
      else {
        std::cerr << "unknown key '" << k << "'\n";
        return 2;
      }
    } catch (const std::exception &) {
      std::cerr << "bad value for '" << k << "': '" << v << "'\n";
      return 2;
    }
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = parallel ? parallelMlpPlan(o, po).build() : mlpPlan(o).build();
  } catch (const std::exception &e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  std::ofstream f(argv[1], std::ios::binary);
  f.write(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  if (!f)
    std::cerr << "cannot write '" << argv[1] << "'\n";
  return f ? 0 : 1;
}
