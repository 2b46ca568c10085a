//===- LiveMonitor.cpp - summaries over the job's communicator ------------===//
#include "mapp/rt/LiveMonitor.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <sched.h>
#include <unistd.h>

using namespace mapp::rt;
using mapp::monitor::Alert;
using mapp::monitor::StepSummary;

namespace {
constexpr int32_t kEndMarkerStep = -2; // "this rank sends no more"
constexpr int32_t kEmptySlotStep = -3; // a batch's unused slot

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0)
    return "?";
  return buf;
}

/// CPUs this process may run on (0: unknown).
int allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}
} // namespace

LiveMonitor::LiveMonitor(Communicator &comm, LiveMonitorOptions opts)
    : comm_(comm), opts_(std::move(opts)), rank_(comm.rank()),
      world_(comm.worldSize()) {
  summarizer_.setIdentity(rank_, opts_.tp, opts_.dp, opts_.pp, hostName());
  summarizer_.setLayout(opts_.tpSize, opts_.dpSize, opts_.ppSize);
  // More ranks on this host than CPUs: the diagnoser holds this rank to
  // the busy host's bar (as mapp-scan does from the traces' cpus).
  const int here = comm.sharesAddressSpace() ? world_ : comm.ranksOnThisHost();
  const int cpus = allowedCpus();
  busyHost_ = cpus > 0 && here > cpus;
  if (opts_.nvml) {
    std::string why;
    nvml_ = monitor::NvmlReader::open(opts_.device, &why);
    if (!nvml_ && rank_ == 0)
      std::fprintf(stderr, "mapp-run: --monitor: no GPU signals: %s\n",
                   why.c_str());
  }
  opts_.every = std::clamp(opts_.every, 1, kMaxMonitorEvery);
  if (opts_.onLinkVerdict && rank_ != 0)
    postVerdict();
  if (rank_ != 0)
    return;
  // A batch arrives up to every - 1 steps after its first summary: only a
  // rank later than that is missing.
  opts_.diagnosis.missingAfter =
      std::max(opts_.diagnosis.missingAfter, opts_.every + 2);
  std::string err;
  log_ = monitor::AlertLog::open(opts_.path, "mapp-run: monitor", &err,
                                opts_.append);
  if (!log_)
    fail("--monitor: ", err);
  opts_.diagnosis.ranksAreProcesses = !comm_.sharesAddressSpace();
  diag_ = std::make_unique<monitor::WindowDiagnoser>(world_, opts_.diagnosis);
  inbox_.assign(world_, std::vector<StepSummary>(opts_.every));
  posted_.resize(world_);
  ended_.assign(world_, 0);
  ended_[0] = 1;
  for (int r = 1; r < world_; ++r)
    postInbox(r);
}

void LiveMonitor::postInbox(int r) {
  posted_[r] = comm_.irecv(inbox_[r].data(),
                           inbox_[r].size() * sizeof(StepSummary), r,
                           kMonitorTag);
}

LiveMonitor::~LiveMonitor() {
  // Posted receives point into inbox_ / verdictIn_: withdraw them first.
  for (P2PHandle &h : posted_)
    if (h)
      comm_.cancel(*h);
  if (verdictPosted_)
    comm_.cancel(*verdictPosted_);
}

mapp::MappTraceWriter &LiveMonitor::tapOnlyWriter() {
  if (!tapWriter_)
    tapWriter_ = mapp::MappTraceWriter::openTapOnly(this);
  return *tapWriter_;
}

void LiveMonitor::onGroup(int id, const std::string &kind,
                          const std::vector<int> &members) {
  summarizer_.setGroupKind(id, kind, members);
}

void LiveMonitor::onRecord(const mapp::TraceRecord &r) {
  summarizer_.add(monitor::summaryEventOf(r));
}

bool LiveMonitor::silent(int64_t step) const {
  for (const Injection &i : opts_.inject)
    if (i.kind == Injection::MonitorSilence && i.rank == rank_ &&
        i.activeAt(step))
      return true;
  return false;
}

void LiveMonitor::send(StepSummary s) {
  if (s.step >= 0 && silent(s.step))
    return;
  if (nvml_)
    nvml_->read(s); // the GPU now: what the step just ran under
  if (busyHost_)
    s.flags |= StepSummary::BusyHost;
  if (rank_ == 0) {
    count(s);
    diag_->add(s);
    return;
  }
  batch_.push_back(s);
  if (static_cast<int>(batch_.size()) == opts_.every)
    flushBatch();
}

void LiveMonitor::flushBatch() {
  if (batch_.empty())
    return;
  StepSummary empty;
  empty.rank = rank_;
  empty.step = kEmptySlotStep;
  batch_.resize(opts_.every, empty);
  comm_.send(batch_.data(), batch_.size() * sizeof(StepSummary), 0,
             kMonitorTag);
  batch_.clear();
}

