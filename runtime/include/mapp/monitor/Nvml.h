//===- Nvml.h - Read-only GPU signals through NVML --------------*- C++ -*-===//
//
// SM clock (now and maximum), board power, temperature and throttle
// reasons of one GPU, for the live monitor's summaries. NVML is opened with
// dlopen (libnvidia-ml.so.1, the driver's), so nothing links against it and
// a host without a driver simply has no reader. Only query functions are
// resolved: the monitor never changes a GPU's settings. Compiled in with
// MAPP_MONITOR_NVML (default on Linux); without it open() returns null.
//
// The queries run on a sampler thread (every kSamplePeriodMs), never in the
// step: an NVML call is an ioctl into the driver, milliseconds under a
// sandboxed kernel (gVisor), which at 1.3B cost the monitor 0.7-2.5 % of
// the step when read inline.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_NVML_H
#define MAPP_MONITOR_NVML_H

#include "mapp/monitor/Summary.h"

#include <memory>
#include <string>

namespace mapp::monitor {

class NvmlReader {
public:
  /// NVML device `index` (NVML numbers GPUs in PCI order; with
  /// CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA ordinals match). Null with *why
  /// when NVML or the device is not there.
  static std::unique_ptr<NvmlReader> open(int index, std::string *why);
  ~NvmlReader();
  /// Fills the NVML fields of `s` from the newest sample (at most
  /// kSamplePeriodMs old) and sets HasNvml; false if a query failed (the
  /// fields it could not read stay -1 / 0).
  bool read(StepSummary &s);
  static constexpr int kSamplePeriodMs = 50;
  struct Impl;

private:
  explicit NvmlReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mapp::monitor

#endif
