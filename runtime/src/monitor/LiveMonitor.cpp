//===- LiveMonitor.cpp - summaries over the job's communicator ------------===//
#include "mapp/rt/LiveMonitor.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <unistd.h>

using namespace mapp::rt;
using mapp::monitor::Alert;
using mapp::monitor::StepSummary;

namespace {
constexpr int32_t kEndMarkerStep = -2; // "this rank sends no more"

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0)
    return "?";
  return buf;
}
} // namespace

LiveMonitor::LiveMonitor(Communicator &comm, LiveMonitorOptions opts)
    : comm_(comm), opts_(std::move(opts)), rank_(comm.rank()),
      world_(comm.worldSize()) {
  summarizer_.setIdentity(rank_, opts_.tp, opts_.dp, opts_.pp, hostName());
  if (opts_.nvml) {
    std::string why;
    nvml_ = monitor::NvmlReader::open(opts_.device, &why);
    if (!nvml_ && rank_ == 0)
      std::fprintf(stderr, "mapp-run: --monitor: no GPU signals: %s\n",
                   why.c_str());
  }
  if (rank_ != 0)
    return;
  std::string err;
  log_ = monitor::AlertLog::open(opts_.path, "mapp-run: monitor", &err);
  if (!log_)
    fail("--monitor: ", err);
  diag_ = std::make_unique<monitor::WindowDiagnoser>(world_, opts_.diagnosis);
  inbox_.resize(world_);
  posted_.resize(world_);
  ended_.assign(world_, 0);
  ended_[0] = 1;
  for (int r = 1; r < world_; ++r)
    posted_[r] = comm_.irecv(&inbox_[r], sizeof(StepSummary), r, kMonitorTag);
}

LiveMonitor::~LiveMonitor() {
  // Posted receives point into inbox_: withdraw them before it goes.
  for (P2PHandle &h : posted_)
    if (h)
      comm_.cancel(*h);
}

mapp::MappTraceWriter &LiveMonitor::tapOnlyWriter() {
  if (!tapWriter_)
    tapWriter_ = mapp::MappTraceWriter::openTapOnly(this);
  return *tapWriter_;
}

void LiveMonitor::onGroup(int id, const std::string &kind,
                          const std::vector<int> &) {
  summarizer_.setGroupKind(id, kind);
}

void LiveMonitor::onRecord(const mapp::TraceRecord &r) {
  monitor::SummaryEvent e;
  e.name = r.name;
  e.step = r.step;
  e.cat = r.cat;
  e.op = r.op;
  e.group = r.group;
  e.peer = r.peer;
  e.bytes = r.bytes;
  e.beginNs = r.beginNs;
  e.endNs = r.endNs;
  e.cpuNs = r.cpuNs;
  e.sentNs = r.sentNs;
  e.arrivedNs = r.arrivedNs;
  summarizer_.add(e);
}

bool LiveMonitor::silent(int64_t step) const {
  for (const Injection &i : opts_.inject)
    if (i.kind == Injection::MonitorSilence && i.rank == rank_ &&
        i.activeAt(step))
      return true;
  return false;
}

void LiveMonitor::send(const StepSummary &s) {
  if (s.step >= 0 && silent(s.step))
    return;
  if (rank_ == 0) {
    count(s);
    diag_->add(s);
    return;
  }
  comm_.send(&s, sizeof s, 0, kMonitorTag);
}

void LiveMonitor::afterStep(int64_t step) {
  step_ = step;
  // Host marks: the step's records are all in. Device marks resolve while
  // the next steps run; step - 2's are in once step ran (TraceSink).
  int64_t complete = opts_.deferredMarks ? step - 2 : step;
  for (int64_t s = sentThrough_ + 1; s <= complete; ++s) {
    StepSummary sum = summarizer_.take(static_cast<int>(s));
    if (nvml_)
      nvml_->read(sum); // the GPU now: what the step just ran under
    send(sum);
  }
  sentThrough_ = std::max(sentThrough_, complete);
  if (rank_ == 0) {
    receive(false);
    emit(diag_->poll());
  }
}

