//===- Diagnoser.cpp - The window diagnosis: steps, ranks, missing ranks --===//
//
// Ranks are judged here, links in DiagnoserLinks.cpp. Root cause vs victims
// as in mapp-scan: a rank is judged by its own compute against its role
// peers' (never by step or wait time); the ranks that wait on it are named
// as victims.
//
//===----------------------------------------------------------------------===//
#include "mapp/monitor/Diagnoser.h"
#include "mapp/monitor/DiagnosisCore.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

using namespace mapp::monitor;

std::string mapp::monitor::throttleReasonNames(uint64_t bits) {
  static const std::pair<uint64_t, const char *> names[] = {
      {0x1, "gpu-idle"},       {0x2, "applications-clocks"},
      {0x4, "sw-power-cap"},   {0x8, "hw-slowdown"},
      {0x10, "sync-boost"},    {0x20, "sw-thermal"},
      {0x40, "hw-thermal"},    {0x80, "hw-power-brake"},
      {0x100, "display-clocks"}};
  std::string s;
  for (auto [bit, name] : names)
    if (bits & bit)
      s += (s.empty() ? "" : ",") + std::string(name);
  return s.empty() ? "none" : s;
}

std::string mapp::monitor::exposureText(const ExposureTotals &t) {
  if (t.summaries == 0)
    return "";
  double n = static_cast<double>(t.summaries), exposed = 0, comm = 0;
  for (int c = 0; c < kCommClasses; ++c) {
    exposed += t.exposedNs[c];
    comm += t.commNs[c];
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "exposed communication %.3f ms per rank and step (%.1f%% of "
                "its step; communication %.3f ms)",
                exposed / n * 1e-6,
                t.spanNs > 0 ? 100 * exposed / t.spanNs : 0.0,
                comm / n * 1e-6);
  std::string out = buf;
  std::string classes;
  for (int c = 0; c < kCommClasses; ++c) {
    if (t.commNs[c] <= 0)
      continue;
    std::snprintf(buf, sizeof buf, "%s%s %.3f", classes.empty() ? "" : ", ",
                  commClassName(c), t.exposedNs[c] / n * 1e-6);
    classes += buf;
  }
  if (!classes.empty())
    out += ": " + classes;
  int most = -1;
  double mostMs = -1;
  for (size_t r = 0; r < t.rankExposedNs.size(); ++r) {
    if (t.rankSteps[r] == 0)
      continue;
    double ms = t.rankExposedNs[r] / t.rankSteps[r] * 1e-6;
    if (ms > mostMs) {
      mostMs = ms;
      most = static_cast<int>(r);
    }
  }
  if (most >= 0) {
    std::snprintf(buf, sizeof buf, "; most exposed: rank %d, %.3f ms", most,
                  mostMs);
    out += buf;
  }
  return out;
}

WindowDiagnoser::WindowDiagnoser(int world, MonitorOptions opts)
    : world_(world), opts_(opts) {
  opts_.window = std::max(opts_.window, opts_.missingAfter + 2);
  opts_.alertAfter = std::max(1, opts_.alertAfter);
  opts_.strongAlertAfter =
      std::clamp(opts_.strongAlertAfter, 1, opts_.alertAfter);
  opts_.recoverAfter = std::max(1, opts_.recoverAfter);
  size_t n = static_cast<size_t>(opts_.window) * world_;
  ring_.resize(n);
  ringStep_.assign(n, -1);
  rankHistory_.assign(n, 0.0);
  lastStep_.assign(world_, -1);
  missing_.assign(world_, 0);
  rankTracks_.resize(world_);
  exposure_.rankExposedNs.assign(world_, 0.0);
  exposure_.rankSteps.assign(world_, 0);
}

size_t WindowDiagnoser::memoryBytes() const {
  size_t b = ring_.size() * (sizeof(StepSummary) + sizeof(int64_t) +
                             sizeof(double)) +
             world_ * (sizeof(int64_t) + 1 + sizeof(Track));
  // A map node: the key, the value and about four pointers of overhead.
  b += linkHistory_.size() *
       (sizeof(std::pair<int, int>) + sizeof(LinkWindow) +
        2 * opts_.window * sizeof(double) + 4 * sizeof(void *));
  b += linkTracks_.size() *
       (sizeof(std::pair<int, int>) + sizeof(Track) + 4 * sizeof(void *));
  b += world_ * (sizeof(double) + sizeof(int64_t)); // exposure per rank
  return b;
}

