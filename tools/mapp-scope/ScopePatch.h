//===- ScopePatch.h - activation patching started from the UI ---*- C++ -*-===//
//
// `mapp-scope serve --patch-plan PLAN --patch-weights W` lets the page start
// `mapp-run PLAN --weights W --patch SPEC` runs. The page sends parameters
// only (two prompt texts, a site name, two integers, a target text); they are
// checked here, the prompts go to fresh files in a private temporary folder,
// and mapp-run is started with an argument vector (posix_spawn, no shell).
// The plan, weights and mapp-run binary come from mapp-scope's own command
// line, never from a request or the store. One run at a time, bounded in
// time; results stay in memory for the page (GET /api/patches).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPEPATCH_H
#define MAPP_SCOPE_SCOPEPATCH_H

#include <mutex>
#include <string>
#include <vector>

namespace mapp::scope {

struct PatchRunnerOptions {
  std::string plan, weights; // "" = patching from the page is off
  std::string tokenizer;     // mapp-run --tokenizer ("" = bytes)
  std::string mappRun;       // the mapp-run binary
  int timeoutSeconds = 120;
};

/// The checked parameters of one patch request.
struct PatchParams {
  std::string into, from, site, target;
  long long layer = -1, pos = -1;
};

/// Parses and checks a POST /api/patch body: {"into": text, "from": text,
/// "site": dotted name, "layer": int, "pos": int, "target": text}; any other
/// key, a wrong type or an out-of-range value -> Error naming it.
PatchParams parsePatchRequest(const std::string &body);

class PatchRunner {
public:
  explicit PatchRunner(PatchRunnerOptions o) : opts_(std::move(o)) {}
  bool enabled() const { return !opts_.plan.empty(); }
  /// Runs one patch; returns mapp-run's JSON result with the request's
  /// parameters added. Error (mapp-run's message) when it fails; a second
  /// request while one runs -> Error "busy".
  std::string run(const PatchParams &p);
  /// {"enabled", "plan", "results": [...]} for the page.
  std::string list();

private:
  PatchRunnerOptions opts_;
  std::mutex runMu_, resultsMu_;
  std::vector<std::string> results_; // JSON objects, oldest first
};

/// The mapp-run next to this executable (/proc/self/exe's folder), or "".
std::string siblingMappRun();

} // namespace mapp::scope

#endif
