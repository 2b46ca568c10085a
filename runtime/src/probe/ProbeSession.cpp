//===- ProbeSession.cpp - store, switches and control for one rank --------===//
#include "mapp/rt/ProbeSession.h"
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/ProbeReduce.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

using namespace mapp::rt;
using json = nlohmann::json;

namespace {

json attrsJson(const Attrs &a) {
  json j = json::object();
  for (const auto &[k, v] : a.all()) {
    switch (v.kind) {
    case AttrValue::Int:
      j[k] = v.i;
      break;
    case AttrValue::Float:
      j[k] = v.f;
      break;
    case AttrValue::Str:
      j[k] = v.s;
      break;
    case AttrValue::Ints:
      j[k] = v.ints;
      break;
    case AttrValue::Floats:
      j[k] = v.floats;
      break;
    }
  }
  return j;
}

void bindText(sqlite3_stmt *st, int i, const std::string &s) {
  sqlite3_bind_text(st, i, s.c_str(), -1, SQLITE_TRANSIENT);
}

/// A row of the probes table (docs/megascope.md, "Store").
struct ProbeRow {
  int64_t id, every;
  std::string point, value, reduce, shape, attrs;
};

void stepOnce(sqlite3 *db, sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    fail(sqlite3_errmsg(db));
}

void insertProbes(sqlite3 *db, int64_t run, int rank,
                  const std::vector<ProbeRow> &rows) {
  for (const ProbeRow &r : rows) {
    sqlite3_stmt *st = nullptr;
    sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO probes VALUES(?,?,?,?,?,?,?,?,?)",
                       -1, &st, nullptr);
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, r.id);
    sqlite3_bind_int(st, 3, rank);
    bindText(st, 4, r.point);
    bindText(st, 5, r.value);
    bindText(st, 6, r.reduce);
    sqlite3_bind_int64(st, 7, r.every);
    bindText(st, 8, r.shape);
    bindText(st, 9, r.attrs);
    stepOnce(db, st);
  }
}

} // namespace

ProbeSession::ProbeSession(Executor &exec, const ProbeSessionOptions &o)
    : exec_(exec), opts_(o) {
  const Program &p = exec.program();
  for (const Block &b : p.blocks)
    for (const Instr &in : b.instrs)
      if (in.kernel == "perturb") {
        Switch s;
        s.state.enabled = in.attrs.getInt("enabled", 1) != 0;
        s.state.magnitude = in.attrs.getFloat("magnitude", 0);
        s.kind = in.attrs.getStr("kind", "");
        s.target = in.attrs.getStr("target", "");
        s.point = in.attrs.getStr("point", "");
        switches_.emplace(in.attrs.getInt("switch_id", 0), s);
      }
  // The store first: a foreign or corrupt file fails before a control
  // port or token file exists.
  if (!o.db.empty())
    store_ = std::make_unique<ProbeStore>(
        o.db, RankInfo{p.rank, p.dp, p.pp, p.tp});
  if (!o.control.empty()) {
    std::string tokenFile = o.controlTokenFile;
    if (!tokenFile.empty() && p.rank > 0)
      tokenFile += ".rank" + std::to_string(p.rank);
    else if (tokenFile.empty() && !o.db.empty())
      tokenFile = defaultControlTokenFile(o.db, p.rank);
    control_ = std::make_unique<ProbeControl>(
        o.control, tokenFile,
        [this](const SwitchCommand &c) -> std::string {
          auto it = switches_.find(c.id);
          if (it == switches_.end())
            return "no perturbation switch " + std::to_string(c.id) +
                   " in this plan";
          if (c.magnitude)
            return magnitudeProblem(it->second.kind, *c.magnitude);
          return "";
        },
        [this] { return stateJson(); });
  }
  json meta = json::parse(o.extraMeta, nullptr, false);
  if (!meta.is_object())
    meta = json::object();
  const Plan &plan = exec.plan();
  meta["plan"] = o.plan;
  meta["mode"] = o.mode;
  meta["world_size"] = plan.worldSize;
  meta["tp"] = plan.tp;
  meta["pp"] = plan.pp;
  meta["dp"] = plan.dp;
  meta["seq_length"] = plan.seqLength;
  meta["vocab_size"] = plan.vocabSize;
  meta["control"] = control_ ? control_->endpoint() : "";
  if (store_) {
    store_->beginRun(o.runName, meta.dump());
    registerPlan(meta.dump());
  }
  exec.setProbeRuntime(this);
}

