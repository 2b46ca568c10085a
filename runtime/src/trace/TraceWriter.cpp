//===- TraceWriter.cpp - Per-rank trace recorder output -------------------===//

#include "mapp/trace/TraceWriter.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <climits>
#include <cstring>
#include <ctime>
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

/// `,"key":` of an event line.
static void appendKey(std::string &out, const char *key) {
  out += ",\"";
  out += key;
  out += "\":";
}

static void appendInt(std::string &out, const char *key, long long v) {
  char buf[64];
  int n = std::snprintf(buf, sizeof(buf), ",\"%s\":%lld", key, v);
  out.append(buf, n);
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

static std::string headerLine(const TraceHeader &h, uint64_t mono,
                              uint64_t wall) {
  std::string host = h.host;
  if (host.empty()) {
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) == 0)
      host = buf;
  }
  std::string s =
      "{\"type\":\"header\",\"format\":\"mapp-trace\"";
  appendInt(s, "version", trace::kFormatVersion);
  appendInt(s, "rank", h.rank);
  appendInt(s, "world", h.world);
  appendInt(s, "dp", h.dp);
  appendInt(s, "pp", h.pp);
  appendInt(s, "tp", h.tp);
  appendInt(s, "dp_size", h.dpSize);
  appendInt(s, "pp_size", h.ppSize);
  appendInt(s, "tp_size", h.tpSize);
  s += ",\"host\":";
  trace::appendJsonString(s, host);
  s += ",\"device\":";
  trace::appendJsonString(s, h.device);
  appendInt(s, "pid", (long long)getpid());
  s += ",\"clock\":\"steady\"";
  appendInt(s, "mono_start_ns", (long long)mono);
  appendInt(s, "wall_start_ns", (long long)wall);
  if (!h.runId.empty()) {
    s += ",\"run_id\":";
    trace::appendJsonString(s, h.runId);
  }
  if (!h.plan.empty()) {
    s += ",\"plan\":";
    trace::appendJsonString(s, h.plan);
  }
  s += "}\n";
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

static void appendArray(std::string &out, const char *key,
                        const std::vector<uint64_t> &v) {
  out += ",\"";
  out += key;
  out += "\":[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i)
      out += ',';
    out += std::to_string(v[i]);
  }
  out += ']';
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
    buf += "{\"type\":\"group\"";
    appendInt(buf, "id", (long long)groupsWritten);
    buf += ",\"kind\":";
    trace::appendJsonString(buf, g.kind);
    buf += ",\"members\":[";
    for (size_t i = 0; i < g.members.size(); ++i) {
      if (i)
        buf += ',';
      buf += std::to_string(g.members[i]);
    }
    buf += "]}\n";
  }
}

size_t MappTraceWriter::drain(std::string &buf) {
  size_t n = 0;
  for (;;) {
    Slot &slot = slots[tail & mask];
    if (slot.seq.load(std::memory_order_acquire) != tail + 1)
      break;
    const TraceRecord &r = slot.rec;
    namespace f = trace::field;
    buf += "{\"";
    buf += f::kId;
    buf += "\":";
    buf += std::to_string(tail);
    appendKey(buf, f::kName);
    trace::appendJsonString(buf, r.name);
    appendKey(buf, f::kCat);
    trace::appendJsonString(buf, trace::categoryName(r.cat));
    if (r.op != TraceOp::None) {
      appendKey(buf, f::kOp);
      trace::appendJsonString(buf, trace::opName(r.op));
    }
    appendInt(buf, f::kBegin, (long long)r.beginNs);
    appendInt(buf, f::kEnd, (long long)r.endNs);
    if (r.step >= 0)
      appendInt(buf, f::kStep, r.step);
    if (r.microbatch >= 0)
      appendInt(buf, f::kMicrobatch, r.microbatch);
    if (r.layer >= 0)
      appendInt(buf, f::kLayer, r.layer);
    if (r.chunk >= 0)
      appendInt(buf, f::kChunk, r.chunk);
    if (r.bytes)
      appendInt(buf, f::kBytes, (long long)r.bytes);
    if (r.cpuNs)
      appendInt(buf, f::kCpu, (long long)r.cpuNs);
    if (r.peer >= 0)
      appendInt(buf, f::kPeer, r.peer);
    if (r.tag >= 0)
      appendInt(buf, f::kTag, r.tag);
    if (r.sentNs)
      appendInt(buf, f::kSent, (long long)r.sentNs);
    if (r.arrivedNs) {
      appendInt(buf, f::kArrived, (long long)r.arrivedNs);
      if (!r.arrivalExact)
        appendInt(buf, f::kPending, (long long)r.pendingNs);
    }
    if (r.group >= 0)
      appendInt(buf, f::kGroup, r.group);
    if (r.seq >= 0)
      appendInt(buf, f::kSeq, r.seq);
    if (r.peerBytes >= 0) {
      std::lock_guard<std::mutex> lock(peerMutex);
      auto it = peerBytes.find(r.peerBytes);
      if (it != peerBytes.end()) {
        appendArray(buf, f::kSendBytes, it->second.first);
        appendArray(buf, f::kRecvBytes, it->second.second);
        peerBytes.erase(it);
      }
    }
    if (r.stream[0]) {
      appendKey(buf, f::kStream);
      trace::appendJsonString(buf, r.stream);
    }
    if (r.phase != TracePhase::None) {
      appendKey(buf, f::kPhase);
      trace::appendJsonString(buf, trace::phaseName(r.phase));
    }
    buf += "}\n";
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
  std::string s = "{\"type\":\"footer\"";
  appendInt(s, "events", (long long)tail);
  appendInt(s, "dropped", (long long)droppedCount.load());
  appendInt(s, "mono_end_ns", (long long)nowNs());
  s += "}\n";
  std::fwrite(s.data(), 1, s.size(), file);
  std::fclose(file);
  std::lock_guard<std::mutex> lock(mu);
  closed = true;
}
