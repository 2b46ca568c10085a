//===- ScopeApi.cpp - endpoints of mapp-scope -----------------------------===//
#include "ScopeApi.h"
#include "Pca.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/ProbeStore.h"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <cstring>
#include <map>

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;

namespace {

/// A prepared statement that throws on error and finalizes itself.
class Query {
public:
  Query(sqlite3 *db, const char *sql) : db(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK)
      fail("query failed: ", sqlite3_errmsg(db));
  }
  ~Query() { sqlite3_finalize(st); }
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
  json num(int c) {
    return sqlite3_column_type(st, c) == SQLITE_NULL
               ? json(nullptr)
               : json(sqlite3_column_double(st, c));
  }
  std::string s(int c) {
    const unsigned char *t = sqlite3_column_text(st, c);
    return t ? reinterpret_cast<const char *>(t) : "";
  }
  template <typename T> std::vector<T> blob(int c) {
    const void *p = sqlite3_column_blob(st, c);
    int n = sqlite3_column_bytes(st, c);
    std::vector<T> v(n / sizeof(T));
    if (p && n)
      std::memcpy(v.data(), p, v.size() * sizeof(T));
    return v;
  }

private:
  sqlite3 *db;
  sqlite3_stmt *st = nullptr;
};

int64_t intParam(const Request &r, const std::string &k) {
  auto it = r.query.find(k);
  if (it == r.query.end())
    fail("missing parameter '", k, "'");
  try {
    size_t pos;
    long long v = std::stoll(it->second, &pos);
    if (pos != it->second.size())
      throw std::invalid_argument(k);
    return v;
  } catch (const std::exception &) {
    fail("parameter '", k, "' must be an integer");
  }
}

/// Reduction names are a fixed vocabulary: anything else is refused before
/// it reaches a query.
std::string reductionParam(const Request &r) {
  auto it = r.query.find("reduction");
  static const char *known[] = {"max",      "min",  "mean", "std",
                                "absmax",   "sparsity", "hist", "topk",
                                "sketch",   "raw",  "attn", "lens"};
  if (it != r.query.end())
    for (const char *k : known)
      if (it->second == k)
        return k;
  fail("parameter 'reduction' must be one of max, min, mean, std, absmax, "
       "sparsity, hist, topk, sketch, raw, attn, lens");
}

std::string phaseParam(const Request &r) {
  auto it = r.query.find("phase");
  if (it == r.query.end() || it->second == "train")
    return "train";
  if (it->second == "generate")
    return "generate";
  fail("parameter 'phase' must be train or generate");
}

} // namespace

std::map<std::string, std::string>
mapp::scope::parseQuery(const std::string &q) {
  httplib::Params params;
  httplib::detail::parse_query_text(q, params);
  return {params.begin(), params.end()};
}

