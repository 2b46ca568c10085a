//===- Backend.cpp - backend selection ------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"

using namespace mapp::rt;

std::unique_ptr<Backend> mapp::rt::createBackend(const std::string &name,
                                                 int threads) {
  if (name == "cpu")
    return createCpuBackend(threads);
  if (name == "cuda")
    fail("--backend=cuda is not built into this runtime (only 'cpu')");
  fail("unknown backend '", name, "' (choices: cpu)");
}
