//===- BackendConfigTest.cpp - parsing the CUDA backend's MAPP_* switches -===//
//
// CudaConfig::fromEnv against the defaults and meanings documented in
// docs/cuda-backend.md ("Environment"): unset gives the defaults, each value
// sets its field, a bad value is an Error naming the variable.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/BackendConfig.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

using namespace mapp::rt;

namespace {

const char *const kVars[] = {
    "MAPP_CUDA_STORAGE",   "MAPP_CUDA_PROFILE",     "MAPP_CUDA_FUSE",
    "MAPP_CUDA_FUSE_LOG",  "MAPP_CUDA_GEMM_TUNE",   "MAPP_CUDA_ATTN",
    "MAPP_CUDA_COMM",      "MAPP_CUDNN_LIB",        "MAPP_CUDNN_VERBOSE",
    "MAPP_PROBE_RING_BYTES", "MAPP_NCCL_SYNC_GRADS", "MAPP_CUDA_MOE_COUNTS",
    "MAPP_CUDA_GRAPH", "MAPP_CUDA_DETERMINISTIC"};

/// Unsets every switch for the test and restores the caller's values.
class CudaConfigEnv : public ::testing::Test {
protected:
  void SetUp() override {
    for (const char *v : kVars) {
      if (const char *s = std::getenv(v))
        saved_[v] = s;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char *v : kVars)
      unsetenv(v);
    for (auto &kv : saved_)
      setenv(kv.first.c_str(), kv.second.c_str(), 1);
  }
  /// The Error message fromEnv gives with name=value, "" when none.
  static std::string errorWith(const char *name, const char *value) {
    setenv(name, value, 1);
    std::string msg;
    try {
      CudaConfig::fromEnv();
    } catch (const Error &e) {
      msg = e.what();
    }
    unsetenv(name);
    return msg;
  }

private:
  std::map<std::string, std::string> saved_;
};

} // namespace

TEST_F(CudaConfigEnv, UnsetGivesTheDefaults) {
  CudaConfig c = CudaConfig::fromEnv();
  EXPECT_TRUE(c.bf16Storage);
  EXPECT_FALSE(c.profile);
  EXPECT_TRUE(c.fuse.gelu && c.fuse.bgrad && c.fuse.accumulate &&
              c.fuse.adam && c.fuse.sgd && c.fuse.residual);
  EXPECT_FALSE(c.fuse.dgelu); // opt-in: MAPP_CUDA_FUSE=all or a list
  EXPECT_FALSE(c.fuseLog);
  EXPECT_TRUE(c.gemmTune);
  EXPECT_EQ(c.attn, CudaAttnImpl::Auto);
  EXPECT_FALSE(c.hostComm);
  EXPECT_EQ(c.cudnnLib, "");
  EXPECT_FALSE(c.cudnnVerbose);
  EXPECT_EQ(c.probeRingBytes, size_t(64) << 20);
  EXPECT_FALSE(c.ncclSyncGrads);
  EXPECT_FALSE(c.moeCountsSync);
  EXPECT_FALSE(c.stepGraph);
  EXPECT_FALSE(c.deterministic);
}

