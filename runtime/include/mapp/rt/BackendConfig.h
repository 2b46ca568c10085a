//===- BackendConfig.h - the CUDA backend's MAPP_* switches -----*- C++ -*-===//
//
// Every environment variable the CUDA backend reads, in one struct with its
// default and meaning (table in docs/cuda-backend.md, "Environment"). The
// backend reads it once when it is created (CudaBackend::config()); its
// kernels take it from there instead of calling getenv. Plain C++ (no CUDA)
// so the parsing is unit-tested without a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKENDCONFIG_H
#define MAPP_RT_BACKENDCONFIG_H

#include <cstddef>
#include <string>

namespace mapp::rt {

/// Which fused instruction pairs run (MAPP_CUDA_FUSE).
struct CudaFusionSwitches {
  bool gelu = true, bgrad = true, accumulate = true, adam = true, sgd = true,
       residual = true;
  /// Off unless asked for (MAPP_CUDA_FUSE=all or a list naming it): one
  /// rounding fewer than PyTorch's unfused gelu backward, which moves a
  /// chaotic small model's 100-step curve off PyTorch's (docs/cuda-backend.md).
  bool dgelu = false;
};

/// Which attention implementation runs (MAPP_CUDA_ATTN): auto (cuDNN where
/// it loads and has an engine for the shape, else own), own (mma.sync
/// kernels), cudnn (cuDNN or a clear error), wmma (the first own version).
enum class CudaAttnImpl { Auto, Own, Cudnn, Wmma };

struct CudaConfig {
  /// MAPP_CUDA_STORAGE=bf16|f32 (bf16): activations stored in bf16, and
  /// bf16 shadows of matrix parameters; f32 keeps everything fp32.
  bool bf16Storage = true;
  /// MAPP_CUDA_PROFILE=1 (off): time every kernel with CUDA events and print
  /// a per-kernel table at exit.
  bool profile = false;
  /// MAPP_CUDA_FUSE=1|0|all|comma list of gelu,bgrad,accumulate,adam,sgd,
  /// residual,dgelu (1: all but dgelu).
  CudaFusionSwitches fuse;
  /// MAPP_CUDA_FUSE_LOG=1 (off): print what each bound program fused.
  bool fuseLog = false;
  /// MAPP_CUDA_GEMM_TUNE=0 (on): keep cuBLASLt's first heuristic algorithm
  /// instead of timing the candidates of large GEMMs.
  bool gemmTune = true;
  /// MAPP_CUDA_ATTN=auto|own|cudnn|wmma (auto).
  CudaAttnImpl attn = CudaAttnImpl::Auto;
  /// MAPP_CUDA_COMM=device|host (device): host stages collectives through
  /// the host communicator.
  bool hostComm = false;
  /// MAPP_CUDNN_LIB=path (unset): libcudnn to load before the default names.
  std::string cudnnLib;
  /// MAPP_CUDNN_VERBOSE set to anything (unset): print each cuDNN plan choice.
  bool cudnnVerbose = false;
  /// MAPP_PROBE_RING_BYTES=n >= 4096 (64 MiB): the probe capture ring.
  size_t probeRingBytes = size_t(64) << 20;
  /// MAPP_NCCL_SYNC_GRADS=0|1 (0): grad_sync waits like other collectives
  /// instead of overlapping the backward pass.
  bool ncclSyncGrads = false;
  /// MAPP_CUDA_MOE_COUNTS=async|sync (async): the grouped expert GEMMs read
  /// moe_assign's counts from the pinned copy queued behind it (sync: one
  /// stream synchronize per GEMM call; docs/moe.md).
  bool moeCountsSync = false;
  /// MAPP_CUDA_GRAPH=off|on (off): capture the training step's forward and
  /// backward as a CUDA graph and replay it (docs/cuda-graphs.md).
  bool stepGraph = false;
  /// MAPP_CUDA_DETERMINISTIC=0|1 (0): run-to-run bit-identical steps. Flash
  /// attention's backward forms dQ in its own pass instead of float atomics,
  /// attention's backward skips cuDNN (auto: the own kernels), and GEMMs keep
  /// cuBLASLt's first heuristic algorithm (timed choices can differ between
  /// runs). Refused with MAPP_CUDA_ATTN=cudnn or wmma (atomic dQ).
  bool deterministic = false;

  /// Reads every variable; Error naming the variable and the bad value.
  static CudaConfig fromEnv();
  /// MAPP_CUDA_FUSE alone: bindProgram re-reads it (and MAPP_CUDA_FUSE_LOG)
  /// so one backend can bind programs under different switches.
  static CudaFusionSwitches fusionFromEnv();
  static bool fuseLogFromEnv();
};

} // namespace mapp::rt

#endif
