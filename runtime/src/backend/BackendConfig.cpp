//===- BackendConfig.cpp - parsing the MAPP_* switches --------------------===//
//
// The only place the CUDA backend's environment variables are read; messages
// and defaults are the ones each switch had where it used to be read.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/BackendConfig.h"
#include "mapp/rt/Error.h"

#include <cstdlib>
#include <sstream>

using namespace mapp::rt;

namespace {

const char *env(const char *name) { return std::getenv(name); }

bool storageIsBf16() {
  const char *s = env("MAPP_CUDA_STORAGE");
  if (!s)
    return true;
  std::string v = s;
  if (v != "bf16" && v != "f32")
    fail("MAPP_CUDA_STORAGE must be 'bf16' or 'f32', not '", v, "'");
  return v == "bf16";
}

CudaAttnImpl attnFromEnv() {
  const char *e = env("MAPP_CUDA_ATTN");
  std::string v = e ? e : "";
  if (v.empty() || v == "auto")
    return CudaAttnImpl::Auto;
  if (v == "own")
    return CudaAttnImpl::Own;
  if (v == "cudnn")
    return CudaAttnImpl::Cudnn;
  if (v == "wmma")
    return CudaAttnImpl::Wmma;
  fail("MAPP_CUDA_ATTN=", v, ": expected auto, own, cudnn or wmma");
}

bool hostCommFromEnv() {
  const char *s = env("MAPP_CUDA_COMM");
  std::string mode = s ? s : "device";
  if (mode != "device" && mode != "host")
    fail("MAPP_CUDA_COMM must be 'device' or 'host', not '", mode, "'");
  return mode == "host";
}

size_t ringBytes(size_t fallback) {
  const char *e = env("MAPP_PROBE_RING_BYTES");
  if (!e || !*e)
    return fallback;
  char *end = nullptr;
  unsigned long long v = std::strtoull(e, &end, 10);
  if (*end || v < 4096)
    fail("MAPP_PROBE_RING_BYTES='", e, "' is not a byte count >= 4096");
  return static_cast<size_t>(v);
}

bool syncGrads() {
  const char *s = env("MAPP_NCCL_SYNC_GRADS");
  std::string v = s ? s : "0";
  if (v != "0" && v != "1")
    fail("MAPP_NCCL_SYNC_GRADS must be '0' or '1', not '", v, "'");
  return v == "1";
}

bool stepGraphFromEnv() {
  const char *s = env("MAPP_CUDA_GRAPH");
  std::string v = s ? s : "off";
  if (v != "off" && v != "on")
    fail("MAPP_CUDA_GRAPH must be 'off' or 'on', not '", v, "'");
  return v == "on";
}

bool deterministicFromEnv() {
  const char *s = env("MAPP_CUDA_DETERMINISTIC");
  std::string v = s ? s : "0";
  if (v != "0" && v != "1")
    fail("MAPP_CUDA_DETERMINISTIC must be '0' or '1', not '", v, "'");
  return v == "1";
}

bool isOne(const char *name) {
  const char *s = env(name);
  return s && std::string(s) == "1";
}

} // namespace

CudaFusionSwitches CudaConfig::fusionFromEnv() {
  CudaFusionSwitches on;
  const char *e = env("MAPP_CUDA_FUSE");
  std::string v = e ? e : "1";
  if (v == "1")
    return on;
  if (v == "all") {
    on.dgelu = true;
    return on;
  }
  on.gelu = on.bgrad = on.accumulate = on.adam = on.sgd = on.residual =
      on.dgelu = false;
  if (v == "0")
    return on;
  std::stringstream ss(v);
  std::string word;
  while (std::getline(ss, word, ',')) {
    if (word == "gelu")
      on.gelu = true;
    else if (word == "bgrad")
      on.bgrad = true;
    else if (word == "accumulate")
      on.accumulate = true;
    else if (word == "adam")
      on.adam = true;
    else if (word == "sgd")
      on.sgd = true;
    else if (word == "residual")
      on.residual = true;
    else if (word == "dgelu")
      on.dgelu = true;
    else
      fail("MAPP_CUDA_FUSE: unknown fusion '", word,
           "' (use 0, 1, all, or a comma list of gelu, bgrad, accumulate, "
           "adam, sgd, residual, dgelu)");
  }
  return on;
}

bool CudaConfig::fuseLogFromEnv() { return isOne("MAPP_CUDA_FUSE_LOG"); }

CudaConfig CudaConfig::fromEnv() {
  CudaConfig c;
  c.bf16Storage = storageIsBf16();
  c.profile = isOne("MAPP_CUDA_PROFILE");
  c.fuse = fusionFromEnv();
  c.fuseLog = fuseLogFromEnv();
  const char *tune = env("MAPP_CUDA_GEMM_TUNE");
  c.gemmTune = !(tune && std::string(tune) == "0");
  c.attn = attnFromEnv();
  c.hostComm = hostCommFromEnv();
  if (const char *lib = env("MAPP_CUDNN_LIB"))
    c.cudnnLib = lib;
  c.cudnnVerbose = env("MAPP_CUDNN_VERBOSE") != nullptr;
  c.probeRingBytes = ringBytes(c.probeRingBytes);
  c.ncclSyncGrads = syncGrads();
  if (const char *m = env("MAPP_CUDA_MOE_COUNTS")) {
    std::string v = m;
    if (v != "async" && v != "sync" && !v.empty())
      fail("MAPP_CUDA_MOE_COUNTS must be async or sync, got '", v, "'");
    c.moeCountsSync = v == "sync";
  }
  c.stepGraph = stepGraphFromEnv();
  c.deterministic = deterministicFromEnv();
  if (c.deterministic) {
    // Both backward passes add dQ with float atomics (order varies per run).
    if (c.attn == CudaAttnImpl::Cudnn || c.attn == CudaAttnImpl::Wmma)
      fail("MAPP_CUDA_DETERMINISTIC=1: MAPP_CUDA_ATTN=",
           c.attn == CudaAttnImpl::Cudnn ? "cudnn" : "wmma",
           " accumulates dQ with float atomics; use auto or own");
    c.gemmTune = false; // a timed choice may differ between runs
  }
  return c;
}
