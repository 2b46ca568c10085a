//===- ScopeApi.cpp - endpoints of mapp-scope -----------------------------===//
#include "ScopeApi.h"
#include "Pca.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/ProbeStoreReader.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;

namespace {

/// A nullable number of the store as JSON (null stays null).
json num(const std::optional<double> &v) {
  return v ? json(*v) : json(nullptr);
}

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
                                "sketch",   "raw",  "attn", "lens",
                                "experts"};
  if (it != r.query.end())
    for (const char *k : known)
      if (it->second == k)
        return k;
  fail("parameter 'reduction' must be one of max, min, mean, std, absmax, "
       "sparsity, hist, topk, sketch, raw, attn, lens, experts");
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
    : store_(db), control_(std::move(control)) {}

ScopeApi::~ScopeApi() = default;

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
  else if (p == "/api/ranks")
    out = ranks(intParam(r, "run"));
  else if (p == "/api/tokens")
    out = tokens(r);
  else if (p == "/api/patches")
    out = patch_ ? patch_->list()
                 : std::string("{\"enabled\":false,\"results\":[]}");
  else if (p == "/api/generation")
    out = generation(intParam(r, "run"));
  else if (p == "/api/switches")
    out = switches(intParam(r, "run"));
  else if (p == "/api/live")
    out = live(intParam(r, "run"));
  else
    return {404, "application/json", "{\"error\":\"no such endpoint\"}"};
  return {200, "application/json", out};
}

std::string ScopeApi::runs() {
  json out = json::array();
  for (const mapp::rt::StoredRun &r : store_.runs()) {
    json meta = json::parse(r.metaJson, nullptr, false);
    out.push_back({{"id", r.id},
                   {"name", r.name},
                   {"started", num(r.started)},
                   {"meta", meta.is_discarded() ? json::object() : meta}});
  }
  return out.dump();
}

std::string ScopeApi::probes(int64_t run) {
  json out = json::array();
  for (const mapp::rt::StoredProbe &p : store_.probes(run))
    out.push_back({{"id", p.id},
                   {"point", p.point},
                   {"value", p.value},
                   {"reduce", p.reduce},
                   {"every", p.every},
                   {"shape", json::parse(p.shapeJson, nullptr, false)},
                   {"attrs", json::parse(p.attrsJson, nullptr, false)},
                   {"ranks", p.ranks}});
  return out.dump();
}

std::string ScopeApi::series(int64_t run, int64_t probe,
                             const std::string &red) {
  // Mean over microbatches per (step, rank): one point per step and rank.
  json out = json::array();
  for (const mapp::rt::SeriesPoint &p : store_.series(run, probe, red))
    out.push_back({{"step", p.step}, {"rank", p.rank}, {"value", num(p.value)}});
  return out.dump();
}

std::string ScopeApi::sample(const Request &r) {
  int64_t run = intParam(r, "run"), probe = intParam(r, "probe");
  std::string red = reductionParam(r), phase = phaseParam(r);
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  // Without `step`: the latest recorded one.
  std::optional<int64_t> step;
  if (r.query.count("step"))
    step = intParam(r, "step");
  std::optional<mapp::rt::StoredSample> s =
      store_.sample(run, probe, red, phase, rank, step);
  if (!s)
    return "null";
  json out = {{"step", s->step},
              {"shape", json::parse(s->shapeJson, nullptr, false)},
              {"data", s->data},
              {"index", s->index},
              {"value", num(s->value)}};
  return out.dump();
}

