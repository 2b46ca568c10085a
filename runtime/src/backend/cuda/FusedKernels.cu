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
  return (in.kernel == MAPP_KERNEL_NAME(fused) ? "fused instruction " : in.kernel + " instruction ") +
         (in.name.empty() ? std::string() : "'" + in.name + "' ") + "(block " +
         std::to_string(block) + ", instruction " + std::to_string(index) + ", program '" +
         in.attrs.getStr("program", "") + "')";
}

/// The pointwise op a kernel of the vocabulary computes (grad_accumulate:
/// add), or null: not a pointwise kernel.
const fz::OpInfo *pointwiseOf(const std::string &kernel) {
  if (kernel == MAPP_KERNEL_NAME(grad_accumulate))
    return &fz::info(fz::Op::Add);
  const fz::OpInfo *info = fz::findOp(kernel);
  return info && !fz::isReduce(info->op) ? info : nullptr;
}

/// The one-statement program of pointwise kernel `op`, its immediate from
/// the call's attributes (as the compiler's statementOf takes it from the op).
std::string pointwiseProgram(fz::Op op, const Attrs &a) {
  fz::Program p;
  fz::Stmt &st = p.stmts.emplace_back();
  st.op = op;
  if (op == fz::Op::Pow)
    st.imm = a.getFloat("exponent", 1);
  else if (op == fz::Op::Scale)
    st.imm = a.getFloat("factor", 1);
  else if (op == fz::Op::Softcap || op == fz::Op::SoftcapGrad)
    st.imm = a.requireFloat("cap");
  else if (op == fz::Op::Gelu || op == fz::Op::GeluGrad)
    st.tanh = a.getStr("approximate", "none") == "tanh";
  for (int k = 0; k < fz::info(op).arity; ++k)
    st.args[k] = {true, k};
  return fz::print(p);
}

/// The domain of a pointwise call and its operands' shapes, from their
/// element counts (the first operand's is the domain's): [n] when every
/// operand has n, else [n / m, m] with the operand of m elements (add's
/// and mul's bias, a suffix of the first operand's shape) read as [m].
std::vector<int64_t> pointwiseShapes(const std::vector<int64_t> &numels,
                                     std::vector<std::vector<int64_t>> &shapes) {
  int64_t n = numels[0], m = n;
  for (int64_t k : numels)
    if (k != n)
      m = k;
  std::vector<int64_t> domain = m == n ? std::vector<int64_t>{n}
                                       : std::vector<int64_t>{m ? n / m : 0, m};
  shapes.clear();
  for (int64_t k : numels)
    shapes.push_back(k == n ? domain : std::vector<int64_t>{k});
  return domain;
}

} // namespace