void LiveMonitor::receive(bool wait) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(opts_.drainS);
  for (;;) {
    bool all = true;
    for (int r = 1; r < world_; ++r) {
      while (!ended_[r] && posted_[r] && comm_.test(*posted_[r])) {
        StepSummary s = inbox_[r];
        posted_[r] = nullptr;
        if (s.magic == monitor::kSummaryMagic && s.step == kEndMarkerStep &&
            s.rank == r) {
          ended_[r] = 1;
          break;
        }
        count(s);
        diag_->add(s);
        posted_[r] =
            comm_.irecv(&inbox_[r], sizeof(StepSummary), r, kMonitorTag);
      }
      all = all && ended_[r];
    }
    if (!wait || all || std::chrono::steady_clock::now() >= deadline)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void LiveMonitor::count(const StepSummary &s) {
  ++received_;
  if (s.flags & StepSummary::HasNvml) {
    ++withNvml_;
    lastNvml_ = s;
  }
}

void LiveMonitor::emit(const std::vector<Alert> &alerts) {
  for (const Alert &a : alerts)
    log_->write(a, step_);
}

void LiveMonitor::finish() {
  int64_t last = step_;
  for (int s : summarizer_.openSteps())
    last = std::max<int64_t>(last, s);
  for (int64_t s = sentThrough_ + 1; s <= last; ++s) {
    StepSummary sum = summarizer_.take(static_cast<int>(s));
    if (nvml_)
      nvml_->read(sum);
    send(sum);
  }
  sentThrough_ = last;
  if (rank_ != 0) {
    if (!silent(last)) {
      StepSummary end;
      end.rank = rank_;
      end.step = kEndMarkerStep;
      comm_.send(&end, sizeof end, 0, kMonitorTag);
    }
    return;
  }
  receive(true);
  emit(diag_->poll());
  emit(diag_->finish());
  // One line even with --quiet (test/gpu/monitor.sh reads it).
  std::string msg = "mapp-run: monitor: " + std::to_string(received_) +
                    " summaries of " + std::to_string(world_) + " ranks, " +
                    std::to_string(log_->written()) + " alert line(s)";
  if (withNvml_) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "; GPU signals in %zu (rank %d step %d: SM %.0f/%.0f MHz, "
                  "%.0f W, %.0f C, throttle %s)",
                  withNvml_, lastNvml_.rank, lastNvml_.step,
                  lastNvml_.smClockMhz, lastNvml_.smClockMaxMhz,
                  lastNvml_.powerW, lastNvml_.temperatureC,
                  monitor::throttleReasonNames(lastNvml_.throttleReasons)
                      .c_str());
    msg += buf;
  }
  msg += "\n";
  std::fwrite(msg.data(), 1, msg.size(), stderr);
  for (P2PHandle &h : posted_)
    if (h) {
      comm_.cancel(*h);
      h = nullptr;
    }
}

std::unique_ptr<LiveMonitor>
mapp::rt::attachLiveMonitor(Executor &exec, Communicator &comm,
                            const std::string &path,
                            const std::vector<Injection> &inject, bool cuda,
                            int device, mapp::MappTraceWriter *trace) {
  if (path.empty())
    return nullptr;
  LiveMonitorOptions o;
  o.path = path;
  o.inject = inject;
  o.nvml = cuda;
  o.device = device;
  o.tp = exec.program().tp;
  o.dp = exec.program().dp;
  o.pp = exec.program().pp;
  o.deferredMarks = exec.backend().traceMarksDeferred();
  // The summaries need every step's records (plans with trace regions
  // trace a sample of steps unless told otherwise).
  o.drainS = std::min(5.0, comm.timeout() > 0 ? comm.timeout() : 5.0);
  auto live = std::make_unique<LiveMonitor>(comm, o);
  if (trace)
    trace->setTap(live.get());
  else
    exec.setTraceWriter(&live->tapOnlyWriter());
  exec.setTraceSampling(0, 1);
  return live;
}
