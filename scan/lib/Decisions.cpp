//===- Decisions.cpp - elastic decisions beside a trace's report ----------===//
#include "mapp/scan/Decisions.h"

#include <cstdio>
#include <fstream>

using nlohmann::json;

bool mapp::scan::readDecisions(const std::string &path, std::vector<json> &out,
                               std::string *err) {
  std::ifstream in(path);
  if (!in) {
    *err = path + ": cannot read the --decisions file";
    return false;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_object()) {
      *err = path + ":" + std::to_string(n) +
             ": not a JSON object (a mapp-run --monitor file holds one per "
             "line)";
      return false;
    }
    if (j.value("event", "") == "elastic")
      out.push_back(std::move(j));
  }
  return true;
}

namespace {
std::string fixed2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

/// "tp2 pp2 dp2 (8 ranks)" of a decision's from/to layout.
std::string layoutText(const json &l) {
  if (!l.is_object())
    return "?";
  return "tp" + std::to_string(l.value("tp", 0)) + " pp" +
         std::to_string(l.value("pp", 0)) + " dp" +
         std::to_string(l.value("dp", 0)) + " (" +
         std::to_string(l.value("world", 0)) + " ranks)";
}
} // namespace

std::string mapp::scan::decisionText(const json &d) {
  const std::string kind = d.value("decision", "?");
  std::string s = kind;
  if (d.contains("resume_step"))
    s += " at step " + std::to_string(d.value("resume_step", int64_t(0)));
  else if (d.contains("step"))
    s += " at step " + std::to_string(d.value("step", int64_t(0)));
  if (kind == "dp-split") {
    const json ev = d.value("evidence", json::object());
    s += ": microbatches " + ev.value("microbatches_now", json::array()).dump() +
         " -> " + ev.value("microbatches_next", json::array()).dump() +
         ", predicted gain " + fixed2(ev.value("predicted_gain", 0.0)) + "x";
  } else if (kind == "dp-split-measured") {
    s += " " + d.value("microbatches", json::array()).dump() +
         ": measured gain " + fixed2(d.value("measured_gain", 0.0)) +
         "x, predicted " + fixed2(d.value("predicted_gain", 0.0)) +
         "x (slowest replica " + fixed2(d.value("step_ms_before", 0.0)) +
         " -> " + fixed2(d.value("step_ms_measured", 0.0)) + " ms)";
  } else if (kind == "repartition") {
    const json ev = d.value("evidence", json::object());
    s += ": layers " + ev.value("layers_now", json::array()).dump() + " -> " +
         ev.value("layers_next", json::array()).dump() + ", predicted gain " +
         fixed2(ev.value("predicted_gain", 0.0)) + "x";
  } else if (kind == "repartition-measured") {
    s += " " + d.value("layers", json::array()).dump() + ": measured gain " +
         fixed2(d.value("measured_gain", 0.0)) + "x, predicted " +
         fixed2(d.value("predicted_gain", 0.0)) + "x (slowest stage " +
         fixed2(d.value("step_ms_before", 0.0)) + " -> " +
         fixed2(d.value("step_ms_measured", 0.0)) + " ms)";
  } else if (kind == "repartition-window" || kind == "dp-split-window") {
    // A window that stayed: what was weighed against the rule's bars.
    const json ev = d.value("evidence", json::object());
    const bool layers = kind == "repartition-window";
    const char *units = layers ? "layers" : "microbatches";
    s += ": stays on " + ev.value(std::string(units) + "_now", json::array()).dump();
    s += layers ? ", stage ms" : ", replica ms";
    for (const json &t : ev.value(layers ? "stage_ms" : "replica_ms", json::array()))
      s += " " + fixed2(t.get<double>());
    if (ev.contains(std::string(units) + "_weighed"))
      s += "; weighed " + ev[std::string(units) + "_weighed"].dump() +
           ": predicted gain " + fixed2(ev.value("predicted_gain", 0.0)) +
           "x, " + std::to_string(ev.value("votes", 0)) + " of " +
           std::to_string(ev.value("steps", 0)) + " steps faster";
    else
      s += "; no candidate predicted faster";
  } else if (d.contains("from") && d.contains("to")) {
    s += ": " + layoutText(d["from"]) + " -> " + layoutText(d["to"]);
  }
  if (d.contains("lost_ranks") && !d["lost_ranks"].empty())
    s += ", lost ranks " + d["lost_ranks"].dump();
  if (d.contains("what"))
    s += ": " + d.value("what", "");
  if (d.contains("reason"))
    s += " (" + d.value("reason", "") + ")";
  return s;
}
