//===- Elastic.cpp - the elastic job's state machine ----------------------===//
#include "mapp/rt/Elastic.h"

#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

using namespace mapp::rt;
using json = nlohmann::json;
namespace fs = std::filesystem;


std::string ElasticLayout::text() const {
  std::ostringstream os;
  os << "tp " << tp << " x pp " << pp << " x dp " << dp << " (" << world
     << " ranks, " << microbatches << " microbatches)";
  return os.str();
}

ElasticLayout mapp::rt::describePlan(const std::string &path) {
  Plan p = loadPlan(path);
  ElasticLayout l;
  l.plan = path;
  l.world = p.worldSize;
  l.tp = p.tp;
  l.pp = p.pp;
  l.dp = p.dp;
  l.microbatches = p.numMicrobatches;
  l.samplesPerStep = int64_t(p.dp) * p.numMicrobatches * p.microBatchSize;
  return l;
}

std::vector<ElasticLayout>
mapp::rt::elasticLayouts(const std::vector<std::string> &plans) {
  std::vector<ElasticLayout> out;
  for (const std::string &path : plans) {
    ElasticLayout l = describePlan(path);
    if (l.world != l.tp * l.pp * l.dp)
      fail("--elastic: plan '", path, "' has world ", l.world, " but tp ", l.tp,
           " x pp ", l.pp, " x dp ", l.dp,
           " (a split or expert layout): elastic restarts need plain "
           "tp x pp x dp plans");
    if (!out.empty() && l.samplesPerStep != out.front().samplesPerStep)
      fail("--elastic: plan '", path, "' takes ", l.samplesPerStep,
           " samples per step, the job's plan '", out.front().plan, "' ",
           out.front().samplesPerStep,
           ": every layout must keep the global batch (dp x microbatches x "
           "micro-batch size; compile a smaller dp with more microbatches)");
    out.push_back(l);
  }
  return out;
}

const ElasticLayout *
mapp::rt::chooseLayout(const std::vector<ElasticLayout> &layouts, int ranks,
                       const ElasticLayout &current) {
  const ElasticLayout *best = nullptr;
  auto key = [&](const ElasticLayout &l) {
    return std::make_tuple(l.world, l.tp == current.tp && l.pp == current.pp,
                           l.dp);
  };
  for (const ElasticLayout &l : layouts)
    if (l.world <= ranks && (!best || key(l) > key(*best)))
      best = &l;
  return best;
}

std::string mapp::rt::checkpointDamage(const std::string &folder) {
  std::ifstream in(folder + "/manifest.json", std::ios::binary);
  if (!in)
    return "no manifest.json";
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  json m = json::parse(text, nullptr, false);
  if (!m.is_object() || !m.contains("seal") || !m["seal"].is_object() ||
      !m["seal"].contains("crc32") || !m["seal"]["crc32"].is_string())
    return "manifest.json is not a sealed manifest";
  if (manifestSeal(text) != m["seal"]["crc32"].get<std::string>())
    return "manifest.json's seal does not match its contents";
  if (!m.contains("shards") || !m["shards"].is_array())
    return "manifest.json lists no shards";
  for (const json &s : m["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() ||
        !s.contains("bytes") || !s.contains("crc32"))
      return "manifest.json has a malformed shard entry";
    std::string file = s["file"].get<std::string>();
    std::ifstream f(folder + "/" + file, std::ios::binary);
    if (!f)
      return "shard " + file + " is missing";
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    if (!s["bytes"].is_number_unsigned() ||
        bytes.size() != s["bytes"].get<uint64_t>())
      return "shard " + file + " has " + std::to_string(bytes.size()) +
             " bytes, the manifest says " + s["bytes"].dump();
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x",
                  sealCrc32(bytes.data(), bytes.size()));
    if (s["crc32"] != crc)
      return "shard " + file + " fails its CRC-32 (" + crc +
             ", the manifest says " + s["crc32"].dump() + ")";
  }
  return "";
}

