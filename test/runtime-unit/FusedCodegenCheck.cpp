//===- FusedCodegenCheck.cpp - the fused kernel generator against the CPU -===//
//
// The independent check of the generated kernels (docs/fusion.md) without a
// GPU: every case's generated source, emitted for the host (the same text
// NVRTC gets, with host loops in the device loops' order), is compiled by
// the host C++ compiler into one shared object, run on random inputs and
// compared bit for bit with the CPU evaluator (cpu::fused), for f32, bf16
// and mixed storage; a kernel that took the vector path (KernelParams::vec)
// runs again from misaligned pointers (the scalar path). With --nvrtc,
// every generated kernel is also compiled by NVRTC for sm_90 (no GPU
// needed; the mixed-storage variant, which holds both kinds of load and
// store); without libnvrtc that part prints SKIP and exits 77.
//
//   mapp-fused-codegen-check --cxx c++ --work DIR [--cases FILE] [--nvrtc]
//
// Cases: the built-in edge cases (every op of MAPP_FUSED_OPS, broadcasts
// along every dim, reductions over leading/middle/trailing dims, the column
// loop's block widths, scalar tails after the vectors, row programs:
// norms with reduce_sums in the middle) and FILE's
// lines `program<TAB>domain<TAB>outputs<TAB>shape;shape...` (dims joined by
// x, `-` for a scalar), written by test/python/test_fused_codegen.py from
// the fusion lit tests and the fused models.
//
//===----------------------------------------------------------------------===//
#include "FusedCases.h"
#include "backend/KernelCompiler.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/FusedCodegen.h"
#include "mapp/rt/Kernels.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

using namespace mapp::rt;
using namespace mapp::fusedtest;
namespace fz = mapp::rt::fused;

namespace {

/// Storage variants: all f32, all bf16, mixed (alternating, the results
/// the other way round from the operands).
std::vector<DType> storage(size_t n, int variant, bool results) {
  std::vector<DType> v(n);
  for (size_t k = 0; k < n; ++k)
    v[k] = variant == 0 ? DType::F32 : variant == 1 ? DType::BF16
                                     : ((k % 2 != 0) != results ? DType::F32 : DType::BF16);
  return v;
}

struct Prepared {
  Case c;
  fz::Program prog;
  int variant;
  fz::CodegenSpec spec;
};

bool sameBits(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, DType t,
              std::string &where) {
  size_t es = dtypeSize(t);
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) == 0)
      continue;
    float x, y;
    if (t == DType::F32) {
      std::memcpy(&x, &a[i], 4);
      std::memcpy(&y, &b[i], 4);
    } else {
      uint16_t u, v;
      std::memcpy(&u, &a[i], 2);
      std::memcpy(&v, &b[i], 2);
      x = bf16ToFloat(u);
      y = bf16ToFloat(v);
    }
    if (std::isnan(x) && std::isnan(y))
      continue;
    char buf[120];
    std::snprintf(buf, sizeof buf, "element %zu: generated %.9g, CPU evaluator %.9g", i / es, x, y);
    where = buf;
    return false;
  }
  return true;
}

} // namespace

