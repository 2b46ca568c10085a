//===- TraceWriter.h - Per-rank trace recorder output -----------*- C++ -*-===//
//
// MappTraceWriter writes one rank's trace in the format of
// docs/trace-format.md. Part of the trace-format library (MappTrace) at the
// bottom of the build: the runtime writes through it, mapp-scan and mapp-sim
// link it; it depends only on the standard library.
//
// Hot path: append() copies a fixed-size record into a preallocated ring
// (a bounded lock-free queue); a background thread formats JSON lines and
// writes them. When the ring is full the event is dropped and counted rather
// than stalling the training step; the footer reports the count.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRACE_TRACEWRITER_H
#define MAPP_TRACE_TRACEWRITER_H

#include "mapp/trace/TraceFormat.h"
#include "mapp/trace/TraceLine.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mapp {

/// The writer's names for the shared vocabulary (TraceFormat.h).
using TraceCategory = trace::Category;
using TraceOp = trace::Op;
using TracePhase = trace::Phase;

/// One event as the recorder hands it over. Fixed size so the ring needs no
/// allocation; names longer than the buffer are truncated.
struct TraceRecord {
  char name[56] = {0};
  char stream[16] = {0}; // empty: the reader derives the track from `cat`
  TraceCategory cat = TraceCategory::Compute;
  TraceOp op = TraceOp::None;
  TracePhase phase = TracePhase::None;
  int32_t step = -1, microbatch = -1, layer = -1, chunk = -1;
  int32_t peer = -1;  // p2p: the other global rank
  int32_t group = -1; // collectives: id from registerGroup()
  int64_t tag = -1;   // p2p tag (plan-lowering: tag * num_mb + mb)
  int64_t seq = -1;   // collectives: per-group issue number; -1 = assign
  uint64_t bytes = 0;
  uint64_t beginNs = 0, endNs = 0; // MappTraceWriter::nowNs() clock
  // Host compute on a single-threaded rank: the thread's CPU time between
  // begin and end (0: not measured). What the op cost the core, without the
  // time the thread was descheduled (docs/trace-format.md).
  uint64_t cpuNs = 0;
  // recv: when the sender called send and when the payload was complete
  // here (the P2PRequest's times, same steady clock; 0 = unknown). Where
  // the landing is only bounded, it lies in (pendingNs, arrivedNs]
  // (pendingNs 0: no lower bound but the send).
  uint64_t sentNs = 0, arrivedNs = 0, pendingNs = 0;
  bool arrivalExact = true;
  void setRecvStamps(uint64_t sent, uint64_t pending, uint64_t arrived) {
    sentNs = sent;
    arrivedNs = arrived;
    pendingNs = pending;
    arrivalExact = pending == arrived;
  }
  // Variable all-to-all (ep_dispatch / ep_combine): the bytes this rank
  // sent to and received from each member, held by the writer
  // (storePeerBytes) so the ring's records keep a fixed size; -1 = none.
  int32_t peerBytes = -1;

  void setName(const char *n);
  void setStream(const char *s);
};

/// The event line of a record (trace/TraceLine.h), without the id and
/// the per-member byte counts, which the writer holds; and back (the line's
/// name and stream truncated to the record's buffers).
trace::EventLine eventLineOf(const TraceRecord &r);
TraceRecord traceRecordOf(const trace::EventLine &e);

struct TraceHeader {
  int rank = 0, world = 1;
  int dp = 0, pp = 0, tp = 0;
  int dpSize = 1, ppSize = 1, tpSize = 1;
  std::string host;   // empty: gethostname()
  std::string device; // e.g. "cpu" or "cuda:0"
  // Clock readings at open; 0 = read the real clocks (simulators set them).
  uint64_t monoStartNs = 0, wallStartNs = 0;
  // Run identity (docs/trace-format.md): the same on every rank of one job,
  // so mapp-scan can refuse files of different runs. Empty: not written.
  std::string runId; // e.g. 16 hex digits from newRunId()
  std::string plan;  // the plan's seal checksum, "0x%08x"
};

/// A fresh run id: 16 hex digits from the OS's random source (mixed with the
/// clock and pid should it fail). One per job: rank 0's, shared by all.
std::string newRunId();

