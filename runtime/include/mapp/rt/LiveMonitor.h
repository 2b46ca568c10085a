//===- LiveMonitor.h - mapp-run --monitor: MegaScan live --------*- C++ -*-===//
//
// Every rank reduces each step to a StepSummary (mapp/monitor/Summary.h),
// built by a tap on its trace writer (the rank's own --trace-dir writer, or
// a writer without a file when there is none), adds its GPU's NVML fields
// on CUDA, and sends it to the monitor rank (rank 0) over the job's own
// communicator: one fixed-size buffered send per `every` steps (a batch of
// that many summaries; --monitor-every). The monitor rank
// keeps one posted receive per rank and only tests them after its step
// (never blocks on a rank), feeds the summaries to the WindowDiagnoser and
// writes its alerts (mapp/monitor/AlertLog.h). A rank whose summaries stop
// is named by the diagnoser (missing-summaries) once it is `missingAfter`
// steps behind; at the end the monitor waits at most `drainS` seconds for
// the last summaries. With `verdictsToScheduler` the monitor rank sends
// each slow-link verdict (and its recovery) to the link's receiving rank,
// whose adaptive scheduler takes it besides its own estimate
// (--monitor-to-dpp). See docs/mapp-scan.md, "Live monitor".
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

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

/// The tag of summary messages (below MPI's guaranteed tag bound 32767 and
/// above the plan's pipeline tags of any plan the runtime has run).
constexpr int64_t kMonitorTag = 32001;
/// The tag of the monitor rank's link verdicts to a link's receiver.
constexpr int64_t kMonitorVerdictTag = 32002;
/// The most summaries one message batches (--monitor-every).
constexpr int kMaxMonitorEvery = 64;

struct LiveMonitorOptions {
  std::string path; // alerts (JSON lines); written by the monitor rank
  bool append = false; // an elastic restart continues the file
  monitor::MonitorOptions diagnosis;
  std::vector<Injection> inject; // monitor-silence faults
  double drainS = 5;             // end of run: wait for the last summaries
  bool nvml = false;             // read NVML (CUDA backends)
  int device = 0;                // NVML device index
  int tp = 0, dp = 0, pp = 0;    // this rank's coordinates
  /// The job's degrees (Megatron order; 0: unknown), for the pipeline
  /// direction of transfers in the exposed-communication classes.
  int tpSize = 0, dpSize = 0, ppSize = 0;
  /// The trace marks resolve after the step (CUDA events): summaries of
  /// step s are complete two steps later.
  bool deferredMarks = false;
  int every = 1; // summaries per message (1..kMaxMonitorEvery)
  /// Receives a slow-link verdict on a link into this rank (src, slow);
  /// set: the monitor rank sends them (--monitor-to-dpp).
  std::function<void(int, bool)> onLinkVerdict;
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
  /// monitor rank also takes what arrived and writes new alerts. Call it
  /// for observed steps only.
  void afterStep(int64_t step);
  /// Whether step `step` is monitored (always, or --monitor-cost's odd
  /// windows: monitor::MonitorOptions::observes).
  bool observes(int64_t step) const { return opts_.diagnosis.observes(step); }
  /// A run resumed at `step` (--resume, an elastic restart): call before the
  /// first step.
  void startAt(int64_t step) {
    if (diag_)
      diag_->startAt(step);
  }
  /// After the last step (the trace flushed): sends what remains and an end
  /// marker; the monitor rank drains (bounded by drainS) and finishes.
  void finish();

  /// Monitor rank: alerts written so far.
  size_t alertsWritten() const { return log_ ? log_->written() : 0; }

private:
  /// One step's summary, stamped with the GPU's state and the busy-host
  /// flag, to rank 0's diagnoser (batched).
  void send(monitor::StepSummary s);
  void flushBatch();
  void postInbox(int r);
  void postVerdict();
  void receive(bool wait);
  void sendVerdicts(const std::vector<monitor::Alert> &alerts);
  void takeVerdicts();
  void emit(const std::vector<monitor::Alert> &alerts);
  bool silent(int64_t step) const;

  Communicator &comm_;
  bool busyHost_ = false; // more ranks on this host than CPUs
  LiveMonitorOptions opts_;
  const int rank_, world_;
  monitor::Summarizer summarizer_;
  std::unique_ptr<monitor::NvmlReader> nvml_;
  std::unique_ptr<mapp::MappTraceWriter> tapWriter_;
  int64_t sentThrough_ = -1; // newest step summarized
  int64_t step_ = -1;
  std::vector<monitor::StepSummary> batch_; // summaries not yet sent
  struct Verdict {
    int32_t src = -1, slow = 0;
  };
  Verdict verdictIn_;   // a link's receiver: the posted verdict buffer
  P2PHandle verdictPosted_;
  // Monitor rank.
  std::unique_ptr<monitor::AlertLog> log_;
  std::unique_ptr<monitor::WindowDiagnoser> diag_;
  std::vector<std::vector<monitor::StepSummary>> inbox_; // per rank: a batch
  std::vector<P2PHandle> posted_;
  std::vector<char> ended_;
  size_t received_ = 0, withNvml_ = 0, messages_ = 0;
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
                  mapp::MappTraceWriter *trace, int every = 1,
                  bool verdictsToScheduler = false, bool append = false,
                  int costWindow = 0);

} // namespace mapp::rt

#endif