ScopeApi::ScopeApi(const std::string &db, ControlOptions control)
    : path_(db), control_(std::move(control)) {
  // Read-only and mutex-serialized: cpp-httplib answers on several threads,
  // and mapp-scope never writes to the store.
  if (sqlite3_open_v2(db.c_str(), &db_,
                      SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string m = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail("cannot open probe db '", db, "': ", m);
  }
  sqlite3_busy_timeout(db_, 5000);
  std::string why = mapp::rt::probeStoreProblem(db_, /*deepCheck=*/true);
  if (!why.empty()) {
    sqlite3_close(db_);
    db_ = nullptr;
    fail("'", db, "' is not a mapp probe database (", why, ")");
  }
}

ScopeApi::~ScopeApi() { sqlite3_close(db_); }

Response ScopeApi::handle(const Request &r) {
  if (r.path.rfind("/api/", 0) == 0)
    return api(r);
  return {404, "application/json", "{\"error\":\"not found\"}"};
}

Response ScopeApi::api(const Request &r) {
  const std::string &p = r.path;
  if (p == "/api/control") {
    if (r.method != "POST")
      return {405, "application/json", "{\"error\":\"POST only\"}"};
    return {200, "application/json", control(r.body)};
  }
  if (p == "/api/patch") {
    if (r.method != "POST")
      return {405, "application/json", "{\"error\":\"POST only\"}"};
    if (!patch_ || !patch_->enabled())
      return {409, "application/json",
              "{\"error\":\"patching from the page is off (mapp-scope serve "
              "--patch-plan PLAN --patch-weights W)\"}"};
    return {200, "application/json", patch_->run(parsePatchRequest(r.body))};
  }
  if (r.method != "GET")
    return {405, "application/json", "{\"error\":\"GET only\"}"};
  std::string out;
  if (p == "/api/runs")
    out = runs();
  else if (p == "/api/probes")
    out = probes(intParam(r, "run"));
  else if (p == "/api/series")
    out = series(intParam(r, "run"), intParam(r, "probe"), reductionParam(r));
  else if (p == "/api/sample")
    out = sample(r);
  else if (p == "/api/steps")
    out = steps(intParam(r, "run"));
  else if (p == "/api/lens")
    out = lens(r);
  else if (p == "/api/pca")
    out = pca(intParam(r, "run"), intParam(r, "step"), phaseParam(r),
              r.query.count("rank") ? intParam(r, "rank") : 0);
  else if (p == "/api/generation")
    out = generation(intParam(r, "run"));
  else if (p == "/api/switches")
    out = switches(intParam(r, "run"));
  else if (p == "/api/ranks")
    out = ranks(intParam(r, "run"));
  else if (p == "/api/tokens")
    out = tokens(r);
  else if (p == "/api/patches")
    out = patch_ ? patch_->list()
                 : std::string("{\"enabled\":false,\"results\":[]}");
  else if (p == "/api/live")
    out = live(intParam(r, "run"));
  else
    return {404, "application/json", "{\"error\":\"no such endpoint\"}"};
  return {200, "application/json", out};
}

std::string ScopeApi::runs() {
  json out = json::array();
  Query q(db_, "SELECT id, name, started, meta FROM runs ORDER BY id");
  while (q.step()) {
    json meta = json::parse(q.s(3), nullptr, false);
    out.push_back({{"id", q.i(0)},
                   {"name", q.s(1)},
                   {"started", q.num(2)},
                   {"meta", meta.is_discarded() ? json::object() : meta}});
  }
  return out.dump();
}

std::string ScopeApi::probes(int64_t run) {
  json out = json::array();
  Query q(db_, "SELECT probe_id, point, value, reduce, every, shape, attrs, "
               "group_concat(rank) FROM probes WHERE run_id=? "
               "GROUP BY probe_id ORDER BY probe_id");
  q.bind(1, run);
  while (q.step())
    out.push_back({{"id", q.i(0)},
                   {"point", q.s(1)},
                   {"value", q.s(2)},
                   {"reduce", q.s(3)},
                   {"every", q.i(4)},
                   {"shape", json::parse(q.s(5), nullptr, false)},
                   {"attrs", json::parse(q.s(6), nullptr, false)},
                   {"ranks", q.s(7)}});
  return out.dump();
}

std::string ScopeApi::series(int64_t run, int64_t probe,
                             const std::string &red) {
  // Mean over microbatches per (step, rank): one point per step and rank.
  json out = json::array();
  Query q(db_, "SELECT step, rank, avg(value) FROM samples WHERE run_id=? AND "
               "probe_id=? AND reduction=? AND phase='train' "
               "GROUP BY step, rank ORDER BY step, rank");
  q.bind(1, run).bind(2, probe).bind(3, red);
  while (q.step())
    out.push_back({{"step", q.i(0)}, {"rank", q.i(1)}, {"value", q.num(2)}});
  return out.dump();
}

std::string ScopeApi::sample(const Request &r) {
  int64_t run = intParam(r, "run"), probe = intParam(r, "probe");
  std::string red = reductionParam(r), phase = phaseParam(r);
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  // Without `step`: the latest recorded one.
  bool latest = !r.query.count("step");
  int64_t step = latest ? 0 : intParam(r, "step");
  Query q(db_, latest
                   ? "SELECT step, shape, data, idx, value FROM samples WHERE "
                     "run_id=? AND probe_id=? AND reduction=? AND phase=? AND "
                     "rank=? AND microbatch=0 ORDER BY step DESC LIMIT 1"
                   : "SELECT step, shape, data, idx, value FROM samples WHERE "
                     "run_id=? AND probe_id=? AND reduction=? AND phase=? AND "
                     "rank=? AND microbatch=0 AND step=? LIMIT 1");
  q.bind(1, run).bind(2, probe).bind(3, red).bind(4, phase).bind(5, rank);
  if (!latest)
    q.bind(6, step);
  if (!q.step())
    return "null";
  json out = {{"step", q.i(0)},
              {"shape", json::parse(q.s(1), nullptr, false)},
              {"data", q.blob<float>(2)},
              {"index", q.blob<int64_t>(3)},
              {"value", q.num(4)}};
  return out.dump();
}

std::string ScopeApi::lens(const Request &r) {
  // Every lens probe (one per layer) of one step: per position the top-k
  // token ids and probabilities, rows in the probe's `tokens` order.
  int64_t run = intParam(r, "run"), step = intParam(r, "step");
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  std::string phase = phaseParam(r);
  json out = json::array();
  std::map<int64_t, std::string> texts = vocab(run);
  Query q(db_, "SELECT s.probe_id, p.point, p.attrs, s.shape, s.data, s.idx "
               "FROM samples s JOIN probes p ON p.run_id=s.run_id AND "
               "p.probe_id=s.probe_id AND p.rank=s.rank WHERE s.run_id=? AND "
               "s.reduction='lens' AND s.step=? AND s.phase=? AND s.rank=? "
               "AND s.microbatch=0 ORDER BY s.probe_id");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  while (q.step()) {
    json shape = json::parse(q.s(3), nullptr, false);
    std::vector<float> p = q.blob<float>(4);
    std::vector<int64_t> ids = q.blob<int64_t>(5);
    if (!shape.is_array() || shape.size() != 2 || !shape[0].is_number() ||
        !shape[1].is_number())
      fail("lens sample of probe ", q.i(0), " has a malformed shape");
    int64_t R = shape[0], K = shape[1];
    if (R < 0 || K < 0 || p.size() != static_cast<size_t>(R * K) ||
        ids.size() != p.size())
      fail("lens sample of probe ", q.i(0), " does not match its shape");
    json attrs = json::parse(q.s(2), nullptr, false);
    json positions = json::array();
    if (attrs.is_object() && attrs.contains("tokens") && attrs["tokens"].is_array())
      positions = attrs["tokens"];
    // A decode step (KV cache) sees the new token only: its row has no
    // recorded position, the step names it.
    if (positions.size() != static_cast<size_t>(R)) {
      positions = json::array();
      for (int64_t i = 0; i < R; ++i)
        positions.push_back(i);
    }
    json rows = json::array();
    for (int64_t i = 0; i < R; ++i) {
      json top = json::array();
      for (int64_t j = 0; j < K; ++j) {
        json t = {{"id", ids[i * K + j]}, {"p", p[i * K + j]}};
        auto v = texts.find(ids[i * K + j]);
        if (v != texts.end())
          t["text"] = v->second;
        top.push_back(t);
      }
      rows.push_back({{"position", positions[i]}, {"top", top}});
    }
    out.push_back({{"probe", q.i(0)}, {"point", q.s(1)}, {"rows", rows}});
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ScopeApi::steps(int64_t run) {
  json out = json::array();
  Query q(db_, "SELECT step, rank, loss, lr, grad_norm, step_ms, tokens_per_s "
               "FROM steps WHERE run_id=? ORDER BY step, rank");
  q.bind(1, run);
  while (q.step())
    out.push_back({{"step", q.i(0)},
                   {"rank", q.i(1)},
                   {"loss", q.num(2)},
                   {"lr", q.num(3)},
                   {"grad_norm", q.num(4)},
                   {"step_ms", q.num(5)},
                   {"tokens_per_s", q.num(6)}});
  return out.dump();
}

std::string ScopeApi::pca(int64_t run, int64_t step, const std::string &phase,
                          int64_t rank) {
  // Every sketch probe of the step, rank 0, microbatch 0; rows of one width
  // are projected together so layers share one coordinate system.
  Query q(db_, "SELECT s.probe_id, p.point, s.shape, s.data FROM samples s "
               "JOIN probes p ON p.run_id=s.run_id AND p.probe_id=s.probe_id "
               "AND p.rank=s.rank WHERE s.run_id=? AND s.step=? AND "
               "s.phase=? AND s.reduction='sketch' AND s.rank=? AND "
               "s.microbatch=0 ORDER BY s.probe_id");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  std::vector<double> rows;
  json labels = json::array();
  int dim = 0;
  while (q.step()) {
    json shape = json::parse(q.s(2), nullptr, false);
    if (!shape.is_array() || shape.size() != 2)
      continue;
    int d = shape[1].get<int>();
    if (dim && d != dim)
      continue;
    dim = d;
    std::vector<float> data = q.blob<float>(3);
    for (size_t i = 0; i < data.size() / d; ++i) {
      labels.push_back({{"probe", q.i(0)}, {"point", q.s(1)}, {"row", i}});
      for (int j = 0; j < d; ++j)
        rows.push_back(data[i * d + j]);
    }
  }
  Pca2 p = pca2(rows, dim);
  json pts = json::array();
  for (size_t i = 0; i < p.x.size(); ++i) {
    json pt = labels[i];
    pt["x"] = p.x[i];
    pt["y"] = p.y[i];
    pts.push_back(pt);
  }
  return json({{"step", step},
               {"points", pts},
               {"explained", {p.explained[0], p.explained[1]}}})
      .dump();
}

std::string ScopeApi::generation(int64_t run) {
  json out = json::array();
  Query q(db_, "SELECT position, token, text, prob, topk FROM generations "
               "WHERE run_id=? AND rank=0 ORDER BY position");
  q.bind(1, run);
  while (q.step())
    out.push_back({{"position", q.i(0)},
                   {"token", q.i(1)},
                   {"text", q.s(2)},
                   {"prob", q.num(3)},
                   {"topk", json::parse(q.s(4), nullptr, false)}});
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ScopeApi::switches(int64_t run) {
  json sw = json::array(), log = json::array();
  Query q(db_, "SELECT switch_id, kind, target, point, enabled, magnitude, "
               "count(*) FROM switches WHERE run_id=? GROUP BY switch_id "
               "ORDER BY switch_id");
  q.bind(1, run);
  while (q.step())
    sw.push_back({{"id", q.i(0)},
                  {"kind", q.s(1)},
                  {"target", q.s(2)},
                  {"point", q.s(3)},
                  {"enabled", q.i(4) != 0},
                  {"magnitude", q.num(5)},
                  {"ranks", q.i(6)}});
  Query l(db_, "SELECT rank, step, switch_id, enabled, magnitude, source FROM "
               "control_log WHERE run_id=? ORDER BY rowid");
  l.bind(1, run);
  while (l.step())
    log.push_back({{"rank", l.i(0)},
                   {"step", l.i(1)},
                   {"switch", l.i(2)},
                   {"enabled", l.i(3) != 0},
                   {"magnitude", l.num(4)},
                   {"source", l.s(5)}});
  return json({{"switches", sw},
               {"log", log},
               {"control", controlEndpoint(run)}})
      .dump();
}

std::string ScopeApi::controlEndpoint(int64_t run) {
  Query q(db_, "SELECT meta FROM runs WHERE id=?");
  q.bind(1, run);
  if (!q.step())
    fail("no run ", run);
  json meta = json::parse(q.s(0), nullptr, false);
  if (meta.is_discarded() || !meta.contains("control") ||
      !meta["control"].is_string())
    return "";
  return meta["control"];
}

std::string ScopeApi::control(const std::string &body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("run") ||
      !j["run"].is_number_integer())
    fail("control needs a JSON object with an integer \"run\"");
  int64_t run = j["run"];
  json cmd = j;
  cmd.erase("run");
  // Typed validation by the runtime's own parser: switch id, bool, bounded
  // number; the job checks the bound of the switch's kind again.
  mapp::rt::SwitchCommand c = mapp::rt::parseSwitchCommand(cmd.dump(), "ui");
  return control_.set(controlEndpoint(run), c);
}

std::string ScopeApi::live(int64_t run) {
  return control_.state(controlEndpoint(run));
}

std::string ScopeApi::ranks(int64_t run) {
  json out = json::array();
  Query q(db_, "SELECT rank, dp, pp, tp FROM ranks WHERE run_id=? ORDER BY "
               "rank");
  q.bind(1, run);
  while (q.step())
    out.push_back(
        {{"rank", q.i(0)}, {"dp", q.i(1)}, {"pp", q.i(2)}, {"tp", q.i(3)}});
  return out.dump();
}

bool ScopeApi::haveTable(const char *name) {
  Query q(db_, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?");
  q.bind(1, std::string(name));
  return q.step();
}

std::map<int64_t, std::string> ScopeApi::vocab(int64_t run) {
  std::map<int64_t, std::string> out;
  if (!haveTable("vocab"))
    return out;
  Query q(db_, "SELECT id, text FROM vocab WHERE run_id=?");
  q.bind(1, run);
  while (q.step())
    out[q.i(0)] = q.s(1);
  return out;
}

std::string ScopeApi::tokens(const Request &r) {
  // The tokens one forward saw (TokenRecord.cpp), with their texts: the
  // UI's heatmap, attention and PCA labels. null when the store has none
  // (an older store, or pre-tokenized data without --tokenizer).
  int64_t run = intParam(r, "run"), step = intParam(r, "step");
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  std::string phase = phaseParam(r);
  if (!haveTable("contexts"))
    return "null";
  // Only the first stage's ranks see the tokens; every rank of a step saw
  // the same batch row 0 for its dp rank, so fall back to any rank.
  Query q(db_, "SELECT tokens FROM contexts WHERE run_id=? AND step=? AND "
               "phase=? ORDER BY rank<>? , rank LIMIT 1");
  q.bind(1, run).bind(2, step).bind(3, phase).bind(4, rank);
  if (!q.step())
    return "null";
  json ids = json::parse(q.s(0), nullptr, false);
  if (!ids.is_array())
    fail("contexts row of step ", step, " is malformed");
  std::map<int64_t, std::string> texts = vocab(run);
  json out = json::array();
  for (const json &id : ids) {
    if (!id.is_number_integer())
      fail("contexts row of step ", step, " is malformed");
    auto t = texts.find(id.get<int64_t>());
    out.push_back({{"id", id},
                   {"text", t == texts.end() ? json(nullptr) : json(t->second)}});
  }
  return json({{"step", step}, {"phase", phase}, {"tokens", out}})
      .dump(-1, ' ', false, json::error_handler_t::replace);
}