ProbeSession::~ProbeSession() {
  try {
    exec_.setProbeRuntime(nullptr); // drains device captures into this
  } catch (const Error &) {
    exec_.setProbeRuntime(nullptr);
  }
  try {
    if (store_)
      store_->flush();
  } catch (const Error &) {
    // Reported by the explicit flush() of a successful run.
  }
}

void ProbeSession::registerPlan(const std::string &) {
  const Program &p = exec_.program();
  int64_t run = store_->runId();
  int rank = p.rank;
  std::vector<ProbeRow> rows;
  for (const Block &b : p.blocks)
    for (const Instr &in : b.instrs)
      if (in.kernel == "probe") {
        const Value &v = p.values[in.inputs[0]];
        rows.push_back({in.attrs.getInt("probe_id", 0),
                        in.attrs.getInt("every", 1),
                        in.attrs.getStr("point", ""), v.name,
                        in.attrs.getStr("reduce", ""),
                        json(v.type.shape).dump(), attrsJson(in.attrs).dump()});
      }
  std::map<int64_t, Switch> sw = switches_;
  store_->exec([run, rank, rows, sw](sqlite3 *db) {
    insertProbes(db, run, rank, rows);
    for (const auto &[id, s] : sw) {
      sqlite3_stmt *st = nullptr;
      sqlite3_prepare_v2(db,
                         "INSERT OR REPLACE INTO switches VALUES"
                         "(?,?,?,?,?,?,?,?)",
                         -1, &st, nullptr);
      sqlite3_bind_int64(st, 1, run);
      sqlite3_bind_int64(st, 2, id);
      sqlite3_bind_int(st, 3, rank);
      bindText(st, 4, s.kind);
      bindText(st, 5, s.target);
      bindText(st, 6, s.point);
      sqlite3_bind_int(st, 7, s.state.enabled);
      sqlite3_bind_double(st, 8, s.state.magnitude);
      stepOnce(db, st);
    }
  });
  store_->flush();
}

std::string ProbeSession::controlEndpoint() const {
  return control_ ? control_->endpoint() : "";
}

void ProbeSession::beginStep(int64_t step) {
  step_ = step;
  if (!control_)
    return;
  for (const SwitchCommand &c : control_->poll()) {
    auto it = switches_.find(c.id);
    if (it == switches_.end())
      continue;
    SwitchState &s = it->second.state;
    if (c.enabled)
      s.enabled = *c.enabled;
    if (c.magnitude)
      s.magnitude = *c.magnitude;
    if (!store_)
      continue;
    int64_t run = store_->runId(), id = c.id;
    int rank = exec_.program().rank;
    SwitchState now = s;
    std::string src = c.source;
    store_->exec([=](sqlite3 *db) {
      sqlite3_stmt *st = nullptr;
      sqlite3_prepare_v2(db, "INSERT INTO control_log VALUES(?,?,?,?,?,?,?)",
                         -1, &st, nullptr);
      sqlite3_bind_int64(st, 1, run);
      sqlite3_bind_int(st, 2, rank);
      sqlite3_bind_int64(st, 3, step);
      sqlite3_bind_int64(st, 4, id);
      sqlite3_bind_int(st, 5, now.enabled);
      sqlite3_bind_double(st, 6, now.magnitude);
      bindText(st, 7, src);
      stepOnce(db, st);
      sqlite3_prepare_v2(db,
                         "UPDATE switches SET enabled=?, magnitude=? WHERE "
                         "run_id=? AND switch_id=? AND rank=?",
                         -1, &st, nullptr);
      sqlite3_bind_int(st, 1, now.enabled);
      sqlite3_bind_double(st, 2, now.magnitude);
      sqlite3_bind_int64(st, 3, run);
      sqlite3_bind_int64(st, 4, id);
      sqlite3_bind_int(st, 5, rank);
      stepOnce(db, st);
    });
  }
}

