//===- ScopeApi.h - typed JSON API over a probe store -----------*- C++ -*-===//
//
// Every endpoint takes typed parameters (integers, fixed reduction names)
// and answers JSON; the only write is POST /api/control, which validates a
// switch command and forwards it to the run's job (ScopeControl.h): never to
// a port or file the store names. No request is ever evaluated as code. The
// HTTP side (token, Host/Origin, limits, static files) is ScopeServer.h.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPEAPI_H
#define MAPP_SCOPE_SCOPEAPI_H

#include "ScopeControl.h"
#include "ScopePatch.h"
#include "mapp/rt/ProbeStoreReader.h"

#include <map>
#include <memory>
#include <string>

namespace mapp::scope {

/// One API request, already decoded (by cpp-httplib or the get/post CLI).
struct Request {
  std::string method, path;
  std::map<std::string, std::string> query;
  std::string body;
};

struct Response {
  int status = 200;
  std::string contentType = "application/json";
  std::string body;
};

/// Splits "a=1&b=x%20y" into decoded pairs (cpp-httplib's decoder).
std::map<std::string, std::string> parseQuery(const std::string &q);

class ScopeApi {
public:
  /// Opens `db` through the runtime's reader (ProbeStoreReader.h: read-only,
  /// validated by tables, columns, schema version and quick_check); Error
  /// naming the file when it is corrupt or not a mapp probe store. The API
  /// holds no SQL of its own.
  ScopeApi(const std::string &db, ControlOptions control);
  ~ScopeApi();
  ScopeApi(const ScopeApi &) = delete;
  ScopeApi &operator=(const ScopeApi &) = delete;
  /// Answers /api/... (Error becomes a 400 with its message).
  Response handle(const Request &r);
  /// Patching from the page (POST /api/patch): off unless configured.
  void setPatchRunner(PatchRunnerOptions o) {
    patch_ = std::make_unique<PatchRunner>(std::move(o));
  }

private:
  Response api(const Request &r);
  std::string runs();
  std::string probes(int64_t run);
  std::string series(int64_t run, int64_t probe, const std::string &red);
  std::string sample(const Request &r);
  std::string lens(const Request &r);
  std::string steps(int64_t run);
  std::string pca(int64_t run, int64_t step, const std::string &phase,
                  int64_t rank);
  std::string generation(int64_t run);
  std::string switches(int64_t run);
  std::string control(const std::string &body);
  std::string live(int64_t run);
  std::string controlEndpoint(int64_t run);
  std::string ranks(int64_t run);
  std::string tokens(const Request &r);

  mapp::rt::ProbeStoreReader store_;
  ControlClient control_;
  std::unique_ptr<PatchRunner> patch_;
};

} // namespace mapp::scope

#endif
