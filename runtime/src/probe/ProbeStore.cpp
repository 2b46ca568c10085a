//===- ProbeStore.cpp - SQLite writer of probe samples --------------------===//
#include "mapp/rt/ProbeStore.h"
#include "mapp/rt/Error.h"

#include <sqlite3.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <vector>

using namespace mapp::rt;

namespace {

constexpr int kSchemaVersion = 1;

const char *kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs(id INTEGER PRIMARY KEY, name TEXT UNIQUE,
  started REAL, meta TEXT);
CREATE TABLE IF NOT EXISTS ranks(run_id INT, rank INT, dp INT, pp INT, tp INT,
  PRIMARY KEY(run_id, rank));
CREATE TABLE IF NOT EXISTS probes(run_id INT, probe_id INT, rank INT,
  point TEXT, value TEXT, reduce TEXT, every INT, shape TEXT, attrs TEXT,
  PRIMARY KEY(run_id, probe_id, rank));
CREATE TABLE IF NOT EXISTS steps(run_id INT, rank INT, step INT, loss REAL,
  lr REAL, grad_norm REAL, step_ms REAL, tokens_per_s REAL,
  PRIMARY KEY(run_id, rank, step));
CREATE TABLE IF NOT EXISTS samples(run_id INT, probe_id INT, step INT,
  microbatch INT, phase TEXT, rank INT, dp INT, pp INT, tp INT,
  reduction TEXT, value REAL, shape TEXT, data BLOB, idx BLOB);
CREATE INDEX IF NOT EXISTS samples_by_probe
  ON samples(run_id, probe_id, reduction, step);
CREATE TABLE IF NOT EXISTS switches(run_id INT, switch_id INT, rank INT,
  kind TEXT, target TEXT, point TEXT, enabled INT, magnitude REAL,
  PRIMARY KEY(run_id, switch_id, rank));
CREATE TABLE IF NOT EXISTS control_log(run_id INT, rank INT, step INT,
  switch_id INT, enabled INT, magnitude REAL, source TEXT);
CREATE TABLE IF NOT EXISTS generations(run_id INT, rank INT, position INT,
  token INT, text TEXT, prob REAL, topk TEXT,
  PRIMARY KEY(run_id, rank, position));
)sql";

/// Runs `sql` and collects the first column of every row as text; Error
/// with sqlite's message (the first read is where a foreign or corrupt
/// file shows).
std::vector<std::string> column0(sqlite3 *db, const std::string &sql) {
  sqlite3_stmt *st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    std::string m = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    fail(m);
  }
  std::vector<std::string> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(st, 0);
    out.push_back(t ? reinterpret_cast<const char *>(t) : "");
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    fail(sqlite3_errmsg(db));
  return out;
}

/// The tables and columns of kSchema, read back from an in-memory database
/// built from it: one source of truth for what a store must contain.
const std::map<std::string, std::set<std::string>> &expectedSchema() {
  static const std::map<std::string, std::set<std::string>> tables = [] {
    sqlite3 *mem = nullptr;
    sqlite3_open(":memory:", &mem);
    sqlExec(mem, kSchema);
    std::map<std::string, std::set<std::string>> t;
    for (const std::string &name :
         column0(mem, "SELECT name FROM sqlite_master WHERE type='table'"))
      for (const std::string &c :
           column0(mem, "SELECT name FROM pragma_table_info('" + name + "')"))
        t[name].insert(c);
    sqlite3_close(mem);
    return t;
  }();
  return tables;
}

std::string shapeJson(const Shape &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

} // namespace

struct ProbeStore::Item {
  ProbeSample sample;
  const char *phase = "train";
  std::function<void(sqlite3 *)> fn;
  size_t bytes() const {
    return sizeof(Item) + sample.data.size() * 4 + sample.index.size() * 8;
  }
};

void mapp::rt::sqlExec(sqlite3 *db, const std::string &sql) {
  char *msg = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
    std::string m = msg ? msg : sqlite3_errmsg(db);
    sqlite3_free(msg);
    fail(m);
  }
}

