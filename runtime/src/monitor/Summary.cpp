//===- Summary.cpp - Step summaries from trace events ---------------------===//
#include "mapp/monitor/Summary.h"
#include "mapp/rt/RegularFile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

using namespace mapp::monitor;
using mapp::trace::Category;
using mapp::trace::Op;

const char *mapp::monitor::opClassName(int c) {
  static const char *names[] = {"compute", "optimizer", "data", "memcpy"};
  return c >= 0 && c < kOpClasses ? names[c] : "?";
}

const char *mapp::monitor::syncClassName(int c) {
  static const char *names[] = {"tp", "dp", "pp", "other", "recv"};
  return c >= 0 && c < kSyncClasses ? names[c] : "?";
}

SummaryEvent mapp::monitor::summaryEventOf(const TraceRecord &r) {
  SummaryEvent e;
  e.name = r.name;
  e.step = r.step;
  e.cat = r.cat;
  e.op = r.op;
  e.group = r.group;
  e.seq = r.seq;
  e.peer = r.peer;
  e.bytes = r.bytes;
  e.beginNs = r.beginNs;
  e.endNs = r.endNs;
  e.cpuNs = r.cpuNs;
  e.sentNs = r.sentNs;
  e.arrivedNs = r.arrivedNs;
  e.pendingNs = r.pendingNs;
  e.arrivalExact = r.arrivalExact;
  e.track = trackOf(r.stream);
  return e;
}

double StepSummary::computeNs(bool cpu) const {
  double s = 0;
  for (int c = 0; c < kOpClasses; ++c)
    s += cpu ? cpuNs[c] : wallNs[c];
  return s;
}

double StepSummary::totalSyncNs() const {
  double s = 0;
  for (double v : syncNs)
    s += v;
  return s;
}

double StepSummary::totalExposedNs() const {
  double s = 0;
  for (float v : exposedNs)
    s += v;
  return s;
}

uint32_t mapp::monitor::hostHash(const std::string &host) {
  uint32_t h = 2166136261u; // FNV-1a
  for (unsigned char c : host)
    h = (h ^ c) * 16777619u;
  return h;
}

int mapp::monitor::opBucketOf(const char *name) {
  uint32_t h = 2166136261u;
  for (const char *p = name; p && *p; ++p)
    h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
  return static_cast<int>(h % kOpBuckets);
}

SyncClass mapp::monitor::syncClassOfGroupKind(const std::string &kind) {
  if (kind == "tp")
    return SyncTp;
  if (kind == "dp")
    return SyncDp;
  if (kind == "pp")
    return SyncPp;
  return SyncOther;
}

static int opClassOf(Category c) {
  switch (c) {
  case Category::Optimizer:
    return ClassOptimizer;
  case Category::Data:
    return ClassData;
  case Category::Memcpy:
    return ClassMemcpy;
  default:
    return ClassCompute;
  }
}

void Summarizer::setIdentity(int rank, int tp, int dp, int pp,
                             const std::string &host) {
  std::lock_guard<std::mutex> lock(mu_);
  identity_.rank = rank;
  identity_.tp = static_cast<int16_t>(tp);
  identity_.dp = static_cast<int16_t>(dp);
  identity_.pp = static_cast<int16_t>(pp);
  identity_.host = hostHash(host);
}

static uint32_t fnv(uint32_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i, v >>= 8)
    h = (h ^ static_cast<uint8_t>(v)) * 16777619u;
  return h;
}

void Summarizer::setGroupKind(int group, const std::string &kind,
                              const std::vector<int> &members) {
  std::lock_guard<std::mutex> lock(mu_);
  groupClass_[group] = syncClassOfGroupKind(kind);
  groupCommClass_[group] = commClassOfGroupKind(kind);
  uint32_t h = hostHash(kind);
  for (int m : members)
    h = fnv(h, static_cast<uint64_t>(m));
  groupHash_[group] = h;
}

