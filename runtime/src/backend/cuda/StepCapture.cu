//===- StepCapture.cu - capturing and replaying the step (MAPP_CUDA_GRAPH) ===//
//
// The executor (ExecutorGraph.cpp) decides when; this file records the
// compute stream's work between beginGraphCapture and endGraphCapture with
// stream capture, instantiates it and launches it. Capture is thread-local:
// another thread of the process (the trace resolver, the probe worker) may
// keep making calls that global mode would forbid, while this thread's own
// synchronizes and allocations fail inside the capture, which
// notWhileCapturing turns into a message naming the call.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"

#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

std::string CudaBackend::stepGraphsOff() const {
  if (profile_)
    return "MAPP_CUDA_PROFILE=1 times each kernel with events on the host";
  return {};
}

void CudaBackend::notWhileCapturing(const char *what) {
  if (!capturing_)
    return;
  // End the capture so that the stream works again for whoever handles
  // the error (and for the destructor's synchronize).
  capturing_ = false;
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial)
    cudaGraphDestroy(partial);
  cudaGetLastError();
  fail("MAPP_CUDA_GRAPH=on: ", what,
       " inside the captured step (it cannot be part of a CUDA graph; the "
       "step before, run eagerly, should have prepared it; run with "
       "MAPP_CUDA_GRAPH=off and report the plan)");
}

void *CudaBackend::graphInput(int index, size_t bytes) {
  if (index < 0)
    fail("graphInput: index ", index, " < 0");
  if (static_cast<size_t>(index) >= graphInputs_.size()) {
    graphInputs_.resize(index + 1);
    graphInputBytes_.resize(index + 1, 0);
  }
  if (graphInputBytes_[index] < bytes) {
    // A graph holds this address: it may not move once captured.
    notWhileCapturing("a larger pinned graph input");
    dropGraphs(); // they read the old address
    MAPP_CUDA_CHECK(cudaMallocHost(graphInputs_[index].out(), bytes));
    graphInputBytes_[index] = bytes;
  }
  return graphInputs_[index].get();
}

bool CudaBackend::isGraphInput(const void *p, size_t bytes) const {
  auto *b = static_cast<const char *>(p);
  for (size_t i = 0; i < graphInputs_.size(); ++i) {
    auto *lo = static_cast<const char *>(graphInputs_[i].get());
    if (lo && b >= lo && b + bytes <= lo + graphInputBytes_[i])
      return true;
  }
  return false;
}

void CudaBackend::beginGraphCapture() {
  if (capturing_)
    fail("beginGraphCapture: a capture is already open");
  if (!scalarDst_.empty())
    synchronize(); // the capture's scalar reads start at pinned slot 0
  MAPP_CUDA_CHECK(cudaSetDevice(device_));
  MAPP_CUDA_CHECK(
      cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  captureFirstMark_ = traceEvents_.used();
}

void CudaBackend::endGraphCapture(uint64_t id) {
  if (!capturing_)
    fail("endGraphCapture: no capture is open");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess || !graph) {
    cudaGetLastError(); // the sticky-free capture error, cleared
    fail("MAPP_CUDA_GRAPH=on: capturing step ", step_, " failed (",
         cudaGetErrorString(e),
         "): some kernel of the plan synchronizes or allocates; run with "
         "MAPP_CUDA_GRAPH=off");
  }
  GraphExec exec;
  e = cudaGraphInstantiate(exec.out(), graph, 0);
  cudaGraphDestroy(graph);
  MAPP_CUDA_CHECK(e);
  // The capture queued nothing: this step's work runs now.
  MAPP_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  StepGraphExec &g = graphs_[id];
  g.exec = std::move(exec);
  g.markBank = traceEvents_.bank();
  g.firstMark = captureFirstMark_;
  g.marks = traceEvents_.used() - captureFirstMark_;
}

bool CudaBackend::launchGraph(uint64_t id,
                              const std::vector<float *> &scalarDsts) {
  auto it = graphs_.find(id);
  if (it == graphs_.end())
    return false; // dropped by dropGraphs
  if (!scalarDst_.empty())
    synchronize();
  const StepGraphExec &g = it->second;
  if (g.marks) // the executor keys traced graphs by the step's bank
    traceEvents_.take(g.markBank, g.firstMark, g.marks);
  MAPP_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  // The graph's copies write pinned slots 0..n-1, as in its capture.
  scalarDst_ = scalarDsts;
  return true;
}

void CudaBackend::dropGraph(uint64_t id) {
  auto it = graphs_.find(id);
  if (it == graphs_.end())
    return;
  MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_)); // it may still run
  graphs_.erase(it);
}

void CudaBackend::dropGraphs() {
  if (graphs_.empty())
    return;
  MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();
}
