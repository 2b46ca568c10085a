//===- ProbeStoreReader.cpp - typed reads of the probe store --------------===//
//
// The SQL over ProbeStore.cpp's schema that readers need, kept next to it.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/ProbeStoreReader.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeStore.h"
#include "mapp/rt/RegularFile.h"

#include <sqlite3.h>

#include <cstring>

using namespace mapp::rt;

namespace {

/// A prepared statement that throws on error and finalizes itself.
class Query {
public:
  Query(sqlite3 *db, const char *sql) : db(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
      std::string m = sqlite3_errmsg(db);
      sqlite3_finalize(st);
      fail("query failed: ", m);
    }
  }
  ~Query() { sqlite3_finalize(st); }
  Query(const Query &) = delete;
  Query &operator=(const Query &) = delete;
  Query &bind(int i, int64_t v) {
    sqlite3_bind_int64(st, i, v);
    return *this;
  }
  Query &bind(int i, const std::string &s) {
    sqlite3_bind_text(st, i, s.c_str(), -1, SQLITE_TRANSIENT);
    return *this;
  }
  bool step() {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      return true;
    if (rc != SQLITE_DONE)
      fail("query failed: ", sqlite3_errmsg(db));
    return false;
  }
  int64_t i(int c) { return sqlite3_column_int64(st, c); }
  std::optional<double> num(int c) {
    if (sqlite3_column_type(st, c) == SQLITE_NULL)
      return std::nullopt;
    return sqlite3_column_double(st, c);
  }
  std::string s(int c) {
    const unsigned char *t = sqlite3_column_text(st, c);
    return t ? reinterpret_cast<const char *>(t) : "";
  }
  template <typename T> std::vector<T> blob(int c) {
    const void *p = sqlite3_column_blob(st, c);
    int n = sqlite3_column_bytes(st, c);
    // A payload that is not whole elements is a damaged row, not one to
    // cut silently; and no memcpy into an empty vector's null data (UBSan,
    // found by mapp-fuzz-scope on a store edited to idx = 7).
    if (n % sizeof(T) != 0)
      fail("a stored payload of ", n, " bytes is not whole ", sizeof(T),
           "-byte elements (a damaged row)");
    std::vector<T> v(n / sizeof(T));
    if (p && !v.empty())
      std::memcpy(v.data(), p, v.size() * sizeof(T));
    return v;
  }

private:
  sqlite3 *db;
  sqlite3_stmt *st = nullptr;
};

} // namespace

ProbeStoreReader::ProbeStoreReader(const std::string &path) : path_(path) {
  // SQLite would open a FIFO and block in its first read.
  bool notRegular = false;
  if (std::string why = whyNotRegularFile(path, &notRegular); !why.empty())
    fail(openFailure("probe db ", path, why, notRegular));
  // Read-only and mutex-serialized: a server answers on several threads,
  // and a reader never writes to the store.
  if (sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string m = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail("cannot open probe db '", path, "': ", m);
  }
  sqlite3_busy_timeout(db_, 5000);
  std::string why = probeStoreProblem(db_, /*deepCheck=*/true);
  if (!why.empty()) {
    sqlite3_close(db_);
    db_ = nullptr;
    fail("'", path, "' is not a mapp probe database (", why, ")");
  }
}

ProbeStoreReader::~ProbeStoreReader() { sqlite3_close(db_); }

std::vector<StoredRun> ProbeStoreReader::runs() const {
  std::vector<StoredRun> out;
  Query q(db_, "SELECT id, name, started, meta FROM runs ORDER BY id");
  while (q.step())
    out.push_back({q.i(0), q.s(1), q.num(2), q.s(3)});
  return out;
}

std::optional<std::string> ProbeStoreReader::runMeta(int64_t run) const {
  Query q(db_, "SELECT meta FROM runs WHERE id=?");
  q.bind(1, run);
  if (!q.step())
    return std::nullopt;
  return q.s(0);
}

std::vector<StoredProbe> ProbeStoreReader::probes(int64_t run) const {
  std::vector<StoredProbe> out;
  Query q(db_, "SELECT probe_id, point, value, reduce, every, shape, attrs, "
               "group_concat(rank) FROM probes WHERE run_id=? "
               "GROUP BY probe_id ORDER BY probe_id");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.s(1), q.s(2), q.s(3), q.i(4), q.s(5), q.s(6),
                   q.s(7)});
  return out;
}

std::vector<SeriesPoint>
ProbeStoreReader::series(int64_t run, int64_t probe,
                         const std::string &reduction) const {
  std::vector<SeriesPoint> out;
  Query q(db_, "SELECT step, rank, avg(value) FROM samples WHERE run_id=? AND "
               "probe_id=? AND reduction=? AND phase='train' "
               "GROUP BY step, rank ORDER BY step, rank");
  q.bind(1, run).bind(2, probe).bind(3, reduction);
  while (q.step())
    out.push_back({q.i(0), q.i(1), q.num(2)});
  return out;
}

