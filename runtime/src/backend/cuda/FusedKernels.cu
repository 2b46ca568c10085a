//===- FusedKernels.cu - generated kernels of mapp.fused ------------------===//
#include "FusedKernels.h"
#include "CudaBackend.h"
#include "backend/KernelCompiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
namespace fz = mapp::rt::fused;

namespace {

std::string describe(const Instr &in, size_t block, size_t index) {
  return "fused instruction " + (in.name.empty() ? std::string() : "'" + in.name + "' ") +
         "(block " + std::to_string(block) + ", instruction " + std::to_string(index) +
         ", program '" + in.attrs.getStr("program", "") + "')";
}

} // namespace

FusedKernels::Call FusedKernels::prepare(const Attrs &attrs, int numInputs,
                                        const std::string &what) {
  Call c;
  c.what = what;
  c.text = attrs.getStr("program", "");
  std::string err = fz::parse(c.text, numInputs, c.program);
  if (!err.empty()) // a plan's were checked at load
    fail(what, ": ", err);
  c.domain = attrs.getInts("domain");
  c.outputs = attrs.getInts("outputs");
  return c;
}

FusedKernels::FusedKernels(CudaBackend &be, const Program *prog) {
  cudaDeviceProp prop;
  MAPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, be.device()));
  arch_ = prop.major * 10 + prop.minor;
  if (!prog)
    return;
  const Program &p = *prog;
  auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < p.blocks.size(); ++b)
    for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
      const Instr &in = p.blocks[b].instrs[i];
      if (in.kernel != MAPP_KERNEL_NAME(fused))
        continue;
      Call c = prepare(in.attrs, static_cast<int>(in.inputs.size()), describe(in, b, i));
      fz::CodegenSpec spec{c.program, static_cast<int>(c.domain.size()), c.outputs, {}, {}};
      for (int v : in.inputs)
        spec.inputs.push_back(be.storedDType(p, in, v, false));
      for (int v : in.outputs)
        spec.results.push_back(be.storedDType(p, in, v, true));
      c.kernel = kernelFor(spec, c.what);
      c.inputs = spec.inputs;
      c.results = spec.results;
      c.width = fz::vectorWidth(spec);
      calls_[&in.attrs] = std::move(c);
    }
  if (be.config().fuseLog && !calls_.empty())
    std::fprintf(stderr,
                 "mapp cuda fused: %zu instructions, %zu kernels: %d compiled (NVRTC, sm_%d), "
                 "%d from the kernel cache %s, %.2f s\n",
                 calls_.size(), bySource_.size(), compiled_, arch_, cached_,
                 kernelCacheDir().c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

FusedKernels::~FusedKernels() {
  for (auto &[source, l] : bySource_)
    cudaLibraryUnload(l.library); // errors at teardown are not actionable
}

cudaKernel_t FusedKernels::kernelFor(const fz::CodegenSpec &spec, const std::string &what) {
  std::string source;
  try {
    source = fz::generateKernel(spec);
  } catch (const Error &e) {
    fail(what, ": ", e.what());
  }
  auto it = bySource_.find(source);
  if (it != bySource_.end())
    return it->second.kernel;
  CompiledKernel k = compileKernel(source, arch_, what);
  ++(k.fromCache ? cached_ : compiled_);
  Loaded l;
  cudaError_t e = cudaLibraryLoadData(&l.library, k.cubin.data(), nullptr, nullptr, 0, nullptr,
                                      nullptr, 0);
  if (e != cudaSuccess)
    fail(what, ": loading its generated kernel (sm_", arch_, "): ", cudaGetErrorString(e));
  e = cudaLibraryGetKernel(&l.kernel, l.library, fz::kKernelEntry);
  if (e != cudaSuccess) {
    cudaLibraryUnload(l.library);
    fail(what, ": the generated kernel has no entry ", fz::kKernelEntry, ": ",
         cudaGetErrorString(e));
  }
  bySource_.emplace(std::move(source), l);
  return l.kernel;
}

void FusedKernels::run(CudaBackend &be, const KernelArgs &a) {
  auto it = calls_.find(&a.attrs);
  if (it == calls_.end() || it->second.text != a.attrs.getStr("program", ""))
    it = calls_.insert_or_assign(&a.attrs, prepare(a.attrs, a.numIn, "fused call")).first;
  Call &c = it->second;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const void *> ins;
  std::vector<void *> outs;
  bool sameStorage = c.kernel && c.inputs.size() == static_cast<size_t>(a.numIn) &&
                     c.results.size() == static_cast<size_t>(a.numOut);
  for (int k = 0; k < a.numIn; ++k) {
    sameStorage = sameStorage && c.inputs[k] == a.in[k].type.dtype;
    shapes.push_back(a.in[k].shape());
    ins.push_back(a.in[k].data);
  }
  for (int k = 0; k < a.numOut; ++k) {
    sameStorage = sameStorage && c.results[k] == a.out[k].type.dtype;
    outs.push_back(a.out[k].data);
  }
  if (!sameStorage) { // not bound, or a view stored otherwise than at bind
    fz::CodegenSpec spec{c.program, static_cast<int>(c.domain.size()), c.outputs, {}, {}};
    for (int k = 0; k < a.numIn; ++k)
      spec.inputs.push_back(a.in[k].type.dtype);
    for (int k = 0; k < a.numOut; ++k)
      spec.results.push_back(a.out[k].type.dtype);
    c.kernel = kernelFor(spec, c.what);
    c.inputs = spec.inputs;
    c.results = spec.results;
    c.width = fz::vectorWidth(spec);
  }
  fz::KernelParams params = fz::kernelParams(c.program, c.domain, shapes, ins, outs);
  if (params.n == 0 && params.outer == 0)
    return;
  // The block and grid of the kernel's loop (FusedDevice.h): one result
  // per block (rowLoop), one row per block (rowProgramLoop),
  // columnShape's results x rows (columnLoop), or one element, or one
  // vector of W, per thread.
  long long maxBlocks = static_cast<long long>(be.smCount()) * 32;
  dim3 block(256);
  long long blocks;
  if (!c.program.reduction() && !c.program.rowDims) {
    long long units = params.vec ? (params.n + c.width - 1) / c.width : params.n;
    blocks = (units + block.x - 1) / block.x;
  } else if (params.columns) {
    int x, y;
    fz::columnShape(params.outer, params.inner, x, y);
    block = dim3(x, y);
    blocks = (params.outer + x - 1) / x;
  } else {
    block = dim3(fz::reduceThreads(params.inner));
    blocks = params.outer;
  }
  blocks = std::max(1LL, std::min(blocks, maxBlocks));
  void *args[] = {&params};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = block;
  config.stream = be.stream();
  // A library's kernel launches by its handle as the function (as
  // cuda_runtime.h's cudaLaunchKernelEx overload for cudaKernel_t does).
  MAPP_CUDA_CHECK(cudaLaunchKernelExC(&config, reinterpret_cast<const void *>(c.kernel), args));
}

void cuda::fused(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  be.fusedKernels().run(be, a);
}
