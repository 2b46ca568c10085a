//===- Nvml.cpp - NVML through dlopen, query functions only ---------------===//
#include "mapp/monitor/Nvml.h"

#if MAPP_MONITOR_NVML
#include <dlfcn.h>
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

struct NvmlReader::Impl {
  void *lib = nullptr;
  nvmlDevice_t dev = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*maxClock)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned *) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned *) = nullptr;
  nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long *) = nullptr;
  ~Impl() {
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
  return std::unique_ptr<NvmlReader>(new NvmlReader(std::move(impl)));
}

bool NvmlReader::read(StepSummary &s) {
  Impl &m = *impl_;
  bool ok = true;
  unsigned v = 0;
  if (m.clock && m.clock(m.dev, kNvmlClockSm, &v) == 0)
    s.smClockMhz = static_cast<float>(v);
  else
    ok = false;
  if (m.maxClock && m.maxClock(m.dev, kNvmlClockSm, &v) == 0)
    s.smClockMaxMhz = static_cast<float>(v);
  if (m.power && m.power(m.dev, &v) == 0)
    s.powerW = static_cast<float>(v) * 1e-3f; // milliwatts
  else
    ok = false;
  if (m.temperature && m.temperature(m.dev, kNvmlTemperatureGpu, &v) == 0)
    s.temperatureC = static_cast<float>(v);
  else
    ok = false;
  unsigned long long bits = 0;
  if (m.throttle && m.throttle(m.dev, &bits) == 0)
    s.throttleReasons = bits;
  else
    ok = false;
  s.flags |= StepSummary::HasNvml;
  return ok;
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