TEST_F(CudaConfigEnv, EachVariableSetsItsField) {
  setenv("MAPP_CUDA_STORAGE", "f32", 1);
  setenv("MAPP_CUDA_PROFILE", "1", 1);
  setenv("MAPP_CUDA_FUSE", "bgrad,sgd,residual,dgelu", 1);
  setenv("MAPP_CUDA_FUSE_LOG", "1", 1);
  setenv("MAPP_CUDA_GEMM_TUNE", "0", 1);
  setenv("MAPP_CUDA_ATTN", "wmma", 1);
  setenv("MAPP_CUDA_COMM", "host", 1);
  setenv("MAPP_CUDNN_LIB", "/opt/cudnn/libcudnn.so.9", 1);
  setenv("MAPP_CUDNN_VERBOSE", "", 1); // set at all: verbose
  setenv("MAPP_PROBE_RING_BYTES", "8192", 1);
  setenv("MAPP_NCCL_SYNC_GRADS", "1", 1);
  setenv("MAPP_CUDA_MOE_COUNTS", "sync", 1);
  setenv("MAPP_CUDA_GRAPH", "on", 1);
  CudaConfig c = CudaConfig::fromEnv();
  EXPECT_FALSE(c.bf16Storage);
  EXPECT_TRUE(c.profile);
  EXPECT_TRUE(!c.fuse.gelu && c.fuse.bgrad && !c.fuse.accumulate &&
              !c.fuse.adam && c.fuse.sgd && c.fuse.residual && c.fuse.dgelu);
  EXPECT_TRUE(c.fuseLog);
  EXPECT_FALSE(c.gemmTune);
  EXPECT_EQ(c.attn, CudaAttnImpl::Wmma);
  EXPECT_TRUE(c.hostComm);
  EXPECT_EQ(c.cudnnLib, "/opt/cudnn/libcudnn.so.9");
  EXPECT_TRUE(c.cudnnVerbose);
  EXPECT_EQ(c.probeRingBytes, 8192u);
  EXPECT_TRUE(c.ncclSyncGrads);
  EXPECT_TRUE(c.moeCountsSync);
  EXPECT_TRUE(c.stepGraph);
  // Values that keep the default meaning.
  setenv("MAPP_CUDA_PROFILE", "yes", 1); // only "1" turns it on
  setenv("MAPP_CUDA_FUSE", "0", 1);
  setenv("MAPP_CUDA_GEMM_TUNE", "1", 1);
  setenv("MAPP_CUDA_ATTN", "", 1);
  setenv("MAPP_CUDA_MOE_COUNTS", "async", 1);
  setenv("MAPP_CUDA_GRAPH", "off", 1);
  c = CudaConfig::fromEnv();
  EXPECT_FALSE(c.stepGraph);
  EXPECT_FALSE(c.profile);
  EXPECT_FALSE(c.fuse.gelu || c.fuse.bgrad || c.fuse.accumulate ||
               c.fuse.adam || c.fuse.sgd || c.fuse.residual || c.fuse.dgelu);
  EXPECT_TRUE(c.gemmTune);
  setenv("MAPP_CUDA_FUSE", "all", 1);
  c = CudaConfig::fromEnv();
  EXPECT_TRUE(c.fuse.gelu && c.fuse.residual && c.fuse.adam && c.fuse.dgelu);
  EXPECT_EQ(c.attn, CudaAttnImpl::Auto);
  EXPECT_FALSE(c.moeCountsSync);
}

TEST_F(CudaConfigEnv, BadValuesNameTheVariable) {
  EXPECT_NE(errorWith("MAPP_CUDA_STORAGE", "fp16").find("MAPP_CUDA_STORAGE must be 'bf16' or 'f32', not 'fp16'"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_FUSE", "adam,bogus").find("unknown fusion 'bogus'"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_ATTN", "flash").find("MAPP_CUDA_ATTN=flash"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_COMM", "nvlink").find("MAPP_CUDA_COMM must be"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_PROBE_RING_BYTES", "4095").find("MAPP_PROBE_RING_BYTES='4095'"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_PROBE_RING_BYTES", "8k").find("is not a byte count"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_NCCL_SYNC_GRADS", "yes").find("MAPP_NCCL_SYNC_GRADS must be '0' or '1'"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_MOE_COUNTS", "1").find("MAPP_CUDA_MOE_COUNTS must be async or sync, got '1'"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_GRAPH", "1").find("MAPP_CUDA_GRAPH must be 'off' or 'on', not '1'"), std::string::npos);
  EXPECT_EQ(errorWith("MAPP_CUDA_FUSE_LOG", "whatever"), ""); // not 1: off
}

TEST_F(CudaConfigEnv, DeterministicTurnsTuningOffAndRefusesAtomicAttention) {
  setenv("MAPP_CUDA_DETERMINISTIC", "1", 1);
  CudaConfig c = CudaConfig::fromEnv();
  EXPECT_TRUE(c.deterministic);
  EXPECT_FALSE(c.gemmTune); // timed algorithm choices can differ per run
  setenv("MAPP_CUDA_ATTN", "own", 1);
  c = CudaConfig::fromEnv();
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(c.attn, CudaAttnImpl::Own);
  setenv("MAPP_CUDA_DETERMINISTIC", "0", 1);
  c = CudaConfig::fromEnv();
  EXPECT_FALSE(c.deterministic);
  EXPECT_TRUE(c.gemmTune);
  unsetenv("MAPP_CUDA_ATTN");
  EXPECT_NE(errorWith("MAPP_CUDA_DETERMINISTIC", "yes").find("MAPP_CUDA_DETERMINISTIC must be '0' or '1', not 'yes'"), std::string::npos);
  setenv("MAPP_CUDA_DETERMINISTIC", "1", 1);
  EXPECT_NE(errorWith("MAPP_CUDA_ATTN", "cudnn").find("MAPP_CUDA_DETERMINISTIC=1: MAPP_CUDA_ATTN=cudnn accumulates dQ with float atomics"), std::string::npos);
  EXPECT_NE(errorWith("MAPP_CUDA_ATTN", "wmma").find("MAPP_CUDA_ATTN=wmma"), std::string::npos);
}
