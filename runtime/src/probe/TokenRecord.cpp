//===- TokenRecord.cpp - token ids and texts for MegaScope's axes ---------===//
//
// The UI labels heatmap, attention and lens axes with token text. The store
// keeps (a) the tokenizer's text of every id once per run (`vocab`) and
// (b) the tokens one forward saw (`contexts`: batch row 0 of microbatch 0
// for a training step, the context window for a generation step).
//
// Both tables are optional: they are created here, on first use, not in
// ProbeStore's schema, so stores written before them still validate and
// mapp-scope treats their absence as "no token text" (position labels).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/ProbeSession.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>
#include <sqlite3.h>

using namespace mapp::rt;

namespace {

constexpr const char *kTokenTables =
    "CREATE TABLE IF NOT EXISTS vocab(run_id INT, id INT, text TEXT, "
    "PRIMARY KEY(run_id, id));"
    "CREATE TABLE IF NOT EXISTS contexts(run_id INT, rank INT, step INT, "
    "phase TEXT, tokens TEXT, PRIMARY KEY(run_id, rank, step, phase));";

void check(sqlite3 *db, int rc) {
  if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
    fail(sqlite3_errmsg(db));
}

} // namespace

void ProbeSession::recordVocabulary(const Tokenizer &tok) {
  // One copy per run: rank 0's (every rank has the same tokenizer).
  if (!store_ || vocabRecorded_ || exec_.program().rank != 0)
    return;
  vocabRecorded_ = true;
  int64_t run = store_->runId();
  int32_t n = std::min<int32_t>(tok.vocabSize(), exec_.plan().vocabSize);
  std::vector<std::string> texts(static_cast<size_t>(std::max(n, 0)));
  for (int32_t i = 0; i < n; ++i)
    texts[i] = tok.decode({i});
  store_->exec([run, texts = std::move(texts)](sqlite3 *db) {
    sqlExec(db, kTokenTables);
    sqlite3_stmt *st = nullptr;
    check(db, sqlite3_prepare_v2(
                  db, "INSERT OR REPLACE INTO vocab VALUES(?,?,?)", -1, &st,
                  nullptr));
    for (size_t i = 0; i < texts.size(); ++i) {
      sqlite3_bind_int64(st, 1, run);
      sqlite3_bind_int64(st, 2, static_cast<int64_t>(i));
      sqlite3_bind_text(st, 3, texts[i].data(),
                        static_cast<int>(texts[i].size()), SQLITE_TRANSIENT);
      int rc = sqlite3_step(st);
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) {
        sqlite3_finalize(st);
        fail(sqlite3_errmsg(db));
      }
    }
    sqlite3_finalize(st);
  });
}

void ProbeSession::recordContext(int64_t step, bool generating,
                                 const int32_t *ids, int64_t n) {
  if (!store_ || n <= 0)
    return;
  int64_t run = store_->runId();
  int rank = exec_.program().rank;
  std::string tokens =
      nlohmann::json(std::vector<int32_t>(ids, ids + n)).dump();
  const char *phase = generating ? "generate" : "train";
  store_->exec([=](sqlite3 *db) {
    sqlExec(db, kTokenTables);
    sqlite3_stmt *st = nullptr;
    check(db, sqlite3_prepare_v2(
                  db, "INSERT OR REPLACE INTO contexts VALUES(?,?,?,?,?)", -1,
                  &st, nullptr));
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int(st, 2, rank);
    sqlite3_bind_int64(st, 3, step);
    sqlite3_bind_text(st, 4, phase, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, tokens.c_str(), -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
      fail(sqlite3_errmsg(db));
  });
}
