//===- MemoryReport.h - what a rank allocated against its plan -*- C++ -*-===//
#ifndef MAPP_RT_MEMORYREPORT_H
#define MAPP_RT_MEMORYREPORT_H

#include <string>

namespace mapp::rt {

class Executor;

/// One line (mapp-run --report-memory): the storage the rank's backend
/// allocated (its own count, where the backend keeps one) beside the plan's
/// figures (persistent pool + slots × arena), so a test can check that a
/// smaller memory plan (--mapp-recompute) is what the runtime allocates.
///   rank R memory: allocated A B (peak P B); plan persistent X B +
///   S slot(s) x arena Y B = Z B
std::string memoryReport(const Executor &exec, int rank);

} // namespace mapp::rt

#endif
