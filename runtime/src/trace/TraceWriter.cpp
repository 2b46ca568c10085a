//===- TraceWriter.cpp - Per-rank trace recorder output -------------------===//

#include "mapp/trace/TraceWriter.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <climits>
#include <cstring>
#include <ctime>
#include <sched.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp;

static void copyTruncated(char *dst, size_t cap, const char *src) {
  size_t n = src ? std::strlen(src) : 0;
  if (n >= cap)
    n = cap - 1;
  if (n)
    std::memcpy(dst, src, n);
  dst[n] = 0;
}

void TraceRecord::setName(const char *n) {
  copyTruncated(name, sizeof(name), n);
}
void TraceRecord::setStream(const char *s) {
  copyTruncated(stream, sizeof(stream), s);
}

trace::EventLine mapp::eventLineOf(const TraceRecord &r) {
  trace::EventLine e;
  e.name = r.name;
  e.stream = r.stream;
  e.cat = r.cat;
  e.op = r.op;
  e.phase = r.phase;
  e.step = r.step;
  e.mb = r.microbatch;
  e.layer = r.layer;
  e.chunk = r.chunk;
  e.peer = r.peer;
  e.group = r.group;
  e.tag = r.tag;
  e.seq = r.seq;
  e.bytes = r.bytes;
  e.b = static_cast<int64_t>(r.beginNs);
  e.e = static_cast<int64_t>(r.endNs);
  // The record's 0 is the line's "not recorded" (-1), but for `pending`,
  // whose 0 is a bound (by the send alone).
  auto stamp = [](uint64_t v) { return v ? static_cast<int64_t>(v) : -1; };
  e.cpu = stamp(r.cpuNs);
  e.sent = stamp(r.sentNs);
  e.arrived = stamp(r.arrivedNs);
  e.pending = r.arrivedNs && !r.arrivalExact
                  ? static_cast<int64_t>(r.pendingNs)
                  : -1;
  return e;
}

TraceRecord mapp::traceRecordOf(const trace::EventLine &e) {
  TraceRecord r;
  r.setName(e.name.c_str());
  r.setStream(e.stream.c_str());
  r.cat = e.cat;
  r.op = e.op;
  r.phase = e.phase;
  r.step = e.step;
  r.microbatch = e.mb;
  r.layer = e.layer;
  r.chunk = e.chunk;
  r.peer = e.peer;
  r.group = e.group;
  r.tag = e.tag;
  r.seq = e.seq;
  r.bytes = e.bytes;
  r.beginNs = static_cast<uint64_t>(e.b);
  r.endNs = static_cast<uint64_t>(e.e);
  auto stamp = [](int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; };
  r.cpuNs = stamp(e.cpu);
  r.sentNs = stamp(e.sent);
  r.arrivedNs = stamp(e.arrived);
  r.pendingNs = stamp(e.pending);
  r.arrivalExact = e.pending < 0;
  return r;
}

uint64_t MappTraceWriter::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t MappTraceWriter::threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

std::string mapp::newRunId() {
  uint64_t x = 0;
  try {
    std::random_device rd;
    x = (uint64_t(rd()) << 32) ^ rd();
  } catch (const std::exception &) {
  }
  x ^= MappTraceWriter::nowNs() * 0x9E3779B97F4A7C15ull ^ uint64_t(getpid()) << 17;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)x);
  return buf;
}

/// This process's CPU affinity as a list ("0-3,8"); "" when unknown.
static std::string affinityCpuList() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return "";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set))
      continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
      ++last;
    out += (out.empty() ? "" : ",") + std::to_string(c) +
           (last > c ? "-" + std::to_string(last) : "");
    c = last;
  }
  return out;
}