std::string ScopeApi::lens(const Request &r) {
  // Every lens probe (one per layer) of one step: per position the top-k
  // token ids and probabilities, rows in the probe's `tokens` order.
  int64_t run = intParam(r, "run"), step = intParam(r, "step");
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  std::string phase = phaseParam(r);
  std::map<int64_t, std::string> texts = store_.vocab(run);
  json out = json::array();
  for (const mapp::rt::StoredSample &s :
       store_.lensSamples(run, step, phase, rank)) {
    json shape = json::parse(s.shapeJson, nullptr, false);
    const std::vector<float> &p = s.data;
    const std::vector<int64_t> &ids = s.index;
    // The store is input: integers only (a float would be cast, 1e308
    // undefined), and R*K computed without overflow.
    if (!shape.is_array() || shape.size() != 2 ||
        !shape[0].is_number_integer() || !shape[1].is_number_integer())
      fail("lens sample of probe ", s.probe, " has a malformed shape");
    int64_t R = shape[0], K = shape[1], n = 0;
    if (R < 0 || K < 0 || __builtin_mul_overflow(R, K, &n) ||
        p.size() != static_cast<uint64_t>(n) || ids.size() != p.size())
      fail("lens sample of probe ", s.probe, " does not match its shape");
    json attrs = json::parse(s.attrsJson, nullptr, false);
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
    out.push_back({{"probe", s.probe}, {"point", s.point}, {"rows", rows}});
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ScopeApi::steps(int64_t run) {
  json out = json::array();
  for (const mapp::rt::StoredStep &s : store_.steps(run))
    out.push_back({{"step", s.step},
                   {"rank", s.rank},
                   {"loss", num(s.loss)},
                   {"lr", num(s.lr)},
                   {"grad_norm", num(s.gradNorm)},
                   {"step_ms", num(s.stepMs)},
                   {"tokens_per_s", num(s.tokensPerS)}});
  return out.dump();
}

std::string ScopeApi::pca(int64_t run, int64_t step, const std::string &phase,
                          int64_t rank) {
  // Every sketch probe of the step and rank, microbatch 0; rows of one width
  // are projected together so layers share one coordinate system.
  std::vector<double> rows;
  json labels = json::array();
  int dim = 0;
  for (const mapp::rt::StoredSample &s :
       store_.sketchSamples(run, step, phase, rank)) {
    json shape = json::parse(s.shapeJson, nullptr, false);
    // A malformed row of the store is skipped: a width that is not a
    // positive integer (0 divided below; a float cast to int).
    if (!shape.is_array() || shape.size() != 2 ||
        !shape[1].is_number_integer() || shape[1].get<int64_t>() <= 0 ||
        shape[1].get<int64_t>() > (1 << 20))
      continue;
    int d = shape[1].get<int>();
    if (dim && d != dim)
      continue;
    dim = d;
    const std::vector<float> &data = s.data;
    for (size_t i = 0; i < data.size() / d; ++i) {
      labels.push_back({{"probe", s.probe}, {"point", s.point}, {"row", i}});
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
  for (const mapp::rt::StoredToken &t : store_.generation(run))
    out.push_back({{"position", t.position},
                   {"token", t.token},
                   {"text", t.text},
                   {"prob", num(t.prob)},
                   {"topk", json::parse(t.topkJson, nullptr, false)}});
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ScopeApi::ranks(int64_t run) {
  json out = json::array();
  for (const mapp::rt::StoredRank &k : store_.ranks(run))
    out.push_back({{"rank", k.rank}, {"dp", k.dp}, {"pp", k.pp}, {"tp", k.tp}});
  return out.dump();
}

std::string ScopeApi::tokens(const Request &r) {
  // The tokens one forward saw (TokenRecord.cpp), with their texts: the
  // UI's heatmap, attention and PCA labels. null when the store has none
  // (an older store, or pre-tokenized data without --tokenizer).
  int64_t run = intParam(r, "run"), step = intParam(r, "step");
  int64_t rank = r.query.count("rank") ? intParam(r, "rank") : 0;
  std::string phase = phaseParam(r);
  std::optional<std::string> row = store_.contextTokens(run, step, phase, rank);
  if (!row)
    return "null";
  json ids = json::parse(*row, nullptr, false);
  if (!ids.is_array())
    fail("contexts row of step ", step, " is malformed");
  std::map<int64_t, std::string> texts = store_.vocab(run);
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

std::string ScopeApi::switches(int64_t run) {
  json sw = json::array(), log = json::array();
  for (const mapp::rt::StoredSwitch &s : store_.switches(run))
    sw.push_back({{"id", s.id},
                  {"kind", s.kind},
                  {"target", s.target},
                  {"point", s.point},
                  {"enabled", s.enabled},
                  {"magnitude", num(s.magnitude)},
                  {"ranks", s.ranks}});
  for (const mapp::rt::StoredControlEvent &e : store_.controlLog(run))
    log.push_back({{"rank", e.rank},
                   {"step", e.step},
                   {"switch", e.switchId},
                   {"enabled", e.enabled},
                   {"magnitude", num(e.magnitude)},
                   {"source", e.source}});
  return json({{"switches", sw},
               {"log", log},
               {"control", controlEndpoint(run)}})
      .dump();
}

std::string ScopeApi::controlEndpoint(int64_t run) {
  std::optional<std::string> metaText = store_.runMeta(run);
  if (!metaText)
    fail("no run ", run);
  json meta = json::parse(*metaText, nullptr, false);
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