void Summarizer::setLayout(int tpSize, int dpSize, int ppSize) {
  std::lock_guard<std::mutex> lock(mu_);
  tpSize_ = tpSize;
  dpSize_ = dpSize;
  ppSize_ = ppSize;
}

int Summarizer::p2pClassOf(const SummaryEvent &e) const {
  if (tpSize_ <= 0 || dpSize_ <= 0 || e.peer < 0)
    return CommP2p;
  int peerStage = e.peer / (tpSize_ * dpSize_);
  bool send = e.op == Op::Send;
  return p2pClass(send ? identity_.pp : peerStage,
                  send ? peerStage : identity_.pp, ppSize_);
}

StepSummary Summarizer::fresh(int step) const {
  StepSummary s = identity_;
  s.step = step;
  return s;
}

void Summarizer::add(const SummaryEvent &e) {
  if (e.step < 0 || e.endNs < e.beginNs)
    return; // outside a step (setup), or a record without times
  const double span = static_cast<double>(e.endNs - e.beginNs);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(e.step);
  if (it == open_.end())
    it = open_.emplace(e.step, fresh(e.step)).first;
  StepSummary &s = it->second;
  ++s.events;
  ExposureEvent x;
  x.b = static_cast<double>(e.beginNs);
  x.e = static_cast<double>(e.endNs);
  x.track = e.track;
  if (e.op == Op::Send || e.op == Op::Recv) {
    x.commClass = p2pClassOf(e);
  } else if (e.op != Op::None || e.cat == Category::Comm) {
    auto g = groupCommClass_.find(e.group);
    x.commClass = g == groupCommClass_.end() ? CommOther : g->second;
  }
  timeline_[e.step].push_back(x);
  if (e.cat != Category::Comm && e.op == Op::None) {
    int c = opClassOf(e.cat);
    s.wallNs[c] += span;
    s.cpuNs[c] += static_cast<double>(e.cpuNs);
    ++s.ops[c];
    int b = opBucketOf(e.name);
    s.bucketNs[b] += e.cpuNs ? static_cast<double>(e.cpuNs) : span;
    ++s.bucketOps[b];
    if (e.cpuNs)
      s.flags |= StepSummary::HasCpu;
    return;
  }
  if (e.op == Op::Send)
    return; // the receiving side records the link
  if (e.op == Op::Recv) {
    s.syncNs[SyncRecv] += span;
    ++s.syncOps[SyncRecv];
    // wireLo: what the transfer took at least. A receiver whose first poll
    // found the payload did not wait for it and bounds nothing from below
    // (docs/mapp-scan.md). Stamped values are signed: the sender's clock
    // may be another host's, whose offset the diagnoser takes out.
    double wire = span, wireLo = span;
    bool bounded = true;
    const bool stamped = e.sentNs && e.arrivedNs;
    if (stamped) {
      const double sent = static_cast<double>(e.sentNs);
      wire = wireLo = static_cast<double>(e.arrivedNs) - sent;
      if (!e.arrivalExact) {
        bounded = e.pendingNs != 0;
        wireLo = static_cast<double>(e.pendingNs) - sent;
      }
      s.flags |= StepSummary::HasWire;
    }
    PeerStats *p = nullptr;
    for (int k = 0; k < s.recvPeers; ++k)
      if (s.recvFrom[k].peer == e.peer)
        p = &s.recvFrom[k];
    if (!p) {
      if (s.recvPeers == kMaxPeers) {
        s.peerOverflow = static_cast<uint8_t>(
            std::min(255, s.peerOverflow + 1));
        return;
      }
      p = &s.recvFrom[s.recvPeers++];
      p->peer = e.peer;
    }
    ++p->count;
    p->bytes += e.bytes;
    if (e.wireUnknown || (!stamped && p->stamped))
      return; // stamped samples, once there, are the only ones kept
    if (stamped && p->stamped++ == 0) { // drop the spans seen before
      p->minWireNs = wire;
      p->sumWireNs = 0;
      p->minWireLoNs = -1;
    } else if (!stamped && p->minWireNs < 0) {
      p->minWireNs = wire;
    }
    p->minWireNs = std::min(p->minWireNs, wire);
    p->sumWireNs += wire;
    if (bounded) {
      bool first = stamped ? p->stampedLo++ == 0 : p->minWireLoNs < 0;
      p->minWireLoNs = first ? wireLo : std::min(p->minWireLoNs, wireLo);
    }
    return;
  }
  auto g = groupClass_.find(e.group);
  int c = g == groupClass_.end() ? SyncOther : g->second;
  s.syncNs[c] += span;
  ++s.syncOps[c];
  if (e.seq >= 0 && (s.anchorKey == 0 || e.endNs >= s.anchorEndNs)) {
    auto h = groupHash_.find(e.group);
    if (h != groupHash_.end()) {
      s.anchorKey = std::max<uint32_t>(1, fnv(h->second, e.seq));
      s.anchorEndNs = static_cast<double>(e.endNs);
    }
  }
}