/// Sees every record as it is appended (and every group as it is
/// declared), on the appending thread: MegaScan live's summaries
/// (mapp/monitor/Summary.h) are built this way. Must be cheap and
/// thread-safe; it is not owned.
class TraceTap {
public:
  virtual ~TraceTap() = default;
  virtual void onGroup(int id, const std::string &kind,
                       const std::vector<int> &members) = 0;
  virtual void onRecord(const TraceRecord &r) = 0;
};

class MappTraceWriter {
public:
  /// Opens DIR/rank-{rank}.trace.jsonl (creating DIR) and writes the header.
  /// Returns null and sets *error when the file cannot be created.
  static std::unique_ptr<MappTraceWriter> open(const std::string &dir,
                                               const TraceHeader &header,
                                               std::string *error,
                                               size_t capacity = 1 << 16);
  /// A writer without a file: records go to `tap` only (mapp-run --monitor
  /// without --trace-dir). No background thread, nothing is queued.
  static std::unique_ptr<MappTraceWriter> openTapOnly(TraceTap *tap);
  ~MappTraceWriter();

  /// Also hands every record to `tap` (null: none). Set before the first
  /// append; groups declared before are replayed to it.
  void setTap(TraceTap *tap);

  /// The clock every begin/end must come from (steady, nanoseconds).
  static uint64_t nowNs();
  /// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), nanoseconds.
  static uint64_t threadCpuNs();

  /// Declares a communicator; returns the id events put in `group`.
  /// `kind` is "tp", "dp", "pp", "mp", "world", ... Thread-safe.
  int registerGroup(const std::string &kind, const std::vector<int> &members);
  /// The next collective sequence number of `group`; call at issue time
  /// so every member numbers the same collective alike.
  int64_t nextSeq(int group);

  /// Keeps per-member byte counts for one record (TraceRecord::peerBytes);
  /// the event line then carries "send_bytes" and "recv_bytes" arrays in
  /// group member order. Thread-safe.
  int32_t storePeerBytes(const std::vector<uint64_t> &send,
                         const std::vector<uint64_t> &recv);

  /// Queues an event. Returns its id (unique per rank, increasing in append
  /// order), or -1 when the ring was full and the event was dropped.
  int64_t append(const TraceRecord &r);

  /// Blocks until every event appended before the call is on disk.
  void flush();
  /// Flushes, writes the footer and closes the file. Idempotent.
  void close();

  /// Makes append() wait for room instead of dropping (offline writers such
  /// as mapp-sim, which must not lose events).
  void setBlockWhenFull(bool b) { blockWhenFull = b; }

  uint64_t dropped() const { return droppedCount.load(); }
  const std::string &path() const { return filePath; }

private:
  MappTraceWriter(std::FILE *f, std::string path, size_t capacity);
  void run();
  size_t drain(std::string &buf);
  void writeGroups(std::string &buf);

  struct Slot {
    std::atomic<uint64_t> seq;
    TraceRecord rec;
  };
  struct Group {
    std::string kind;
    std::vector<int> members;
    std::atomic<int64_t> nextSeq{0};
  };

  std::FILE *file; // null: tap only
  TraceTap *tap_ = nullptr;
  std::atomic<int64_t> tapOnlyIds{0};
  std::string filePath;
  std::unique_ptr<Slot[]> slots;
  uint64_t mask;
  alignas(64) std::atomic<uint64_t> head{0};
  alignas(64) uint64_t tail = 0; // consumer only
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> droppedCount{0};
  bool blockWhenFull = false;

  std::mutex peerMutex;
  std::map<int32_t, std::pair<std::vector<uint64_t>, std::vector<uint64_t>>>
      peerBytes;
  int32_t nextPeerBytes = 0;

  std::mutex groupMutex;
  std::deque<Group> groups;
  size_t groupsWritten = 0;

  std::mutex mu;
  std::condition_variable wake, done;
  bool stopping = false, closed = false;
  std::thread worker;
};

} // namespace mapp

#endif // MAPP_TRACE_TRACEWRITER_H