static std::string headerLine(const TraceHeader &h, uint64_t mono,
                              uint64_t wall) {
  trace::HeaderLine line;
  line.rank = h.rank;
  line.world = h.world;
  line.dp = h.dp;
  line.pp = h.pp;
  line.tp = h.tp;
  line.dpSize = h.dpSize;
  line.ppSize = h.ppSize;
  line.tpSize = h.tpSize;
  line.host = h.host;
  if (line.host.empty()) { // a real host (a simulation names its own)
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) == 0)
      line.host = buf;
    line.cpus = affinityCpuList();
  }
  line.device = h.device;
  line.pid = getpid();
  line.clock = "steady";
  line.monoStartNs = static_cast<int64_t>(mono);
  line.wallStartNs = static_cast<int64_t>(wall);
  line.runId = h.runId;
  line.plan = h.plan;
  std::string s;
  trace::appendHeaderLine(s, line);
  return s;
}

std::unique_ptr<MappTraceWriter>
MappTraceWriter::open(const std::string &dir, const TraceHeader &header,
                      std::string *error, size_t capacity) {
  // mkdir -p; failures surface when fopen fails below.
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/')
      ::mkdir(dir.substr(0, i).c_str(), 0777);
  std::string path =
      dir + "/rank-" + std::to_string(header.rank) + ".trace.jsonl";
  std::FILE *f = std::fopen(path.c_str(), "w");
  if (!f) {
    if (error)
      *error = "cannot create '" + path + "': " + std::strerror(errno);
    return nullptr;
  }
  uint64_t mono = header.monoStartNs ? header.monoStartNs : nowNs();
  uint64_t wall = header.wallStartNs
                      ? header.wallStartNs
                      : std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  std::string h = headerLine(header, mono, wall);
  std::fwrite(h.data(), 1, h.size(), f);
  size_t cap = 64;
  while (cap < capacity)
    cap <<= 1;
  return std::unique_ptr<MappTraceWriter>(
      new MappTraceWriter(f, std::move(path), cap));
}

MappTraceWriter::MappTraceWriter(std::FILE *f, std::string path,
                                 size_t capacity)
    : file(f), filePath(std::move(path)), slots(new Slot[capacity]),
      mask(capacity - 1) {
  for (size_t i = 0; i < capacity; ++i)
    slots[i].seq.store(i, std::memory_order_relaxed);
  if (file)
    worker = std::thread([this] { run(); });
}

std::unique_ptr<MappTraceWriter> MappTraceWriter::openTapOnly(TraceTap *tap) {
  std::unique_ptr<MappTraceWriter> w(new MappTraceWriter(nullptr, "", 1));
  w->tap_ = tap;
  return w;
}

void MappTraceWriter::setTap(TraceTap *tap) {
  std::lock_guard<std::mutex> lock(groupMutex);
  tap_ = tap;
  if (tap_)
    for (size_t i = 0; i < groups.size(); ++i)
      tap_->onGroup((int)i, groups[i].kind, groups[i].members);
}

MappTraceWriter::~MappTraceWriter() { close(); }

int MappTraceWriter::registerGroup(const std::string &kind,
                                   const std::vector<int> &members) {
  std::lock_guard<std::mutex> lock(groupMutex);
  groups.emplace_back();
  groups.back().kind = kind;
  groups.back().members = members;
  if (tap_)
    tap_->onGroup((int)groups.size() - 1, kind, members);
  return (int)groups.size() - 1;
}

int64_t MappTraceWriter::nextSeq(int group) {
  std::lock_guard<std::mutex> lock(groupMutex);
  if (group < 0 || (size_t)group >= groups.size())
    return -1;
  return groups[group].nextSeq.fetch_add(1);
}

int32_t MappTraceWriter::storePeerBytes(const std::vector<uint64_t> &send,
                                        const std::vector<uint64_t> &recv) {
  std::lock_guard<std::mutex> lock(peerMutex);
  int32_t id = nextPeerBytes;
  nextPeerBytes = nextPeerBytes == INT32_MAX ? 0 : nextPeerBytes + 1;
  peerBytes[id] = {send, recv};
  return id;
}