int main(int argc, char **argv) {
  std::string cxx, work, casesFile;
  bool nvrtc = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cxx" && i + 1 < argc)
      cxx = argv[++i];
    else if (a == "--work" && i + 1 < argc)
      work = argv[++i];
    else if (a == "--cases" && i + 1 < argc)
      casesFile = argv[++i];
    else if (a == "--nvrtc")
      nvrtc = true;
    else {
      std::cerr << "usage: mapp-fused-codegen-check --cxx CXX --work DIR [--cases FILE] [--nvrtc]\n";
      return 2;
    }
  }
  std::vector<Case> cases = builtinCases();
  if (!casesFile.empty()) {
    std::string err;
    if (!readCases(casesFile, cases, err)) {
      std::cerr << err << "\n";
      return 2;
    }
  }
  std::vector<Prepared> all;
  for (const Case &c : cases) {
    fz::Program prog;
    std::string err = fz::parse(c.program, static_cast<int>(c.inputs.size()), prog);
    if (!err.empty()) {
      std::cerr << "FAIL bad case '" << c.program << "': " << err << "\n";
      return 1;
    }
    for (int variant = 0; variant < 3; ++variant) {
      fz::CodegenSpec spec{prog, static_cast<int>(c.domain.size()), c.outputs,
                           storage(c.inputs.size(), variant, false),
                           storage(c.outputs.size(), variant, true)};
      all.push_back({c, prog, variant, spec});
    }
  }

  if (nvrtc) {
    std::string why;
    if (!Nvrtc::load(why)) {
      std::cout << "SKIP: " << why;
      return 77;
    }
    // One NVRTC program holding every kernel (each under its own entry,
    // the rest of the text as the runtime compiles it): one compile.
    std::string tu;
    int kernels = 0;
    for (size_t k = 0; k < all.size(); ++k)
      if (all[k].variant == 2) { // the mixed variant: both loads and both stores
        tu += fz::generateKernel(all[k].spec, "case" + std::to_string(k));
        ++kernels;
      }
    std::string cubin, log;
    const Nvrtc *lib = Nvrtc::load(why);
    if (!lib->compile(tu, "fused_cases.cu", 90, cubin, log)) {
      std::cout << "FAIL NVRTC " << lib->version() << ":\n" << log << "\n";
      return 1;
    }
    // The cache: a second compile is a read; a damaged entry is compiled
    // again (never loaded); a compile error names the instruction and
    // carries NVRTC's log.
    setenv("MAPP_KERNEL_CACHE", (work + "/kernel-cache").c_str(), 1);
    std::filesystem::remove_all(work + "/kernel-cache");
    std::string small = fz::generateKernel(all[0].spec);
    bool first = compileKernel(small, 90, "case 0").fromCache;
    bool second = compileKernel(small, 90, "case 0").fromCache;
    std::string damaged, cmd = "for f in " + work + "/kernel-cache/*.cubin; do printf x > $f; done";
    if (std::system(cmd.c_str()) != 0)
      damaged = "(could not damage the cache)";
    CompiledKernel third = compileKernel(small, 90, "case 0");
    if (first || !second || third.fromCache || third.cubin.empty() || !damaged.empty()) {
      std::cout << "FAIL the kernel cache: first compile from cache " << first << ", second "
                << second << ", after damage " << third.fromCache << " " << damaged << "\n";
      return 1;
    }
    try {
      compileKernel(small + "\nthis is not C++;\n", 90, "fused instruction 'broken'");
      std::cout << "FAIL a source that does not compile was accepted\n";
      return 1;
    } catch (const std::exception &e) {
      std::string m = e.what();
      if (m.find("fused instruction 'broken'") == std::string::npos ||
          m.find("error") == std::string::npos) {
        std::cout << "FAIL the compile error does not name the instruction or show the log: " << m
                  << "\n";
        return 1;
      }
    }
    std::cout << "PASS: " << kernels << " generated kernels compile with NVRTC " << lib->version()
              << " for sm_90 (" << cubin.size() << " bytes of cubin); the kernel cache reads, "
              << "recompiles a damaged entry; a compile error names the instruction\n";
    return 0;
  }

  // One translation unit for every case (one compiler run).
  std::string tu = "#define MAPP_FUSED_HOST 1\n";
  for (size_t k = 0; k < all.size(); ++k)
    tu += fz::generateKernel(all[k].spec, "case" + std::to_string(k), /*host=*/true);
  std::string src = work + "/fused_cases.cpp", lib = work + "/fused_cases.so";
  std::ofstream(src) << tu;
  // -O1 and no contraction: the CPU evaluator's arithmetic (no FMA on x86-64 by default).
  std::string cmd = cxx + " -std=c++17 -O1 -ffp-contract=off -shared -fPIC -o " + lib + " " + src;
  if (std::system(cmd.c_str()) != 0) {
    std::cout << "FAIL the generated host source does not compile: " << cmd << "\n";
    return 1;
  }
  void *so = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    std::cout << "FAIL dlopen " << lib << ": " << dlerror() << "\n";
    return 1;
  }
  auto cpu = createCpuBackend(1);
  KernelFn reference = cpu->lookup("fused");
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-2.5f, 2.5f);
  int failures = 0, vecRuns = 0, broadcastVecRuns = 0, columnRuns = 0, rowRuns = 0,
      affineRowRuns = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    const Prepared &p = all[k];
    using Entry = void (*)(const fz::KernelParams *);
    auto entry = reinterpret_cast<Entry>(dlsym(so, ("case" + std::to_string(k)).c_str()));
    std::vector<std::vector<uint8_t>> inBuf, outGen, outRef;
    std::vector<Tensor> ins, refOuts;
    std::vector<const void *> inPtr;
    std::vector<void *> genPtr;
    for (size_t i = 0; i < p.c.inputs.size(); ++i) {
      TensorType t{p.spec.inputs[i], p.c.inputs[i]};
      inBuf.emplace_back(t.numel() * dtypeSize(t.dtype));
      for (int64_t e = 0; e < t.numel(); ++e) {
        float v = dist(rng);
        if (t.dtype == DType::BF16) {
          uint16_t h = floatToBf16(v);
          std::memcpy(&inBuf.back()[e * 2], &h, 2);
        } else {
          std::memcpy(&inBuf.back()[e * 4], &v, 4);
        }
      }
    }
    for (size_t i = 0; i < p.c.inputs.size(); ++i) {
      ins.push_back({inBuf[i].data(), {p.spec.inputs[i], p.c.inputs[i]}});
      inPtr.push_back(inBuf[i].data());
    }
    for (size_t o = 0; o < p.c.outputs.size(); ++o) {
      TensorType t{p.spec.results[o], resultShape(p.prog, p.c.domain, p.c.outputs[o])};
      outGen.emplace_back(t.numel() * dtypeSize(t.dtype), 0xAB);
      outRef.emplace_back(t.numel() * dtypeSize(t.dtype), 0xCD);
      refOuts.push_back({outRef.back().data(), t});
      genPtr.push_back(outGen.back().data());
    }
    Attrs attrs;
    attrs.setStr("program", p.c.program);
    attrs.setInts("domain", p.c.domain);
    attrs.setInts("outputs", p.c.outputs);
    KernelContext ctx;
    ctx.pool = &cpu->pool();
    reference({attrs, ins.data(), static_cast<int>(ins.size()), refOuts.data(),
               static_cast<int>(refOuts.size()), ctx});
    std::vector<Shape> shapes(p.c.inputs.begin(), p.c.inputs.end());
    fz::KernelParams params = fz::kernelParams(p.prog, p.c.domain, shapes, inPtr, genPtr);
    // Every result bit-equal to the CPU evaluator's; `how` names the run.
    auto compare = [&](const char *how) {
      for (size_t o = 0; o < outGen.size(); ++o) {
        std::string where;
        if (!sameBits(outGen[o], outRef[o], p.spec.results[o], where)) {
          std::cout << "FAIL '" << p.c.program << "' storage variant " << p.variant << how
                    << " result " << o << ": " << where << "\n";
          ++failures;
          return false;
        }
      }
      return true;
    };
    entry(&params);
    vecRuns += params.vec;
    for (size_t i = 0; params.vec && i < inBuf.size(); ++i)
      if (params.vecMode[i] != 0) {
        ++broadcastVecRuns;
        break;
      }
    columnRuns += params.columns;
    rowRuns += p.prog.rowDims > 0;
    affineRowRuns += params.rowAffine;
    if (!compare(params.vec ? " (vector path)" : params.rowAffine ? " (row-affine path)" : ""))
      continue;
    if (params.rowAffine) {
      // Again by the coordinates (KernelParams::rowAffine off), the path of
      // operands broadcast in the middle of the rows' dims.
      fz::KernelParams byCoordinates = params;
      byCoordinates.rowAffine = 0;
      for (std::vector<uint8_t> &o : outGen)
        std::fill(o.begin(), o.end(), 0xAB);
      entry(&byCoordinates);
      compare(" (row program by coordinates)");
      continue;
    }
    if (!params.vec)
      continue;
    // Again from pointers one element past a 16-byte boundary: the scalar
    // path must take the whole domain (KernelParams::vec off).
    std::vector<std::vector<uint8_t>> inShift, outShift;
    std::vector<const void *> inP;
    std::vector<void *> outP;
    for (size_t i = 0; i < inBuf.size(); ++i) {
      size_t es = dtypeSize(p.spec.inputs[i]);
      inShift.emplace_back(inBuf[i].size() + es);
      std::memcpy(inShift.back().data() + es, inBuf[i].data(), inBuf[i].size());
      inP.push_back(inShift.back().data() + es);
    }
    for (size_t o = 0; o < outGen.size(); ++o) {
      size_t es = dtypeSize(p.spec.results[o]);
      outShift.emplace_back(outGen[o].size() + es, 0xAB);
      outP.push_back(outShift.back().data() + es);
    }
    fz::KernelParams shifted = fz::kernelParams(p.prog, p.c.domain, shapes, inP, outP);
    if (shifted.vec) {
      std::cout << "FAIL '" << p.c.program << "': misaligned pointers take the vector path\n";
      ++failures;
      continue;
    }
    entry(&shifted);
    for (size_t o = 0; o < outGen.size(); ++o)
      std::memcpy(outGen[o].data(), static_cast<uint8_t *>(outP[o]), outGen[o].size());
    compare(" (misaligned, scalar path)");
  }
  if (failures)
    return 1;
  // The built-in cases hold both new loops (an injected expectation: the
  // checks above must have run them).
  if (vecRuns == 0 || broadcastVecRuns == 0 || columnRuns == 0 || rowRuns == 0 ||
      affineRowRuns == 0 || affineRowRuns == rowRuns) {
    std::cout << "FAIL the cases ran " << vecRuns << " kernels on the vector path ("
              << broadcastVecRuns << " with a broadcast), " << columnRuns
              << " column reductions and " << rowRuns << " row programs, " << affineRowRuns
              << " of them row-affine (each must be > 0, and some row programs not "
                 "row-affine)\n";
    return 1;
  }
  std::cout << "PASS: " << all.size() << " generated kernels (" << cases.size()
            << " programs x f32/bf16/mixed storage) bit-equal to the CPU evaluator ("
            << vecRuns << " on the vector path (" << broadcastVecRuns
            << " with a broadcast), also misaligned; " << columnRuns
            << " column reductions; " << rowRuns << " row programs, " << affineRowRuns
            << " row-affine, also by coordinates)\n";
  return 0;
}