FusedKernels::Call FusedKernels::prepare(const std::string &program, std::vector<int64_t> domain,
                                        std::vector<int64_t> outputs, int numInputs,
                                        const std::string &what) {
  Call c;
  c.what = what;
  c.text = program;
  std::string err = fz::parse(c.text, numInputs, c.program);
  if (!err.empty()) // a plan's were checked at load
    fail(what, ": ", err);
  c.domain = std::move(domain);
  c.outputs = std::move(outputs);
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
  int fusedCalls = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b)
    for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
      const Instr &in = p.blocks[b].instrs[i];
      bool isFused = in.kernel == MAPP_KERNEL_NAME(fused);
      const fz::OpInfo *pointwise = isFused ? nullptr : pointwiseOf(in.kernel);
      if (!isFused && !pointwise)
        continue;
      // grad_accumulate reads its output (the sum so far) and its input.
      std::vector<std::pair<int, bool>> operands;
      if (in.kernel == MAPP_KERNEL_NAME(grad_accumulate))
        operands.push_back({in.outputs[0], true});
      for (int v : in.inputs)
        operands.push_back({v, false});
      Call c;
      if (isFused) {
        c = prepare(in.attrs.getStr("program", ""), in.attrs.getInts("domain"),
                    in.attrs.getInts("outputs"), static_cast<int>(operands.size()),
                    describe(in, b, i));
        ++fusedCalls;
      } else {
        std::vector<int64_t> numels;
        for (auto [v, out] : operands)
          numels.push_back(p.values[v].type.numel());
        std::vector<std::vector<int64_t>> shapes;
        c = prepare(pointwiseProgram(pointwise->op, in.attrs), pointwiseShapes(numels, shapes),
                    {0}, static_cast<int>(operands.size()), describe(in, b, i));
      }
      std::vector<DType> inputs, results;
      for (auto [v, out] : operands)
        inputs.push_back(be.storedDType(p, in, v, out));
      for (int v : in.outputs)
        results.push_back(be.storedDType(p, in, v, true));
      bind(c, inputs, results);
      c.bound = true;
      calls_[&in.attrs] = std::move(c);
    }
  if (be.config().fuseLog && !calls_.empty())
    std::fprintf(stderr,
                 "mapp cuda fused: %d fused and %zu pointwise instructions, %zu kernels: %d "
                 "compiled (NVRTC, sm_%d), %d from the kernel cache %s, %.2f s\n",
                 fusedCalls, calls_.size() - fusedCalls, bySource_.size(), compiled_, arch_,
                 cached_, kernelCacheDir().c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void FusedKernels::bind(Call &c, const std::vector<DType> &inputs,
                        const std::vector<DType> &results) {
  if (c.kernel && c.inputs == inputs && c.results == results)
    return;
  fz::CodegenSpec spec{c.program, static_cast<int>(c.domain.size()), c.outputs, inputs, results};
  c.kernel = kernelFor(spec, c.what);
  c.inputs = inputs;
  c.results = results;
  c.width = fz::vectorWidth(spec);
}

FusedKernels::~FusedKernels() {
  for (auto &[source, l] : bySource_)
    cudaLibraryUnload(l.library); // errors at teardown are not actionable
}

cudaKernel_t FusedKernels::kernelFor(const fz::CodegenSpec &spec, const std::string &what) {
  // The entry names the program's ops (mapp_fused_silu_mul), so a profile
  // or the kernel census tells the regions apart.
  std::string entry = fz::kKernelEntry;
  for (const fz::Stmt &st : spec.program.stmts)
    if (entry.size() < 64)
      entry += std::string("_") + fz::info(st.op).name;
  std::string source;
  try {
    source = fz::generateKernel(spec, entry);
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
  e = cudaLibraryGetKernel(&l.kernel, l.library, entry.c_str());
  if (e != cudaSuccess) {
    cudaLibraryUnload(l.library);
    fail(what, ": the generated kernel has no entry ", entry, ": ", cudaGetErrorString(e));
  }
  bySource_.emplace(std::move(source), l);
  return l.kernel;
}

void FusedKernels::run(CudaBackend &be, const KernelArgs &a) {
  auto it = calls_.find(&a.attrs);
  if (it == calls_.end() || it->second.text != a.attrs.getStr("program", ""))
    it = calls_
             .insert_or_assign(&a.attrs, prepare(a.attrs.getStr("program", ""),
                                                 a.attrs.getInts("domain"),
                                                 a.attrs.getInts("outputs"), a.numIn, "fused call"))
             .first;
  Call &c = it->second;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const void *> ins;
  std::vector<void *> outs;
  std::vector<DType> inTypes, outTypes;
  for (int k = 0; k < a.numIn; ++k) {
    shapes.push_back(a.in[k].shape());
    ins.push_back(a.in[k].data);
    inTypes.push_back(a.in[k].type.dtype);
  }
  for (int k = 0; k < a.numOut; ++k) {
    outs.push_back(a.out[k].data);
    outTypes.push_back(a.out[k].type.dtype);
  }
  bind(c, inTypes, outTypes); // a call not bound, or a view stored otherwise than at bind
  launch(be, c, shapes, ins, outs);
}

void FusedKernels::runPointwise(CudaBackend &be, const KernelArgs &a, fz::Op op,
                                bool accumulate) {
  std::vector<const Tensor *> operands;
  if (accumulate)
    operands.push_back(&a.out[0]);
  for (int k = 0; k < a.numIn; ++k)
    operands.push_back(&a.in[k]);
  std::vector<int64_t> numels;
  std::vector<const void *> ins;
  std::vector<DType> inTypes;
  for (const Tensor *t : operands) {
    numels.push_back(t->numel());
    ins.push_back(t->data);
    inTypes.push_back(t->type.dtype);
  }
  if (!numels[0])
    return;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> domain = pointwiseShapes(numels, shapes);
  // A plan's instruction was prepared at bind; another call (a kernel
  // test's, whose attributes may reuse an address) is prepared anew.
  auto it = calls_.find(&a.attrs);
  if (it == calls_.end() || !it->second.bound || it->second.domain != domain) {
    Call c = prepare(pointwiseProgram(op, a.attrs), domain, {0},
                     static_cast<int>(operands.size()), std::string(fz::info(op).name) + " call");
    if (it != calls_.end() && it->second.text == c.text && it->second.domain == domain)
      c = std::move(it->second); // keeps its kernel
    it = calls_.insert_or_assign(&a.attrs, std::move(c)).first;
  }
  Call &c = it->second;
  bind(c, inTypes, {a.out[0].type.dtype});
  launch(be, c, shapes, ins, {a.out[0].data});
}

void FusedKernels::launch(CudaBackend &be, const Call &c,
                          const std::vector<std::vector<int64_t>> &shapes,
                          const std::vector<const void *> &ins, const std::vector<void *> &outs) {
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

// The pointwise kernels of the vocabulary, generated (FusedKernels::runPointwise).
#define MAPP_CUDA_POINTWISE(name, op)                                          \
  void cuda::name(const KernelArgs &a) {                                       \
    CudaBackend &be = backendOf(a);                                            \
    be.fusedKernels().runPointwise(be, a, fz::Op::op);                         \
  }
MAPP_CUDA_POINTWISE(neg, Neg)
MAPP_CUDA_POINTWISE(abs, Abs)
MAPP_CUDA_POINTWISE(sign, Sign)
MAPP_CUDA_POINTWISE(exp, Exp)
MAPP_CUDA_POINTWISE(log, Log)
MAPP_CUDA_POINTWISE(sqrt, Sqrt)
MAPP_CUDA_POINTWISE(rsqrt, Rsqrt)
MAPP_CUDA_POINTWISE(tanh, Tanh)
MAPP_CUDA_POINTWISE(sin, Sin)
MAPP_CUDA_POINTWISE(cos, Cos)
MAPP_CUDA_POINTWISE(sigmoid, Sigmoid)
MAPP_CUDA_POINTWISE(silu, Silu)
MAPP_CUDA_POINTWISE(pow, Pow)
MAPP_CUDA_POINTWISE(scale, Scale)
MAPP_CUDA_POINTWISE(softcap, Softcap)
MAPP_CUDA_POINTWISE(gelu, Gelu)
MAPP_CUDA_POINTWISE(add, Add)
MAPP_CUDA_POINTWISE(mul, Mul)
MAPP_CUDA_POINTWISE(sub, Sub)
MAPP_CUDA_POINTWISE(div, Div)
MAPP_CUDA_POINTWISE(maximum, Maximum)
MAPP_CUDA_POINTWISE(minimum, Minimum)
MAPP_CUDA_POINTWISE(lt, Lt)
MAPP_CUDA_POINTWISE(le, Le)
MAPP_CUDA_POINTWISE(gt, Gt)
MAPP_CUDA_POINTWISE(ge, Ge)
MAPP_CUDA_POINTWISE(eq, Eq)
MAPP_CUDA_POINTWISE(ne, Ne)
MAPP_CUDA_POINTWISE(silu_grad, SiluGrad)
MAPP_CUDA_POINTWISE(gelu_grad, GeluGrad)
MAPP_CUDA_POINTWISE(softcap_grad, SoftcapGrad)
MAPP_CUDA_POINTWISE(select, Select)
#undef MAPP_CUDA_POINTWISE

void cuda::grad_accumulate(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  be.fusedKernels().runPointwise(be, a, fz::Op::Add, /*accumulate=*/true);
}
