//===- LiveMonitor.h - mapp-run --monitor: MegaScan live --------*- C++ -*-===//
//
// Every rank reduces each step to a StepSummary (mapp/monitor/Summary.h),
// built by a tap on its trace writer (the rank's own --trace-dir writer, or
// a writer without a file when there is none), adds its GPU's NVML fields
// on CUDA, and sends it to the monitor rank (rank 0) over the job's own
// communicator: one fixed-size buffered send per step. The monitor rank
// keeps one posted receive per rank and only tests them after its step
// (never blocks on a rank), feeds the summaries to the WindowDiagnoser and
// writes its alerts (mapp/monitor/AlertLog.h). A rank whose summaries stop
// is named by the diagnoser (missing-summaries) once it is `missingAfter`
// steps behind; at the end the monitor waits at most `drainS` seconds for
// the last summaries. See docs/mapp-scan.md, "Live monitor".
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_LIVEMONITOR_H
#define MAPP_RT_LIVEMONITOR_H

#include "mapp/monitor/AlertLog.h"
#include "mapp/monitor/Diagnoser.h"
#include "mapp/monitor/Nvml.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Faults.h"
#include "mapp/trace/TraceWriter.h"

#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

/// The tag of summary messages (below MPI's guaranteed tag bound 32767 and
/// above the plan's pipeline tags of any plan the runtime has run).
constexpr int64_t kMonitorTag = 32001;

struct LiveMonitorOptions {
  std::string path; // alerts (JSON lines); written by the monitor rank
  monitor::MonitorOptions diagnosis;
  std::vector<Injection> inject; // monitor-silence faults
  double drainS = 5;             // end of run: wait for the last summaries
  bool nvml = false;             // read NVML (CUDA backends)
  int device = 0;                // NVML device index
  int tp = 0, dp = 0, pp = 0;    // this rank's coordinates
  /// The trace marks resolve after the step (CUDA events): summaries of
  /// step s are complete two steps later.
  bool deferredMarks = false;
};

class LiveMonitor : public mapp::TraceTap {
public:
  /// On the monitor rank, opens the alert file: Error naming it when it
  /// cannot be written (before any step ran).
  LiveMonitor(Communicator &comm, LiveMonitorOptions opts);
  ~LiveMonitor() override;

  /// The writer the executor should trace into when there is no
  /// --trace-dir (records reach this tap only).
  mapp::MappTraceWriter &tapOnlyWriter();

  void onGroup(int id, const std::string &kind,
               const std::vector<int> &members) override;
  void onRecord(const mapp::TraceRecord &r) override;

  /// After training step `step`: sends the newest complete summary; on the
  /// monitor rank also takes what arrived and writes new alerts.
  void afterStep(int64_t step);
  /// After the last step (the trace flushed): sends what remains and an end
  /// marker; the monitor rank drains (bounded by drainS) and finishes.
  void finish();

  /// Monitor rank: alerts written so far.
  size_t alertsWritten() const { return log_ ? log_->written() : 0; }

private:
  void send(const monitor::StepSummary &s);
  void receive(bool wait);
  void emit(const std::vector<monitor::Alert> &alerts);
  bool silent(int64_t step) const;

  Communicator &comm_;
  LiveMonitorOptions opts_;
  const int rank_, world_;
  monitor::Summarizer summarizer_;
  std::unique_ptr<monitor::NvmlReader> nvml_;
  std::unique_ptr<mapp::MappTraceWriter> tapWriter_;
  int64_t sentThrough_ = -1; // newest step summarized
  int64_t step_ = -1;
  // Monitor rank.
  std::unique_ptr<monitor::AlertLog> log_;
  std::unique_ptr<monitor::WindowDiagnoser> diag_;
  std::vector<monitor::StepSummary> inbox_; // one posted buffer per rank
  std::vector<P2PHandle> posted_;
  std::vector<char> ended_;
  size_t received_ = 0, withNvml_ = 0;
  monitor::StepSummary lastNvml_;
  void count(const monitor::StepSummary &s);
};

class Executor;

/// mapp-run's hook: a monitor for `exec`'s rank that sees every record of
/// every step -- through `trace` (the rank's --trace-dir writer) when there
/// is one, else through a writer of its own that has no file. Null when
/// `path` is empty. Error when the alert file cannot be written.
std::unique_ptr<LiveMonitor>
attachLiveMonitor(Executor &exec, Communicator &comm, const std::string &path,
                  const std::vector<Injection> &inject, bool cuda, int device,
                  mapp::MappTraceWriter *trace);

} // namespace mapp::rt

#endif