bool WindowDiagnoser::add(const StepSummary &s) {
  if (s.magic != kSummaryMagic || s.rank < 0 || s.rank >= world_ ||
      s.step < next_)
    return false;
  // A step beyond the window: the oldest steps are diagnosed with whoever
  // delivered them (the ranks behind are named missing).
  while (s.step >= next_ + opts_.window) {
    diagnoseStep(next_, pending_);
    ++next_;
  }
  size_t k = slot(s.step, s.rank);
  ring_[k] = s;
  ringStep_[k] = s.step;
  lastStep_[s.rank] = std::max<int64_t>(lastStep_[s.rank], s.step);
  newest_ = std::max<int64_t>(newest_, s.step);
  if (missing_[s.rank]) {
    missing_[s.rank] = 0;
    Alert a;
    a.kind = "recovered";
    a.of = "missing-summaries";
    a.rank = s.rank;
    a.step = s.step;
    a.text = "rank " + std::to_string(s.rank) +
             ": summaries arrive again (step " + std::to_string(s.step) + ")";
    pending_.push_back(a);
  }
  return true;
}

std::vector<Alert> WindowDiagnoser::poll() {
  std::vector<Alert> out = std::move(pending_);
  pending_.clear();
  while (next_ <= newest_) {
    bool complete = true;
    for (int r = 0; r < world_ && complete && opts_.observes(next_); ++r)
      complete = missing_[r] || ringStep_[slot(next_, r)] == next_;
    if (!complete && newest_ < next_ + opts_.missingAfter)
      break;
    diagnoseStep(next_, out);
    ++next_;
  }
  return out;
}

std::vector<Alert> WindowDiagnoser::finish() {
  std::vector<Alert> out = std::move(pending_);
  pending_.clear();
  for (; next_ <= newest_; ++next_)
    diagnoseStep(next_, out);
  return out;
}

void WindowDiagnoser::diagnoseStep(int64_t step, std::vector<Alert> &out) {
  if (!opts_.observes(step))
    return; // --monitor-cost's unmonitored steps: nothing was sent
  std::vector<const StepSummary *> got;
  got.reserve(world_);
  for (int r = 0; r < world_; ++r) {
    size_t k = slot(step, r);
    if (ringStep_[k] == step) {
      got.push_back(&ring_[k]);
      continue;
    }
    if (missing_[r])
      continue;
    missing_[r] = 1;
    Alert a;
    a.kind = "missing-summaries";
    a.rank = r;
    a.step = step;
    a.confidence = 1;
    a.evidence = {{"last_step", static_cast<double>(lastStep_[r])},
                  {"newest_step", static_cast<double>(newest_)}};
    a.text = "rank " + std::to_string(r) + ": no summary for step " +
             std::to_string(step) +
             (lastStep_[r] < 0
                  ? std::string(" (none ever arrived)")
                  : " (last one step " + std::to_string(lastStep_[r]) + ")") +
             "; the rank stopped reporting or is stuck";
    out.push_back(a);
  }
  ++exposure_.steps;
  for (const StepSummary *s : got) {
    ++exposure_.summaries;
    exposure_.spanNs += s->spanNs;
    for (int c = 0; c < kCommClasses; ++c) {
      exposure_.exposedNs[c] += s->exposedNs[c];
      exposure_.commNs[c] += s->commClassNs[c];
    }
    exposure_.rankExposedNs[s->rank] += s->totalExposedNs();
    ++exposure_.rankSteps[s->rank];
  }
  if (step >= opts_.warmupSteps) {
    judgeRanks(step, got, out);
    judgeLinks(step, got, out);
  }
  for (int r = 0; r < world_; ++r)
    ringStep_[slot(step, r)] = -1;
}