void LiveMonitor::afterStep(int64_t step) {
  step_ = step;
  // Host marks: the step's records are all in. Device marks resolve while
  // the next steps run; step - 2's are in once step ran (TraceSink).
  int64_t complete = opts_.deferredMarks ? step - 2 : step;
  for (int64_t s = sentThrough_ + 1; s <= complete; ++s) {
    StepSummary sum = summarizer_.take(static_cast<int>(s));
    if (!observes(s))
      continue; // an unmonitored step (--monitor-cost): nothing recorded
    send(sum);
  }
  sentThrough_ = std::max(sentThrough_, complete);
  if (rank_ == 0) {
    receive(false);
    std::vector<Alert> alerts = diag_->poll();
    emit(alerts);
    if (opts_.onLinkVerdict)
      sendVerdicts(alerts);
  } else {
    takeVerdicts();
  }
}

void LiveMonitor::sendVerdicts(const std::vector<Alert> &alerts) {
  for (const Alert &a : alerts) {
    bool slow = a.kind == "slow-link";
    if (!slow && !(a.kind == "recovered" && a.of == "slow-link"))
      continue;
    if (a.dst < 0 || a.dst >= world_ || a.src < 0)
      continue;
    if (a.dst == 0) {
      opts_.onLinkVerdict(a.src, slow);
      continue;
    }
    Verdict v;
    v.src = a.src;
    v.slow = slow ? 1 : 0;
    comm_.send(&v, sizeof v, a.dst, kMonitorVerdictTag);
  }
}

void LiveMonitor::takeVerdicts() {
  while (verdictPosted_ && comm_.test(*verdictPosted_)) {
    opts_.onLinkVerdict(verdictIn_.src, verdictIn_.slow != 0);
    postVerdict();
  }
}

void LiveMonitor::postVerdict() {
  verdictPosted_ =
      comm_.irecv(&verdictIn_, sizeof verdictIn_, 0, kMonitorVerdictTag);
}

void LiveMonitor::receive(bool wait) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(opts_.drainS);
  for (;;) {
    bool all = true;
    for (int r = 1; r < world_; ++r) {
      while (!ended_[r] && posted_[r] && comm_.test(*posted_[r])) {
        posted_[r] = nullptr;
        ++messages_;
        for (const StepSummary &s : inbox_[r]) {
          bool ours = s.magic == monitor::kSummaryMagic && s.rank == r;
          if (ours && s.step == kEndMarkerStep)
            ended_[r] = 1;
          if (ended_[r] || (ours && s.step == kEmptySlotStep))
            continue;
          count(s);
          diag_->add(s);
        }
        if (!ended_[r])
          postInbox(r);
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
    send(sum);
  }
  sentThrough_ = last;
  if (rank_ != 0) {
    // A silenced rank's last batch is lost, as a dead rank's would be.
    if (!silent(last)) {
      StepSummary end;
      end.rank = rank_;
      end.step = kEndMarkerStep;
      batch_.push_back(end);
      flushBatch();
    }
    if (verdictPosted_) {
      comm_.cancel(*verdictPosted_);
      verdictPosted_ = nullptr;
    }
    return;
  }
  receive(true);
  emit(diag_->poll());
  emit(diag_->finish());
  // One line even with --quiet (test/gpu/monitor.sh reads it).
  std::string msg = "mapp-run: monitor: " + std::to_string(received_) +
                    " summaries of " + std::to_string(world_) + " ranks in " +
                    std::to_string(messages_) + " message(s), " +
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
  std::string exposed = monitor::exposureText(diag_->exposure());
  if (!exposed.empty())
    msg += "mapp-run: monitor: " + exposed + "\n";
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
                            int device, mapp::MappTraceWriter *trace,
                            int every, bool verdictsToScheduler,
                            bool append, int costWindow) {
  if (path.empty())
    return nullptr;
  LiveMonitorOptions o;
  o.path = path;
  o.append = append;
  o.inject = inject;
  o.nvml = cuda;
  o.device = device;
  o.tp = exec.program().tp;
  o.dp = exec.program().dp;
  o.pp = exec.program().pp;
  const Plan &plan = exec.plan();
  if (plan.worldSize == plan.tp * plan.dp * plan.pp) { // one layout (no FBD)
    o.tpSize = plan.tp;
    o.dpSize = plan.dp;
    o.ppSize = plan.pp;
  }
  o.deferredMarks = exec.backend().traceMarksDeferred();
  o.every = every;
  o.diagnosis.costWindow = costWindow;
  if (verdictsToScheduler) {
    if (!exec.scheduler().takesLinkVerdicts())
      fail("--monitor-to-dpp: rank ", comm.rank(),
           " runs a static schedule; the monitor's link verdicts need the "
           "adaptive scheduler (a plan with schedule=adaptive or "
           "--schedule=adaptive)");
    // Through the executor: its scheduler may be replaced after this.
    o.onLinkVerdict = [&exec](int src, bool slow) {
      exec.scheduler().linkVerdict(src, slow);
    };
  }
  // The summaries need every step's records (plans with trace regions
  // trace a sample of steps unless told otherwise).
  o.drainS = std::min(5.0, comm.timeout() > 0 ? comm.timeout() : 5.0);
  auto live = std::make_unique<LiveMonitor>(comm, o);
  if (trace) {
    trace->setTap(live.get());
  } else {
    exec.setTraceWriter(&live->tapOnlyWriter());
    // No trace file wants single ops: on a device, fewer stream events.
    exec.setTraceComputeRuns(o.deferredMarks);
  }
  exec.setTraceSampling(0, 1);
  return live;
}
