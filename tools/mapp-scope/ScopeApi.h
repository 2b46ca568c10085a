//===- ScopeApi.h - typed JSON API over a probe store -----------*- C++ -*-===//
//
// Every endpoint takes typed parameters (integers, fixed reduction names)
// and answers JSON; the only write is POST /api/control, which validates a
// switch command and forwards it to the run's control endpoint (a loopback
// port or the control file). No request is ever evaluated as code.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPEAPI_H
#define MAPP_SCOPE_SCOPEAPI_H

#include "HttpServer.h"

struct sqlite3;

namespace mapp::scope {

class ScopeApi {
public:
  /// Opens `db` read-only; Error when it is not a mapp probe database.
  ScopeApi(const std::string &db, const std::string &webDir);
  ~ScopeApi();
  Response handle(const Request &r);

private:
  Response api(const Request &r);
  Response file(const std::string &name, const char *type);
  std::string runs();
  std::string probes(int64_t run);
  std::string series(int64_t run, int64_t probe, const std::string &red);
  std::string sample(const Request &r);
  std::string steps(int64_t run);
  std::string pca(int64_t run, int64_t step, const std::string &phase);
  std::string generation(int64_t run);
  std::string switches(int64_t run);
  std::string control(const std::string &body);
  std::string live(int64_t run);
  std::string controlEndpoint(int64_t run);

  sqlite3 *db_ = nullptr;
  std::string path_, web_;
};

} // namespace mapp::scope

#endif