bool WindowDiagnoser::advance(Track &t, bool slow, bool strong, bool normal,
                              double ratio, int64_t step) {
  if (slow) {
    t.normalRun = 0;
    if (t.slowRun++ == 0) {
      t.since = step;
      t.minRatio = ratio;
    }
    t.strongRun = strong ? t.strongRun + 1 : 0;
    t.minRatio = std::min(t.minRatio, ratio);
    // Evidence accumulates: a marginal excess must persist for alertAfter
    // steps (host noise reaches 1.4x for two), a large one for fewer.
    if (!t.alerted && (t.slowRun >= opts_.alertAfter ||
                       t.strongRun >= opts_.strongAlertAfter)) {
      t.alerted = true;
      return true;
    }
    return false;
  }
  t.slowRun = 0;
  t.strongRun = 0;
  if (!normal) // between the bars: neither a fault's step nor a clean one;
    return false; // it neither counts towards recovery nor resets it
  if (++t.normalRun >= opts_.recoverAfter && t.alerted) {
    t.alerted = false;
    return true;
  }
  return false;
}

static double clamp01(double x) { return std::clamp(x, 0.0, 1.0); }

static std::string coords(const StepSummary &s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "pp %d, dp %d, tp %d", s.pp, s.dp, s.tp);
  return buf;
}