int64_t MappTraceWriter::append(const TraceRecord &r) {
  if (tap_)
    tap_->onRecord(r);
  if (!file)
    return tapOnlyIds.fetch_add(1, std::memory_order_relaxed);
  // Vyukov's bounded queue: a slot whose seq equals the ticket is free.
  uint64_t pos = head.load(std::memory_order_relaxed);
  Slot *slot;
  for (;;) {
    slot = &slots[pos & mask];
    uint64_t seq = slot->seq.load(std::memory_order_acquire);
    int64_t dif = (int64_t)seq - (int64_t)pos;
    if (dif == 0) {
      if (head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed))
        break;
    } else if (dif < 0) {
      if (blockWhenFull) {
        std::this_thread::yield();
        pos = head.load(std::memory_order_relaxed);
        continue;
      }
      droppedCount.fetch_add(1, std::memory_order_relaxed);
      if (r.peerBytes >= 0) {
        std::lock_guard<std::mutex> lock(peerMutex);
        peerBytes.erase(r.peerBytes);
      }
      return -1;
    } else {
      pos = head.load(std::memory_order_relaxed);
    }
  }
  slot->rec = r;
  if (r.seq < 0 && r.group >= 0)
    slot->rec.seq = nextSeq(r.group);
  slot->seq.store(pos + 1, std::memory_order_release);
  return (int64_t)pos;
}

void MappTraceWriter::writeGroups(std::string &buf) {
  std::lock_guard<std::mutex> lock(groupMutex);
  for (; groupsWritten < groups.size(); ++groupsWritten) {
    const Group &g = groups[groupsWritten];
    trace::appendGroupLine(buf, {(int)groupsWritten, g.kind, g.members});
  }
}

size_t MappTraceWriter::drain(std::string &buf) {
  size_t n = 0;
  for (;;) {
    Slot &slot = slots[tail & mask];
    if (slot.seq.load(std::memory_order_acquire) != tail + 1)
      break;
    const TraceRecord &r = slot.rec;
    trace::EventLine line = eventLineOf(r);
    line.id = static_cast<int64_t>(tail);
    if (r.peerBytes >= 0) {
      std::lock_guard<std::mutex> lock(peerMutex);
      auto it = peerBytes.find(r.peerBytes);
      if (it != peerBytes.end()) {
        line.sendBytes = std::move(it->second.first);
        line.recvBytes = std::move(it->second.second);
        peerBytes.erase(it);
      }
    }
    trace::appendEventLine(buf, line);
    slot.seq.store(tail + mask + 1, std::memory_order_release);
    ++tail;
    ++n;
  }
  return n;
}

void MappTraceWriter::run() {
  std::string buf;
  buf.reserve(1 << 20);
  for (;;) {
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu);
      // Polling keeps append() free of notifications (no syscalls).
      wake.wait_for(lock, std::chrono::milliseconds(5));
      stop = stopping;
    }
    buf.clear();
    writeGroups(buf);
    drain(buf);
    if (!buf.empty())
      std::fwrite(buf.data(), 1, buf.size(), file);
    {
      std::lock_guard<std::mutex> lock(mu);
      written.store(tail);
    }
    done.notify_all();
    if (stop && head.load() == tail)
      return;
  }
}

void MappTraceWriter::flush() {
  if (!file)
    return;
  uint64_t target = head.load();
  std::unique_lock<std::mutex> lock(mu);
  if (closed)
    return;
  wake.notify_one();
  // Appends still being copied may hold tickets below target for a moment;
  // the worker keeps polling until they land.
  done.wait(lock, [&] { return written.load() >= target; });
  std::fflush(file);
}

void MappTraceWriter::close() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed)
      return;
    stopping = true;
    if (!file) {
      closed = true;
      return;
    }
  }
  wake.notify_one();
  worker.join();
  std::string s;
  trace::appendFooterLine(s, {static_cast<int64_t>(tail),
                              static_cast<int64_t>(droppedCount.load()),
                              static_cast<int64_t>(nowNs())});
  std::fwrite(s.data(), 1, s.size(), file);
  std::fclose(file);
  std::lock_guard<std::mutex> lock(mu);
  closed = true;
}