void ProbeSession::endStep(const StepMetrics &m) {
  if (!store_)
    return;
  int64_t run = store_->runId();
  int rank = exec_.program().rank;
  if (rank == 0 && !m.expertTokens.empty())
    recordExpertTokens(m);
  store_->exec([=](sqlite3 *db) {
    sqlite3_stmt *st = nullptr;
    sqlite3_prepare_v2(db,
                       "INSERT OR REPLACE INTO steps VALUES(?,?,?,?,?,?,?,?)",
                       -1, &st, nullptr);
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int(st, 2, rank);
    sqlite3_bind_int64(st, 3, m.step);
    if (std::isnan(m.loss))
      sqlite3_bind_null(st, 4);
    else
      sqlite3_bind_double(st, 4, m.loss);
    sqlite3_bind_double(st, 5, m.lr);
    sqlite3_bind_double(st, 6, m.gradNorm);
    sqlite3_bind_double(st, 7, m.stepMs);
    sqlite3_bind_double(st, 8, m.tokensPerS);
    stepOnce(db, st);
  });
}

void ProbeSession::recordExpertTokens(const StepMetrics &m) {
  if (expertProbes_.empty()) { // the first step: one probe per MoE layer
    std::vector<ProbeRow> rows;
    int64_t id = kExpertProbeBase;
    for (const auto &[layer, counts] : m.expertTokens) {
      expertProbes_[layer] = id;
      rows.push_back({id++, 1, layer, layer, "experts",
                      json::array({counts.size()}).dump(),
                      json{{"experts", counts.size()}}.dump()});
    }
    int64_t run = store_->runId();
    store_->exec([run, rows](sqlite3 *db) { insertProbes(db, run, 0, rows); });
  }
  for (const auto &[layer, counts] : m.expertTokens) {
    auto it = expertProbes_.find(layer);
    if (it == expertProbes_.end() || counts.empty())
      continue;
    ProbeSample s;
    s.probeId = it->second;
    s.step = m.step;
    s.reduction = "experts";
    double total = 0, most = 0;
    for (int64_t c : counts) {
      total += double(c);
      most = std::max(most, double(c));
    }
    // Load imbalance: the busiest expert's rows over the mean (1 = even).
    if (total > 0)
      s.value = most * double(counts.size()) / total;
    s.data.assign(counts.begin(), counts.end());
    s.shape = {static_cast<int64_t>(counts.size())};
    record(std::move(s));
  }
}

void ProbeSession::recordToken(int64_t position, int32_t token,
                               const std::string &text, double prob,
                               const std::string &topkJson) {
  if (!store_)
    return;
  int64_t run = store_->runId();
  int rank = exec_.program().rank;
  store_->exec([=](sqlite3 *db) {
    sqlite3_stmt *st = nullptr;
    sqlite3_prepare_v2(db,
                       "INSERT OR REPLACE INTO generations VALUES"
                       "(?,?,?,?,?,?,?)",
                       -1, &st, nullptr);
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int(st, 2, rank);
    sqlite3_bind_int64(st, 3, position);
    sqlite3_bind_int(st, 4, token);
    bindText(st, 5, text);
    sqlite3_bind_double(st, 6, prob);
    bindText(st, 7, topkJson);
    stepOnce(db, st);
  });
}

void ProbeSession::flush() {
  exec_.drainProbes(); // device captures still in flight
  if (store_)
    store_->flush();
}

void ProbeSession::record(ProbeSample &&s) {
  if (!std::isnan(s.value)) {
    std::lock_guard<std::mutex> l(cacheMu_);
    latest_[{s.probeId, s.reduction}] = {s.step, s.value};
  }
  if (store_)
    store_->add(std::move(s), generating_ ? "generate" : "train");
}

bool ProbeSession::switchState(int64_t id, SwitchState &out) const {
  auto it = switches_.find(id);
  if (it == switches_.end())
    return false;
  out = it->second.state;
  return true;
}

std::string ProbeSession::stateJson() {
  // Runs on the control thread: switch states are read racily but each is
  // a bool and a double written only between steps; good enough for a view.
  json j;
  j["step"] = step_;
  j["switches"] = json::array();
  for (const auto &[id, s] : switches_)
    j["switches"].push_back({{"id", id},
                             {"enabled", s.state.enabled},
                             {"magnitude", s.state.magnitude},
                             {"kind", s.kind},
                             {"point", s.point}});
  j["latest"] = json::array();
  std::lock_guard<std::mutex> l(cacheMu_);
  for (const auto &[k, v] : latest_)
    j["latest"].push_back({{"probe", k.first},
                           {"reduction", k.second},
                           {"step", v.first},
                           {"value", v.second}});
  return j.dump();
}