std::optional<StoredSample>
ProbeStoreReader::sample(int64_t run, int64_t probe,
                         const std::string &reduction,
                         const std::string &phase, int64_t rank,
                         std::optional<int64_t> step) const {
  Query q(db_, !step
                   ? "SELECT step, shape, data, idx, value FROM samples WHERE "
                     "run_id=? AND probe_id=? AND reduction=? AND phase=? AND "
                     "rank=? AND microbatch=0 ORDER BY step DESC LIMIT 1"
                   : "SELECT step, shape, data, idx, value FROM samples WHERE "
                     "run_id=? AND probe_id=? AND reduction=? AND phase=? AND "
                     "rank=? AND microbatch=0 AND step=? LIMIT 1");
  q.bind(1, run).bind(2, probe).bind(3, reduction).bind(4, phase).bind(5, rank);
  if (step)
    q.bind(6, *step);
  if (!q.step())
    return std::nullopt;
  StoredSample s;
  s.probe = probe;
  s.step = q.i(0);
  s.shapeJson = q.s(1);
  s.data = q.blob<float>(2);
  s.index = q.blob<int64_t>(3);
  s.value = q.num(4);
  return s;
}

std::vector<StoredSample>
ProbeStoreReader::lensSamples(int64_t run, int64_t step,
                              const std::string &phase, int64_t rank) const {
  std::vector<StoredSample> out;
  Query q(db_, "SELECT s.probe_id, p.point, p.attrs, s.shape, s.data, s.idx "
               "FROM samples s JOIN probes p ON p.run_id=s.run_id AND "
               "p.probe_id=s.probe_id AND p.rank=s.rank WHERE s.run_id=? AND "
               "s.reduction='lens' AND s.step=? AND s.phase=? AND s.rank=? "
               "AND s.microbatch=0 ORDER BY s.probe_id");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  while (q.step()) {
    StoredSample s;
    s.probe = q.i(0);
    s.step = step;
    s.point = q.s(1);
    s.attrsJson = q.s(2);
    s.shapeJson = q.s(3);
    s.data = q.blob<float>(4);
    s.index = q.blob<int64_t>(5);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<StoredSample>
ProbeStoreReader::sketchSamples(int64_t run, int64_t step,
                                const std::string &phase, int64_t rank) const {
  std::vector<StoredSample> out;
  Query q(db_, "SELECT s.probe_id, p.point, s.shape, s.data FROM samples s "
               "JOIN probes p ON p.run_id=s.run_id AND p.probe_id=s.probe_id "
               "AND p.rank=s.rank WHERE s.run_id=? AND s.step=? AND "
               "s.phase=? AND s.reduction='sketch' AND s.rank=? AND "
               "s.microbatch=0 ORDER BY s.probe_id");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  while (q.step()) {
    StoredSample s;
    s.probe = q.i(0);
    s.step = step;
    s.point = q.s(1);
    s.shapeJson = q.s(2);
    s.data = q.blob<float>(3);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<StoredRank> ProbeStoreReader::ranks(int64_t run) const {
  std::vector<StoredRank> out;
  Query q(db_, "SELECT rank, dp, pp, tp FROM ranks WHERE run_id=? ORDER BY "
               "rank");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.i(1), q.i(2), q.i(3)});
  return out;
}

bool ProbeStoreReader::haveTable(const char *name) const {
  Query q(db_, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?");
  q.bind(1, std::string(name));
  return q.step();
}

std::map<int64_t, std::string> ProbeStoreReader::vocab(int64_t run) const {
  std::map<int64_t, std::string> out;
  if (!haveTable("vocab"))
    return out;
  Query q(db_, "SELECT id, text FROM vocab WHERE run_id=?");
  q.bind(1, run);
  while (q.step())
    out[q.i(0)] = q.s(1);
  return out;
}

std::optional<std::string>
ProbeStoreReader::contextTokens(int64_t run, int64_t step,
                                const std::string &phase, int64_t rank) const {
  if (!haveTable("contexts"))
    return std::nullopt;
  Query q(db_, "SELECT tokens FROM contexts WHERE run_id=? AND step=? AND "
               "phase=? ORDER BY rank<>?, rank LIMIT 1");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  if (!q.step())
    return std::nullopt;
  return q.s(0);
}

std::vector<StoredStep> ProbeStoreReader::steps(int64_t run) const {
  std::vector<StoredStep> out;
  Query q(db_, "SELECT step, rank, loss, lr, grad_norm, step_ms, tokens_per_s "
               "FROM steps WHERE run_id=? ORDER BY step, rank");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.i(1), q.num(2), q.num(3), q.num(4), q.num(5),
                   q.num(6)});
  return out;
}

std::vector<StoredToken> ProbeStoreReader::generation(int64_t run) const {
  std::vector<StoredToken> out;
  Query q(db_, "SELECT position, token, text, prob, topk FROM generations "
               "WHERE run_id=? AND rank=0 ORDER BY position");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.i(1), q.s(2), q.num(3), q.s(4)});
  return out;
}

std::vector<StoredSwitch> ProbeStoreReader::switches(int64_t run) const {
  std::vector<StoredSwitch> out;
  Query q(db_, "SELECT switch_id, kind, target, point, enabled, magnitude, "
               "count(*) FROM switches WHERE run_id=? GROUP BY switch_id "
               "ORDER BY switch_id");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.s(1), q.s(2), q.s(3), q.i(4) != 0, q.num(5),
                   q.i(6)});
  return out;
}

std::vector<StoredControlEvent>
ProbeStoreReader::controlLog(int64_t run) const {
  std::vector<StoredControlEvent> out;
  Query q(db_, "SELECT rank, step, switch_id, enabled, magnitude, source FROM "
               "control_log WHERE run_id=? ORDER BY rowid");
  q.bind(1, run);
  while (q.step())
    out.push_back({q.i(0), q.i(1), q.i(2), q.i(3) != 0, q.num(4), q.s(5)});
  return out;
}