ResumePoint mapp::rt::newestIntactCheckpoint(const std::string &saveDir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(saveDir, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos ||
        !e.is_directory(ec))
      continue;
    steps.emplace_back(std::stoll(name.substr(5)), e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  ResumePoint rp;
  for (const auto &[step, folder] : steps) {
    std::string why = checkpointDamage(folder);
    if (why.empty()) {
      rp.folder = folder;
      rp.step = step;
      return rp;
    }
    // Kept, not deleted: a person may want it; renamed so neither --resume
    // nor a later save's start check takes it for a checkpoint.
    std::string aside = folder + ".damaged";
    for (int i = 1; fs::exists(aside, ec); ++i)
      aside = folder + ".damaged-" + std::to_string(i);
    fs::rename(folder, aside, ec);
    if (ec)
      fail("--elastic: checkpoint ", folder, " is damaged (", why,
           ") and cannot be set aside: ", ec.message());
    rp.setAside.push_back(fs::path(folder).filename().string() + ": " + why +
                          " -> renamed to " +
                          fs::path(aside).filename().string());
  }
  return rp;
}

void mapp::rt::trimJsonlSteps(const std::string &path, int64_t step) {
  if (path.empty() || path == "-")
    return;
  std::ifstream in(path);
  if (!in)
    return;
  std::string kept, line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() >= step)
      continue;
    kept += line + "\n";
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  if (!out)
    fail("--elastic: cannot rewrite '", path, "'");
}