void WindowDiagnoser::judgeRanks(int64_t step,
                                 const std::vector<const StepSummary *> &got,
                                 std::vector<Alert> &out) {
  // Role peers: ranks that ran the same program this step (same stage and
  // the same number of ops of each class).
  using RoleKey = std::tuple<int, uint32_t, uint32_t, uint32_t, uint32_t>;
  std::map<RoleKey, std::vector<const StepSummary *>> roles;
  for (const StepSummary *s : got)
    roles[{s->pp, s->ops[0], s->ops[1], s->ops[2], s->ops[3]}].push_back(s);
  struct Rated {
    const StepSummary *s;
    double ratio, ref;
    size_t peers;
    bool cpu;
  };
  std::vector<Rated> rated;
  for (auto &[key, members] : roles) {
    if (members.size() < 2)
      continue;
    bool cpu = true;
    for (const StepSummary *s : members)
      cpu = cpu && (s->flags & StepSummary::HasCpu);
    std::vector<double> v;
    for (const StepSummary *s : members)
      v.push_back(s->computeNs(cpu));
    // With two the faster one is the reference (a median of two cannot
    // say which is the outlier), as mapp-scan does.
    double ref = peerReference(v);
    if (ref <= 0)
      continue;
    // Per op bucket (ops by name hash), the member's time against the
    // bucket's reference; the rank's ratio is the lesser of its whole
    // compute's and the lower quartile over buckets: three kinds of op in
    // four must be slower, as a slow device makes them.
    std::vector<double> bucketRef(kOpBuckets, 0);
    for (int b = 0; b < kOpBuckets; ++b) {
      std::vector<double> vb;
      for (const StepSummary *s : members)
        vb.push_back(s->bucketNs[b]);
      bucketRef[b] = peerReference(vb);
    }
    for (size_t i = 0; i < members.size(); ++i) {
      double q = v[i] / ref;
      std::vector<double> qb;
      for (int b = 0; b < kOpBuckets; ++b)
        if (bucketRef[b] > 0 && members[i]->bucketOps[b])
          qb.push_back(members[i]->bucketNs[b] / bucketRef[b]);
      if (qb.size() >= 4) {
        std::sort(qb.begin(), qb.end());
        q = std::min(q, qb[(qb.size() - 1) / 4]);
      }
      rankHistory_[slot(step, members[i]->rank)] = q;
      rated.push_back({members[i], q, ref, members.size(), cpu});
    }
  }
  if (rated.empty())
    return;
  // Noise: the robust spread of every rank's ratio over the window.
  std::vector<double> hist;
  hist.reserve(rankHistory_.size());
  for (double q : rankHistory_)
    if (q > 0)
      hist.push_back(q);
  const double sigma = robustSpread(hist, 0.01);
  const double T = opts_.rankThreshold;
  for (const Rated &r : rated) {
    Track &t = rankTracks_[r.s->rank];
    bool wasAlerted = t.alerted;
    double bar = r.cpu && opts_.ranksAreProcesses
                     ? std::max(T, opts_.processRankThreshold)
                     : T;
    if (r.s->flags & StepSummary::BusyHost)
      bar = std::max(bar, opts_.busyHostRankThreshold);
    bool slow = r.ratio >= 1 + bar && r.ratio - 1 >= kRankNoiseSpreads * sigma;
    bool strong = slow && r.ratio >= 1 + 2 * T;
    // Below the slow bar counts towards recovery: right after a fault the
    // rank's ratio sat at 1.15-1.3 on the busy 2-core host for steps (a
    // half-bar recovery came 4 steps late); re-alerting still needs
    // alertAfter slow steps, which keeps a marginal rank from flapping.
    bool normal = r.ratio < 1 + T;
    if (!advance(t, slow, strong, normal, r.ratio, step))
      continue;
    Alert a;
    a.rank = r.s->rank;
    a.step = step;
    a.since = t.since;
    if (wasAlerted) {
      a.kind = "recovered";
      a.of = "slow-rank";
      a.ratio = r.ratio;
      a.text = "rank " + std::to_string(a.rank) + " (" + coords(*r.s) +
               "): compute back to its peers' (" +
               std::to_string(r.ratio).substr(0, 4) + "x)";
      out.push_back(a);
      continue;
    }
    a.kind = "slow-rank";
    a.ratio = t.minRatio;
    a.confidence = rankSlowness(t.minRatio, T) *
                   clamp01((t.minRatio - 1) / (10 * sigma));
    a.cause = "compute";
    a.evidence = {{"compute_ms", r.s->computeNs(r.cpu) * 1e-6},
                  {"peers_compute_ms", r.ref * 1e-6},
                  {"peers", static_cast<double>(r.peers - 1)},
                  {"noise", sigma},
                  {"cpu_clock", r.cpu ? 1.0 : 0.0}};
    // Hardware: a clock-throttled GPU (NVML) is the cause when its SM clock
    // is well below its peers' or NVML names a slowing throttle reason.
    if (r.s->flags & StepSummary::HasNvml) {
      std::vector<double> clocks;
      for (const Rated &o : rated)
        if (o.s != r.s && (o.s->flags & StepSummary::HasNvml) &&
            o.s->pp == r.s->pp)
          clocks.push_back(o.s->smClockMhz);
      double peerClock = median(clocks);
      bool throttled = (r.s->throttleReasons & kThrottleSlowingMask) ||
                       (peerClock > 0 &&
                        r.s->smClockMhz < opts_.throttledClock * peerClock);
      if (throttled)
        a.cause = "clock-throttled";
      a.evidence.push_back({"sm_clock_mhz", r.s->smClockMhz});
      a.evidence.push_back({"peers_sm_clock_mhz", peerClock});
      a.evidence.push_back({"power_w", r.s->powerW});
      a.evidence.push_back({"temperature_c", r.s->temperatureC});
      a.evidence.push_back(
          {"throttle_reasons", static_cast<double>(r.s->throttleReasons)});
    }
    // Victims: ranks that waited clearly longer than the culprit.
    std::vector<std::pair<double, int>> w;
    double own = r.s->totalSyncNs();
    for (const StepSummary *o : got)
      if (o != r.s && o->totalSyncNs() > 1.25 * own + 1e5)
        w.push_back({o->totalSyncNs(), o->rank});
    std::sort(w.rbegin(), w.rend());
    for (size_t k = 0; k < w.size() && k < 8; ++k)
      a.victims.push_back(w[k].second);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "rank %d (%s): compute %.2fx its %zu role peers' median "
                  "since step %lld (%s, confidence %.2f)",
                  a.rank, coords(*r.s).c_str(), a.ratio, r.peers - 1,
                  static_cast<long long>(a.since), a.cause.c_str(),
                  a.confidence);
    a.text = buf;
    if (a.cause == "clock-throttled") {
      std::snprintf(buf, sizeof buf,
                    "; SM clock %.0f MHz vs peers' %.0f MHz, throttle "
                    "reasons %s",
                    r.s->smClockMhz,
                    a.evidence[a.evidence.size() - 4].second,
                    throttleReasonNames(r.s->throttleReasons).c_str());
      a.text += buf;
    }
    out.push_back(a);
  }
}