std::string mapp::rt::probeStoreProblem(sqlite3 *db, bool deepCheck) {
  try {
    std::set<std::string> have;
    for (const std::string &t :
         column0(db, "SELECT name FROM sqlite_master WHERE type='table'"))
      have.insert(t);
    if (have.empty())
      return "an empty database: no mapp tables";
    if (!have.count("meta"))
      return "no table 'meta': a SQLite database of another program";
    for (const auto &[table, columns] : expectedSchema()) {
      if (!have.count(table))
        return "no table '" + table + "'";
      std::set<std::string> cols;
      for (const std::string &c : column0(
               db, "SELECT name FROM pragma_table_info('" + table + "')"))
        cols.insert(c);
      for (const std::string &c : columns)
        if (!cols.count(c))
          return "table '" + table + "' has no column '" + c + "'";
    }
    std::vector<std::string> v =
        column0(db, "SELECT value FROM meta WHERE key='schema'");
    if (v.empty())
      return "no schema version in table 'meta'";
    if (v[0] != std::to_string(kSchemaVersion))
      return "schema version " + v[0] + ", this build reads " +
             std::to_string(kSchemaVersion);
    if (deepCheck) {
      std::vector<std::string> r = column0(db, "PRAGMA quick_check(1)");
      if (r.empty() || r[0] != "ok")
        return "corrupt: " + (r.empty() ? std::string("quick_check failed")
                                        : r[0]);
    }
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

ProbeStore::ProbeStore(const std::string &path, RankInfo rank,
                       size_t queueBytes)
    : path_(path), rank_(rank), capBytes_(queueBytes) {
  if (sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                          SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string m = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail("probe db '", path, "': cannot open: ", m);
  }
  sqlite3_busy_timeout(db_, 15000);
  try {
    // Read before writing anything: a file with tables must already be a
    // mapp store, so a foreign database is left exactly as it was.
    auto tables = [&] {
      return column0(db_, "SELECT count(*) FROM sqlite_master")[0];
    };
    if (tables() != "0") {
      std::string why = probeStoreProblem(db_);
      if (!why.empty())
        fail(why);
    } else {
      // A new (or empty) file: create the schema under the write lock;
      // ranks sharing the file may race here, the statements are
      // idempotent and the re-check sees a rank that won.
      sqlExec(db_, "BEGIN IMMEDIATE");
      try {
        if (tables() != "0") {
          std::string why = probeStoreProblem(db_);
          if (!why.empty())
            fail(why);
        }
        sqlExec(db_, kSchema);
        sqlExec(db_, "INSERT OR IGNORE INTO meta VALUES('schema','" +
                         std::to_string(kSchemaVersion) + "')");
        sqlExec(db_, "COMMIT");
      } catch (...) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    }
    sqlExec(db_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");
  } catch (const Error &e) {
    sqlite3_close(db_);
    db_ = nullptr;
    fail("probe db '", path, "': ", e.what(),
         " (not a mapp probe database, or corrupt; the file was not changed)");
  }
  writer_ = std::thread([this] { writerLoop(); });
}

ProbeStore::~ProbeStore() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable())
    writer_.join();
  if (db_)
    sqlite3_close(db_);
}

int64_t ProbeStore::beginRun(const std::string &name,
                             const std::string &metaJson) {
  double now = std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  exec([&, now](sqlite3 *db) {
    sqlite3_stmt *st = nullptr;
    if (!name.empty()) {
      sqlite3_prepare_v2(db, "SELECT id FROM runs WHERE name=?", -1, &st,
                         nullptr);
      sqlite3_bind_text(st, 1, name.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(st) == SQLITE_ROW)
        run_ = sqlite3_column_int64(st, 0);
      sqlite3_finalize(st);
    }
    if (run_ < 0) {
      sqlite3_prepare_v2(db, "INSERT INTO runs(name, started, meta) "
                             "VALUES(?, ?, ?)",
                         -1, &st, nullptr);
      if (name.empty())
        sqlite3_bind_null(st, 1);
      else
        sqlite3_bind_text(st, 1, name.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_double(st, 2, now);
      sqlite3_bind_text(st, 3, metaJson.c_str(), -1, SQLITE_TRANSIENT);
      int rc = sqlite3_step(st);
      sqlite3_finalize(st);
      if (rc != SQLITE_DONE)
        fail(sqlite3_errmsg(db));
      run_ = sqlite3_last_insert_rowid(db);
    }
    sqlExec(db, "INSERT OR REPLACE INTO ranks VALUES(" + std::to_string(run_) +
                    "," + std::to_string(rank_.rank) + "," +
                    std::to_string(rank_.dp) + "," + std::to_string(rank_.pp) +
                    "," + std::to_string(rank_.tp) + ")");
  });
  flush();
  return run_;
}

void ProbeStore::add(ProbeSample &&s, const char *phase) {
  auto it = std::make_unique<Item>();
  it->sample = std::move(s);
  it->phase = phase;
  size_t b = it->bytes();
  std::unique_lock<std::mutex> l(mu_);
  if (queuedBytes_ + b > capBytes_ && !queue_.empty()) {
    ++stalls_;
    space_.wait(l, [&] {
      return queuedBytes_ + b <= capBytes_ || queue_.empty() || !error_.empty();
    });
  }
  queuedBytes_ += b;
  queue_.push_back(std::move(it));
  cv_.notify_one();
}

void ProbeStore::exec(std::function<void(sqlite3 *)> fn) {
  auto it = std::make_unique<Item>();
  it->fn = std::move(fn);
  std::lock_guard<std::mutex> l(mu_);
  queuedBytes_ += it->bytes();
  queue_.push_back(std::move(it));
  cv_.notify_one();
}

void ProbeStore::flush() {
  std::unique_lock<std::mutex> l(mu_);
  idle_.wait(l, [&] { return (queue_.empty() && !busy_) || !error_.empty(); });
  if (!error_.empty())
    fail("probe db '", path_, "': ", error_);
}

void ProbeStore::writeSample(const Item &it) {
  static const char *sql =
      "INSERT INTO samples(run_id, probe_id, step, microbatch, phase, rank, "
      "dp, pp, tp, reduction, value, shape, data, idx) "
      "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  sqlite3_stmt *st = nullptr;
  if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &st,
                         nullptr) != SQLITE_OK)
    fail(sqlite3_errmsg(db_));
  const ProbeSample &s = it.sample;
  sqlite3_bind_int64(st, 1, run_);
  sqlite3_bind_int64(st, 2, s.probeId);
  sqlite3_bind_int64(st, 3, s.step);
  sqlite3_bind_int(st, 4, s.microbatch);
  sqlite3_bind_text(st, 5, it.phase, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 6, rank_.rank);
  sqlite3_bind_int(st, 7, rank_.dp);
  sqlite3_bind_int(st, 8, rank_.pp);
  sqlite3_bind_int(st, 9, rank_.tp);
  sqlite3_bind_text(st, 10, s.reduction.c_str(), -1, SQLITE_TRANSIENT);
  if (std::isnan(s.value))
    sqlite3_bind_null(st, 11);
  else
    sqlite3_bind_double(st, 11, s.value);
  std::string shape = shapeJson(s.shape);
  sqlite3_bind_text(st, 12, shape.c_str(), -1, SQLITE_TRANSIENT);
  if (s.data.empty())
    sqlite3_bind_null(st, 13);
  else
    sqlite3_bind_blob(st, 13, s.data.data(), s.data.size() * 4, SQLITE_STATIC);
  if (s.index.empty())
    sqlite3_bind_null(st, 14);
  else
    sqlite3_bind_blob(st, 14, s.index.data(), s.index.size() * 8,
                      SQLITE_STATIC);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    fail(sqlite3_errmsg(db_));
}

void ProbeStore::writerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_)
      return;
    // Take everything queued and commit it as one transaction: one fsync
    // per batch instead of per sample.
    std::deque<std::unique_ptr<Item>> batch;
    batch.swap(queue_);
    size_t bytes = queuedBytes_;
    queuedBytes_ = 0;
    busy_ = true;
    space_.notify_all();
    l.unlock();
    std::string err;
    try {
      if (!error_.empty())
        throw Error(error_);
      sqlExec(db_, "BEGIN IMMEDIATE");
      for (const auto &it : batch) {
        if (it->fn)
          it->fn(db_);
        else
          writeSample(*it);
      }
      sqlExec(db_, "COMMIT");
    } catch (const std::exception &e) {
      err = e.what();
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    (void)bytes;
    l.lock();
    if (!err.empty() && error_.empty())
      error_ = err;
    busy_ = false;
    idle_.notify_all();
    space_.notify_all();
  }
}