StepSummary Summarizer::take(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  StepSummary s = fresh(step);
  auto it = open_.find(step);
  if (it != open_.end())
    s = it->second;
  auto tl = timeline_.find(step);
  if (tl != timeline_.end() && !tl->second.empty()) {
    const std::vector<ExposureEvent> &ev = tl->second;
    std::vector<double> exposed = exposedTimes(ev);
    double first = ev[0].b, last = ev[0].e;
    for (size_t i = 0; i < ev.size(); ++i) {
      first = std::min(first, ev[i].b);
      last = std::max(last, ev[i].e);
      if (exposed[i] < 0)
        continue;
      s.commClassNs[ev[i].commClass] += static_cast<float>(ev[i].e - ev[i].b);
      s.exposedNs[ev[i].commClass] += static_cast<float>(exposed[i]);
    }
    s.spanNs = static_cast<float>(last - first);
  }
  open_.erase(open_.begin(), open_.upper_bound(step));
  timeline_.erase(timeline_.begin(), timeline_.upper_bound(step));
  return s;
}

std::vector<int> Summarizer::openSteps() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> v;
  for (auto &[s, sum] : open_)
    v.push_back(s);
  return v;
}

bool mapp::monitor::writeSummaries(const std::string &path,
                                   const std::vector<StepSummary> &records,
                                   std::string *error) {
  std::FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) {
    if (error)
      *error = "cannot write '" + path + "' (" + std::strerror(errno) + ")";
    return false;
  }
  size_t n = records.empty()
                 ? 0
                 : std::fwrite(records.data(), sizeof(StepSummary),
                               records.size(), f);
  bool ok = n == records.size() && std::fclose(f) == 0;
  if (!ok && error)
    *error = "'" + path + "': short write";
  return ok;
}

bool mapp::monitor::readSummaries(const std::string &path,
                                  std::vector<StepSummary> &out,
                                  std::string *error) {
  std::string why;
  bool notRegular = false;
  int fd = rt::openRegularFile(path, why, &notRegular);
  std::FILE *f = fd < 0 ? nullptr : ::fdopen(fd, "rb");
  if (!f) {
    if (fd >= 0) {
      why = std::strerror(errno);
      ::close(fd);
    }
    if (error)
      *error = rt::openFailure("", path, why, notRegular, "cannot read");
    return false;
  }
  StepSummary s;
  size_t k = 0;
  size_t n;
  while ((n = std::fread(&s, 1, sizeof s, f)) == sizeof s) {
    if (s.magic != kSummaryMagic) {
      std::fclose(f);
      if (error)
        *error = "'" + path + "': record " + std::to_string(k) +
                 " is not a step summary (bad magic)";
      return false;
    }
    out.push_back(s);
    ++k;
  }
  std::fclose(f);
  if (n != 0) {
    if (error)
      *error = "'" + path + "': cut off inside record " + std::to_string(k);
    return false;
  }
  return true;
}
