//===- ProbeStoreReader.h - typed reads of a probe store --------*- C++ -*-===//
//
// The read side of ProbeStore.h's SQLite schema, beside the writer that
// defines it, so the schema has one owner: mapp-scope (and anything else
// that shows a store) asks for typed rows and never writes SQL of its own.
// The connection is read-only and serialized (SQLITE_OPEN_FULLMUTEX): one
// reader may answer on several threads. Every query runs as the run writes
// (WAL): rows a rank has not committed yet are simply absent.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBESTOREREADER_H
#define MAPP_RT_PROBESTOREREADER_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace mapp::rt {

// Columns that SQL may hold as NULL are std::optional; JSON-valued columns
// (meta, shape, attrs, topk) are returned as the stored text, unparsed.

struct StoredRun {
  int64_t id = 0;
  std::string name;
  std::optional<double> started;
  std::string metaJson;
};

/// One probe of a run; `ranks` lists the ranks that registered it
/// ("0,1,...", SQL group_concat order).
struct StoredProbe {
  int64_t id = 0;
  std::string point, value, reduce;
  int64_t every = 0;
  std::string shapeJson, attrsJson, ranks;
};

/// A scalar reduction of one step and rank, averaged over microbatches.
struct SeriesPoint {
  int64_t step = 0, rank = 0;
  std::optional<double> value;
};

/// One stored sample (microbatch 0) with its payload.
struct StoredSample {
  int64_t probe = 0, step = 0;
  std::string point;    // the probe's point (filled by lens/sketch reads)
  std::string attrsJson; // the probe's attrs (filled by lens reads)
  std::string shapeJson;
  std::vector<float> data;
  std::vector<int64_t> index;
  std::optional<double> value;
};

struct StoredStep {
  int64_t step = 0, rank = 0;
  std::optional<double> loss, lr, gradNorm, stepMs, tokensPerS;
};

struct StoredToken {
  int64_t position = 0, token = 0;
  std::string text;
  std::optional<double> prob;
  std::string topkJson;
};

/// A switch as registered, `ranks` = how many ranks registered it.
struct StoredSwitch {
  int64_t id = 0;
  std::string kind, target, point;
  bool enabled = false;
  std::optional<double> magnitude;
  int64_t ranks = 0;
};

struct StoredControlEvent {
  int64_t rank = 0, step = 0, switchId = 0;
  bool enabled = false;
  std::optional<double> magnitude;
  std::string source;
};

/// A rank of the run and its (dp, pp, tp) coordinates.
struct StoredRank {
  int64_t rank = 0, dp = 0, pp = 0, tp = 0;
};

class ProbeStoreReader {
public:
  /// Opens `path` read-only and validates it (probeStoreProblem with the
  /// deep check); Error naming the file when it cannot be opened or is not
  /// a mapp probe store.
  explicit ProbeStoreReader(const std::string &path);
  ~ProbeStoreReader();
  ProbeStoreReader(const ProbeStoreReader &) = delete;
  ProbeStoreReader &operator=(const ProbeStoreReader &) = delete;

  const std::string &path() const { return path_; }

  /// Every run, by id.
  std::vector<StoredRun> runs() const;
  /// The meta JSON text of run `run`; nullopt when there is no such run.
  std::optional<std::string> runMeta(int64_t run) const;
  /// The run's probes by id, one row per probe over all ranks.
  std::vector<StoredProbe> probes(int64_t run) const;
  /// Training-phase scalar `reduction` of `probe`: per (step, rank) the
  /// mean over microbatches, ordered by step then rank.
  std::vector<SeriesPoint> series(int64_t run, int64_t probe,
                                  const std::string &reduction) const;
  /// The microbatch-0 sample of (probe, reduction, phase, rank) at `step`,
  /// or at the latest recorded step when `step` is empty; nullopt if none.
  std::optional<StoredSample> sample(int64_t run, int64_t probe,
                                     const std::string &reduction,
                                     const std::string &phase, int64_t rank,
                                     std::optional<int64_t> step) const;
  /// Every microbatch-0 'lens' sample of one step, phase and rank, by probe
  /// (point and attrs filled in).
  std::vector<StoredSample> lensSamples(int64_t run, int64_t step,
                                        const std::string &phase,
                                        int64_t rank) const;
  /// Every microbatch-0 'sketch' sample of one step, phase and rank, by
  /// probe (point filled in).
  std::vector<StoredSample> sketchSamples(int64_t run, int64_t step,
                                          const std::string &phase,
                                          int64_t rank) const;
  /// The run's ranks with their coordinates, by rank.
  std::vector<StoredRank> ranks(int64_t run) const;
  /// Token id -> text from the optional `vocab` table (TokenRecord.cpp);
  /// empty for stores without one.
  std::map<int64_t, std::string> vocab(int64_t run) const;
  /// The token ids (JSON array text) that one forward of `step` saw, from
  /// the optional `contexts` table: `rank`'s row, else any rank's (every
  /// first-stage rank of a step saw batch row 0 of its dp rank); nullopt
  /// when the store has none.
  std::optional<std::string> contextTokens(int64_t run, int64_t step,
                                           const std::string &phase,
                                           int64_t rank) const;
  /// Step metrics of every rank, ordered by step then rank.
  std::vector<StoredStep> steps(int64_t run) const;
  /// Rank 0's generated tokens by position.
  std::vector<StoredToken> generation(int64_t run) const;
  /// Registered switches by id, and every control event in arrival order.
  std::vector<StoredSwitch> switches(int64_t run) const;
  std::vector<StoredControlEvent> controlLog(int64_t run) const;

private:
  bool haveTable(const char *name) const;

  sqlite3 *db_ = nullptr;
  std::string path_;
};

} // namespace mapp::rt

#endif