std::vector<int> mapp::rt::lostRanksIn(const std::string &text) {
  static const std::regex patterns[] = {
      std::regex(R"(rank (\d+) died)"),
      std::regex(R"(rank (\d+) did not answer)"),
      std::regex(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal)")};
  std::vector<int> out;
  for (const std::regex &re : patterns)
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end;
         ++it)
      out.push_back(std::stoi((*it)[1].str()));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> mapp::rt::stageLayerCounts(const Plan &plan) {
  std::vector<std::set<int>> layers(plan.pp);
  for (const Program &p : plan.programs)
    if (p.pp >= 0 && p.pp < plan.pp)
      for (const Value &v : p.values)
        if (v.kind == ValueKind::Param && layerOfName(v.name) >= 0)
          layers[p.pp].insert(layerOfName(v.name));
  std::vector<int> out;
  for (const auto &s : layers)
    out.push_back(static_cast<int>(s.size()));
  return out;
}

int PartitionSet::indexOf(const std::string &plan) const {
  auto it = std::find(plans.begin(), plans.end(), plan);
  return it == plans.end() ? -1 : static_cast<int>(it - plans.begin());
}

PartitionSet mapp::rt::loadPartitionSet(const std::string &jobPlan,
                                        const std::vector<std::string> &others,
                                        const std::string &homePlan) {
  PartitionSet set;
  set.plans.push_back(jobPlan);
  for (const std::string &p : others)
    if (set.indexOf(p) < 0)
      set.plans.push_back(p);
  set.home = homePlan.empty() ? 0 : std::max(set.indexOf(homePlan), 0);
  std::vector<ElasticLayout> ls = elasticLayouts(set.plans);
  for (size_t i = 0; i < set.plans.size(); ++i) {
    if (ls[i].tp != ls[0].tp || ls[i].pp != ls[0].pp || ls[i].dp != ls[0].dp)
      fail("--repartition-plan '", set.plans[i], "' is ", ls[i].text(),
           ", the job's plan ", ls[0].text(),
           ": a re-partition keeps the layout and moves layers between "
           "stages");
    if (ls[i].pp < 2)
      fail("--repartition-plan needs a pipeline (pp >= 2)");
    set.layers.push_back(stageLayerCounts(loadPlan(set.plans[i])));
  }
  return set;
}

std::string mapp::rt::formatElasticReport(const ElasticReport &r) {
  json j = json::object();
  if (!r.switchTo.empty()) {
    j["switch_to"] = r.switchTo;
    j["evidence"] = json::parse(r.evidence, nullptr, false);
  }
  if (r.windowStepMs > 0)
    j["window_step_ms"] = r.windowStepMs;
  return kElasticReportTag + j.dump() + "\n";
}

ElasticReport mapp::rt::lastElasticReport(const std::string &text) {
  ElasticReport r;
  const std::string tag = kElasticReportTag;
  size_t at = text.rfind(tag);
  if (at == std::string::npos)
    return r;
  size_t from = at + tag.size(), nl = text.find('\n', from);
  json j = json::parse(text.substr(from, nl == std::string::npos
                                             ? std::string::npos
                                             : nl - from),
                       nullptr, false);
  if (!j.is_object())
    fail("mapp-launch: a garbled elastic report from mapp-run: '",
         text.substr(at, std::min<size_t>(200, text.size() - at)), "'");
  r.switchTo = j.value("switch_to", "");
  if (j.contains("evidence"))
    r.evidence = j["evidence"].dump();
  r.windowStepMs = j.value("window_step_ms", 0.0);
  return r;
}

namespace {
json layoutJson(const ElasticLayout &l) {
  return {{"world", l.world}, {"tp", l.tp},         {"pp", l.pp},
          {"dp", l.dp},       {"microbatches", l.microbatches},
          {"plan", l.plan}};
}

std::string joinRanks(const std::vector<int> &r) {
  std::string s;
  for (int x : r)
    s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}
} // namespace

ElasticJob::ElasticJob(Options o) : o_(std::move(o)) {
  if (o_.saveDir.empty())
    fail("--elastic needs --save-dir DIR (a restart resumes from its newest "
         "checkpoint)");
  layouts_ = elasticLayouts(o_.plans);
  attempt_.layout = layouts_.front();
  ranks_ = attempt_.layout.world;
}

void ElasticJob::ranksReturnAt(int64_t step, int n) {
  returns_.emplace_back(step, n);
  std::sort(returns_.begin(), returns_.end());
}

int64_t ElasticJob::pendingReturnStep() const {
  return returns_.empty() ? -1 : returns_.front().first;
}

void mapp::rt::reportDecision(const std::string &tool,
                              const std::string &monitor,
                              const std::string &line,
                              const std::string &jsonLine) {
  // Every decision is printed, --quiet or not: they are rare.
  if (!line.empty())
    std::cerr << tool << ": elastic: " << line << "\n" << std::flush;
  if (monitor.empty())
    return;
  if (monitor == "-") {
    std::cout << jsonLine << "\n" << std::flush;
    return;
  }
  // One write of a whole line in append mode: the live monitor's lines in
  // the same file never interleave with it.
  std::ofstream out(monitor, std::ios::app);
  out << jsonLine + "\n" << std::flush;
}

void ElasticJob::decide(const char *decision, const std::string &line,
                        const std::string &jsonLine) {
  (void)decision;
  reportDecision(o_.tool, o_.monitor, line, jsonLine);
}

bool ElasticJob::restartOn(const ElasticLayout &to, const char *decision,
                           const std::string &reason,
                           const std::vector<int> &lost) {
  const ElasticLayout from = attempt_.layout;
  ResumePoint rp = newestIntactCheckpoint(o_.saveDir);
  for (const std::string &s : rp.setAside) {
    json j = {{"event", "elastic"}, {"decision", "checkpoint-set-aside"},
              {"attempt", attempt_.index + 1}, {"what", s}};
    decide("checkpoint-set-aside",
           "damaged checkpoint " + s + "; falling back to the previous one",
           j.dump());
  }
  trimJsonlSteps(o_.metrics, rp.step);
  trimJsonlSteps(o_.dumpBatches, rp.step);
  std::string where = rp.folder.empty() ? std::string("step 0 (no checkpoint)")
                                        : fs::path(rp.folder).filename().string();
  std::ostringstream line;
  line << reason << ": " << ranks_ << " rank(s) available; " << from.text()
       << " -> " << to.text() << ", global batch " << to.samplesPerStep
       << " samples kept, resuming from " << where << " (attempt "
       << attempt_.index + 2 << ")";
  json j = {{"event", "elastic"},
            {"decision", decision},
            {"attempt", attempt_.index + 1},
            {"reason", reason},
            {"lost_ranks", lost},
            {"ranks_available", ranks_},
            {"from", layoutJson(from)},
            {"to", layoutJson(to)},
            {"samples_per_step", to.samplesPerStep},
            {"resume_step", rp.step},
            {"resume_from", rp.folder}};
  decide(decision, line.str(), j.dump());
  attempt_.index += 1;
  attempt_.layout = to;
  attempt_.resume = rp.folder;
  attempt_.resumeStep = rp.step;
  attempt_.stopAtSaveFrom =
      to.world < layouts_.front().world ? pendingReturnStep() : -1;
  return true;
}

void ElasticJob::measuredAfterRepartition(const std::string &evidence,
                                          double stepMs) {
  json ev = json::parse(evidence, nullptr, false);
  if (!ev.is_object() || stepMs <= 0)
    return;
  const double before = ev.value("step_ms", 0.0),
               predicted = ev.value("step_ms_predicted", 0.0);
  if (before <= 0 || predicted <= 0)
    return;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "after the repartition to "
       << ev.value("layers_next", json::array()).dump()
       << ": slowest stage " << stepMs << " ms a step, " << before
       << " before; measured gain " << before / stepMs << "x, predicted "
       << before / predicted << "x";
  json j = {{"event", "elastic"},
            {"decision", "repartition-measured"},
            {"attempt", attempt_.index + 1},
            {"layers", ev.value("layers_next", json::array())},
            {"step_ms_before", before},
            {"step_ms_predicted", predicted},
            {"step_ms_measured", stepMs},
            {"predicted_gain", before / predicted},
            {"measured_gain", before / stepMs}};
  decide("repartition-measured", line.str(), j.dump());
}

void ElasticJob::repartition(const std::string &plan,
                             const std::string &evidence) {
  ElasticLayout to = describePlan(plan);
  const ElasticLayout from = attempt_.layout;
  ResumePoint rp = newestIntactCheckpoint(o_.saveDir);
  json ev = json::parse(evidence, nullptr, false);
  std::ostringstream line;
  line << "repartition at " << fs::path(rp.folder).filename().string()
       << ": stage times (ms)";
  if (ev.is_object())
    for (const json &t : ev["stage_ms"])
      line << " " << std::fixed << std::setprecision(2) << t.get<double>();
  line << "; layers " << ev.value("layers_now", json::array()).dump() << " -> "
       << ev.value("layers_next", json::array()).dump() << ", predicted gain "
       << std::setprecision(2) << ev.value("predicted_gain", 0.0) << "x ("
       << to.plan << ", attempt " << attempt_.index + 2 << ")";
  json j = {{"event", "elastic"},
            {"decision", "repartition"},
            {"attempt", attempt_.index + 1},
            {"evidence", ev},
            {"from", layoutJson(from)},
            {"to", layoutJson(to)},
            {"resume_step", rp.step},
            {"resume_from", rp.folder}};
  decide("repartition", line.str(), j.dump());
  attempt_.index += 1;
  attempt_.layout = to;
  attempt_.resume = rp.folder;
  attempt_.resumeStep = rp.step;
}

bool ElasticJob::next(const AttemptEnd &end) {
  auto giveUp = [&](const std::string &why, int status) {
    json j = {{"event", "elastic"},
              {"decision", "give-up"},
              {"attempt", attempt_.index + 1},
              {"reason", why}};
    decide("give-up", why, j.dump());
    exitStatus_ = status;
    return false;
  };
  if (end.status == 0) {
    ResumePoint rp = newestIntactCheckpoint(o_.saveDir);
    int64_t back = pendingReturnStep();
    bool grow = back >= 0 && rp.step >= back && rp.step < o_.steps;
    if (!grow) {
      exitStatus_ = 0;
      return false;
    }
    int n = 0;
    while (!returns_.empty() && returns_.front().first <= rp.step) {
      n += returns_.front().second;
      returns_.erase(returns_.begin());
    }
    ranks_ += n;
    const ElasticLayout *to = chooseLayout(layouts_, ranks_, attempt_.layout);
    if (attempt_.index + 1 > o_.maxRestarts)
      return giveUp("more than --elastic-max-restarts " +
                        std::to_string(o_.maxRestarts) + " restarts",
                    1);
    return restartOn(*to, "grow",
                     std::to_string(n) + " rank(s) back from step " +
                         std::to_string(back),
                     {});
  }
  std::string first = end.why.substr(0, end.why.find('\n'));
  if (end.lost.empty())
    return giveUp("attempt " + std::to_string(attempt_.index + 1) +
                      " failed without losing a rank (" + first +
                      "): not restarting, the same input would fail again",
                  end.status);
  for (int r : end.lost)
    lostNames_.push_back("rank " + std::to_string(r) + " of attempt " +
                         std::to_string(attempt_.index + 1) + " (" +
                         attempt_.layout.text() + ")");
  ranks_ -= static_cast<int>(end.lost.size());
  std::string lostText = "rank(s) " + joinRanks(end.lost) + " lost (" + first + ")";
  if (attempt_.index + 1 > o_.maxRestarts)
    return giveUp(lostText + "; more than --elastic-max-restarts " +
                      std::to_string(o_.maxRestarts) + " restarts",
                  1);
  const ElasticLayout *to =
      ranks_ > 0 ? chooseLayout(layouts_, ranks_, attempt_.layout) : nullptr;
  if (!to) {
    std::string all;
    for (const std::string &n : lostNames_)
      all += (all.empty() ? "" : "; ") + n;
    std::string have;
    for (const ElasticLayout &l : layouts_)
      have += (have.empty() ? "" : ", ") + std::to_string(l.world);
    return giveUp(lostText + ": no valid layout on the " +
                      std::to_string(std::max(ranks_, 0)) +
                      " remaining rank(s) (the given plans need " + have +
                      " ranks; lost so far: " + all + ")",
                  1);
  }
  return restartOn(*to, "shrink", lostText, end.lost);
}
