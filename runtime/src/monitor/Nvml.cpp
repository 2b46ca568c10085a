//===- Nvml.cpp - NVML through dlopen, query functions only ---------------===//
#include "mapp/monitor/Nvml.h"

#if MAPP_MONITOR_NVML
#include <chrono>
#include <condition_variable>
#include <dlfcn.h>
#include <mutex>
#include <thread>
#endif

using namespace mapp::monitor;

#if MAPP_MONITOR_NVML
namespace {
// The few NVML declarations needed (nvml.h is not required to build).
using nvmlReturn_t = int;
using nvmlDevice_t = void *;
constexpr int kNvmlClockSm = 1;       // NVML_CLOCK_SM
constexpr int kNvmlTemperatureGpu = 0; // NVML_TEMPERATURE_GPU
} // namespace

namespace {
/// One reading of every signal (-1 / 0: not read).
struct Sample {
  float sm = -1, smMax = -1, powerW = -1, temperatureC = -1;
  unsigned long long throttle = 0;
  bool ok = false;
};
} // namespace

struct NvmlReader::Impl {
  void *lib = nullptr;
  nvmlDevice_t dev = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*maxClock)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned *) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long *) = nullptr;

  std::mutex mu;
  std::condition_variable wake;
  bool stop = false;
  Sample last; // guarded by mu
  std::thread sampler;

  Sample query() const;
  void startSampling() {
    last = query();
    sampler = std::thread([this] {
      std::unique_lock<std::mutex> l(mu);
      while (!wake.wait_for(l, std::chrono::milliseconds(kSamplePeriodMs),
                            [this] { return stop; })) {
        l.unlock();
        Sample s = query();
        l.lock();
        last = s;
      }
    });
  }
  ~Impl() {
    if (sampler.joinable()) {
      {
        std::lock_guard<std::mutex> l(mu);
        stop = true;
      }
      wake.notify_all();
      sampler.join();
    }
    if (shutdown)
      shutdown();
    if (lib)
      dlclose(lib);
  }
};

std::unique_ptr<NvmlReader> NvmlReader::open(int index, std::string *why) {
  auto impl = std::make_unique<Impl>();
  impl->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!impl->lib) {
    if (why)
      *why = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return nullptr;
  }
  auto sym = [&](const char *name) { return dlsym(impl->lib, name); };
  auto init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
  auto byIndex = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t *)>(
      sym("nvmlDeviceGetHandleByIndex_v2"));
  impl->clock = reinterpret_cast<decltype(impl->clock)>(
      sym("nvmlDeviceGetClockInfo"));
  impl->maxClock = reinterpret_cast<decltype(impl->maxClock)>(
      sym("nvmlDeviceGetMaxClockInfo"));
  impl->power = reinterpret_cast<decltype(impl->power)>(
      sym("nvmlDeviceGetPowerUsage"));
  impl->temperature = reinterpret_cast<decltype(impl->temperature)>(
      sym("nvmlDeviceGetTemperature"));
  impl->throttle = reinterpret_cast<decltype(impl->throttle)>(
      sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
  if (!init || !byIndex || !impl->clock) {
    if (why)
      *why = "libnvidia-ml.so.1 lacks nvmlInit_v2 / device queries";
    return nullptr;
  }
  if (init() != 0) {
    if (why)
      *why = "nvmlInit_v2 failed";
    return nullptr;
  }
  impl->shutdown =
      reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
  if (byIndex(static_cast<unsigned>(index), &impl->dev) != 0) {
    if (why)
      *why = "NVML has no device " + std::to_string(index);
    return nullptr;
  }
  impl->startSampling();
  return std::unique_ptr<NvmlReader>(new NvmlReader(std::move(impl)));
}

Sample NvmlReader::Impl::query() const {
  Sample s;
  s.ok = true;
  unsigned v = 0;
  if (clock && clock(dev, kNvmlClockSm, &v) == 0)
    s.sm = static_cast<float>(v);
  else
    s.ok = false;
  if (maxClock && maxClock(dev, kNvmlClockSm, &v) == 0)
    s.smMax = static_cast<float>(v);
  if (power && power(dev, &v) == 0)
    s.powerW = static_cast<float>(v) * 1e-3f; // milliwatts
  else
    s.ok = false;
  if (temperature && temperature(dev, kNvmlTemperatureGpu, &v) == 0)
    s.temperatureC = static_cast<float>(v);
  else
    s.ok = false;
  if (throttle && throttle(dev, &s.throttle) != 0)
    s.ok = false;
  return s;
}

bool NvmlReader::read(StepSummary &s) {
  Sample m;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    m = impl_->last;
  }
  if (m.sm >= 0)
    s.smClockMhz = m.sm;
  if (m.smMax >= 0)
    s.smClockMaxMhz = m.smMax;
  if (m.powerW >= 0)
    s.powerW = m.powerW;
  if (m.temperatureC >= 0)
    s.temperatureC = m.temperatureC;
  s.throttleReasons = m.throttle;
  s.flags |= StepSummary::HasNvml;
  return m.ok;
}
#else
struct NvmlReader::Impl {};
std::unique_ptr<NvmlReader> NvmlReader::open(int, std::string *why) {
  if (why)
    *why = "built without MAPP_MONITOR_NVML";
  return nullptr;
}
bool NvmlReader::read(StepSummary &) { return false; }
#endif

NvmlReader::NvmlReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvmlReader::~NvmlReader() = default;
