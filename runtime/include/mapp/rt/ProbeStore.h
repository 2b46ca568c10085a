//===- ProbeStore.h - the SQLite probe store --------------------*- C++ -*-===//
//
// Samples go through a bounded queue to one writer thread that commits them
// in batches, so the training thread never waits on disk unless the queue is
// full (then it waits: no sample is ever dropped silently). The database is
// in WAL mode so mapp-scope reads while a run writes, and several rank
// processes may share one file (busy timeout). Tables: docs/megascope.md.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBESTORE_H
#define MAPP_RT_PROBESTORE_H

#include "mapp/rt/Probe.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

struct sqlite3;

namespace mapp::rt {

/// Where a sample was taken: the rank and its Megatron coordinates.
struct RankInfo {
  int rank = 0, dp = 0, pp = 0, tp = 0;
};

class ProbeStore {
public:
  /// Opens or creates `path`; Error naming the file when it is not a
  /// usable mapp probe database (corrupt, foreign schema, unwritable).
  /// Nothing is written to an existing file before it is known to be an
  /// empty SQLite file or a mapp store: a foreign database stays
  /// byte-identical (no tables added, journal mode unchanged).
  ProbeStore(const std::string &path, RankInfo rank,
             size_t queueBytes = 64u << 20);
  ~ProbeStore();
  ProbeStore(const ProbeStore &) = delete;
  ProbeStore &operator=(const ProbeStore &) = delete;

  /// Finds or creates the run `name` ("" = a new run); returns its id.
  /// `meta` is a JSON object with plan, mode, world_size, tp/pp/dp, control.
  int64_t beginRun(const std::string &name, const std::string &metaJson);
  int64_t runId() const { return run_; }

  /// Queues a sample (blocks only while the queue is over its byte cap).
  void add(ProbeSample &&s, const char *phase);
  /// Queues an arbitrary statement batch run on the writer thread.
  void exec(std::function<void(sqlite3 *)> fn);
  /// Waits until everything queued is committed; rethrows writer errors.
  void flush();

  const RankInfo &rank() const { return rank_; }
  /// Samples the writer had to wait for (queue full), for the report.
  uint64_t stalls() const { return stalls_; }

private:
  struct Item;
  void writerLoop();
  void writeSample(const Item &it);

  std::string path_;
  RankInfo rank_;
  sqlite3 *db_ = nullptr;
  int64_t run_ = -1;
  size_t capBytes_;
  std::mutex mu_;
  std::condition_variable cv_, space_, idle_;
  std::deque<std::unique_ptr<Item>> queue_;
  size_t queuedBytes_ = 0;
  bool stop_ = false, busy_ = false;
  std::string error_;
  uint64_t stalls_ = 0;
  std::thread writer_;
};

/// "" when `db` holds a mapp probe store (every table and column of the
/// schema, meta.schema = the version this build writes), else why not
/// ("file is not a database", "no table 'samples'", ...). Only reads.
/// `deepCheck` adds PRAGMA quick_check (reads every page: mapp-scope's
/// start, not every rank of a job).
std::string probeStoreProblem(sqlite3 *db, bool deepCheck = false);

/// Prepared-statement helper shared by the store and mapp-scope: binds and
/// steps, throwing Error with sqlite's message on failure.
void sqlExec(sqlite3 *db, const std::string &sql);

} // namespace mapp::rt

#endif
