//===- KernelCompiler.cpp - NVRTC and the kernel cache --------------------===//
#include "backend/KernelCompiler.h"
#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

using namespace mapp::rt;

// nvrtc.h's types, declared here so the runtime builds without the toolkit.
struct Nvrtc::Api {
  using Program = void *;
  using Result = int; // nvrtcResult; 0 is NVRTC_SUCCESS
  void *lib = nullptr;
  Result (*version)(int *, int *) = nullptr;
  const char *(*errorString)(Result) = nullptr;
  Result (*create)(Program *, const char *, const char *, int, const char *const *,
                   const char *const *) = nullptr;
  Result (*destroy)(Program *) = nullptr;
  Result (*compile)(Program, int, const char *const *) = nullptr;
  Result (*logSize)(Program, size_t *) = nullptr;
  Result (*log)(Program, char *) = nullptr;
  Result (*cubinSize)(Program, size_t *) = nullptr;
  Result (*cubin)(Program, char *) = nullptr;
};

namespace {

template <typename F> bool resolve(void *lib, F &fn, const char *name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

/// 64-bit FNV-1a: the cache file's name (the entry holds the whole key,
/// compared on read, so a collision costs a compile, never a wrong kernel).
uint64_t fnv1a(const std::string &s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s)
    h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool makeDirs(const std::string &dir) {
  for (size_t p = 1; p <= dir.size(); ++p)
    if (p == dir.size() || dir[p] == '/') {
      std::string part = dir.substr(0, p);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        return false;
    }
  return true;
}

} // namespace

const Nvrtc *Nvrtc::load(std::string &why) {
  static std::once_flag once;
  static Nvrtc nvrtc;
  static Api api;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (const char *explicitLib = std::getenv("MAPP_NVRTC_LIB"))
      names.push_back(explicitLib);
    for (const char *n : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
      names.push_back(n);
    std::string errors;
    for (const std::string &n : names) {
      void *lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        const char *e = dlerror();
        errors += "  " + n + ": " + (e ? e : "not found") + "\n";
        continue;
      }
      api.lib = lib;
      if (resolve(lib, api.version, "nvrtcVersion") &&
          resolve(lib, api.errorString, "nvrtcGetErrorString") &&
          resolve(lib, api.create, "nvrtcCreateProgram") &&
          resolve(lib, api.destroy, "nvrtcDestroyProgram") &&
          resolve(lib, api.compile, "nvrtcCompileProgram") &&
          resolve(lib, api.logSize, "nvrtcGetProgramLogSize") &&
          resolve(lib, api.log, "nvrtcGetProgramLog") &&
          resolve(lib, api.cubinSize, "nvrtcGetCUBINSize") &&
          resolve(lib, api.cubin, "nvrtcGetCUBIN")) {
        nvrtc.api_ = &api;
        return;
      }
      errors += "  " + n + ": lacks an NVRTC entry point (NVRTC 11.1 or newer needed)\n";
      dlclose(lib);
    }
    failure = "NVRTC (libnvrtc) is not available; the CUDA backend compiles the "
              "kernels of mapp.fused with it (install the CUDA toolkit's nvrtc or set "
              "MAPP_NVRTC_LIB):\n" + errors;
  });
  why = failure;
  return nvrtc.api_ ? &nvrtc : nullptr;
}

std::string Nvrtc::version() const {
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

bool Nvrtc::compile(const std::string &source, const std::string &name, int arch,
                    std::string &cubin, std::string &log) const {
  Api::Program prog = nullptr;
  Api::Result r = api_->create(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  if (r != 0) {
    log = std::string("nvrtcCreateProgram: ") + api_->errorString(r);
    return false;
  }
  // --fmad=false: a*b+c rounds twice, as on the CPU (bit-equal statements).
  std::string archOpt = "--gpu-architecture=sm_" + std::to_string(arch);
  const char *opts[] = {archOpt.c_str(), "--std=c++17", "--fmad=false"};
  r = api_->compile(prog, 3, opts);
  size_t n = 0;
  api_->logSize(prog, &n);
  log.assign(n, '\0');
  if (n)
    api_->log(prog, log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n'))
    log.pop_back();
  bool ok = r == 0;
  if (ok) {
    api_->cubinSize(prog, &n);
    cubin.assign(n, '\0');
    ok = api_->cubin(prog, cubin.data()) == 0 && n > 0;
  } else if (log.empty()) {
    log = std::string("nvrtcCompileProgram: ") + api_->errorString(r);
  }
  api_->destroy(&prog);
  return ok;
}

std::string mapp::rt::kernelCacheDir() {
  if (const char *d = std::getenv("MAPP_KERNEL_CACHE"); d && *d)
    return d;
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/mapp/kernels";
  if (const char *h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/mapp/kernels";
  return "";
}

CompiledKernel mapp::rt::compileKernel(const std::string &source, int arch,
                                       const std::string &what) {
  std::string why;
  const Nvrtc *nvrtc = Nvrtc::load(why);
  if (!nvrtc)
    fail(what, ": ", why);
  // The entry: the key's length, the key (arch, NVRTC version, source), the cubin.
  std::string key = "sm_" + std::to_string(arch) + "\nnvrtc " + nvrtc->version() + "\n" + source;
  std::string dir = kernelCacheDir();
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.cubin", static_cast<unsigned long long>(fnv1a(key)));
  std::string path = dir.empty() ? "" : dir + "/" + name;
  CompiledKernel k;
  std::string entry;
  if (!path.empty() && readRegularFile(path, entry, why) && entry.size() > 8) {
    uint64_t len = 0;
    std::memcpy(&len, entry.data(), 8);
    if (len == key.size() && entry.size() > 8 + len && entry.compare(8, len, key) == 0) {
      k.cubin = entry.substr(8 + len);
      k.fromCache = true;
      return k;
    }
  }
  std::string log;
  if (!nvrtc->compile(source, "mapp_fused.cu", arch, k.cubin, log))
    fail(what, ": the generated kernel does not compile (NVRTC ", nvrtc->version(), ", sm_", arch,
         "):\n", log, "\n--- source ---\n", source);
  if (path.empty())
    return k;
  uint64_t len = key.size();
  entry.assign(reinterpret_cast<const char *>(&len), 8);
  entry += key;
  entry += k.cubin;
  try {
    if (!makeDirs(dir))
      fail("cannot create ", dir, ": ", std::strerror(errno));
    writeFileAtomic(path, entry.data(), entry.size());
  } catch (const std::exception &e) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "mapp: the kernel cache is not written (%s); set MAPP_KERNEL_CACHE "
                           "to a writable folder to skip recompiling\n", e.what());
  }
  return k;
}
