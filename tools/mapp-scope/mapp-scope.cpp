//===- mapp-scope.cpp - MegaScope web UI server ---------------------------===//
//
//   mapp-scope serve --db probes.sqlite [--port P] [--host 127.0.0.1] ...
//   mapp-scope get --db probes.sqlite '/api/steps?run=1'   (one request,
//                    printed: the API without a browser, for scripts/tests)
//
//===----------------------------------------------------------------------===//
#include "ScopeApi.h"
#include "ScopeServer.h"
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/Error.h"

#include <arpa/inet.h>
#include <csignal>
#include <iostream>
#include <unistd.h>

using namespace mapp::scope;

static const char *kUsage =
    R"(usage: mapp-scope serve --db FILE [--port P] [--host ADDR] [--web DIR]
                        [--rate-limit N] [--control-token-file FILE]
                        [--control-file FILE]
                        [--patch-plan PLAN --patch-weights W
                         [--patch-tokenizer T] [--mapp-run BIN]]
       mapp-scope get --db FILE PATH?QUERY
       mapp-scope post --db FILE PATH BODY

  --db FILE     probe store written by mapp-run --probe-db (opened read-only)
  --port P      port to listen on (default 8765; 0 = any free port)
  --host ADDR   IPv4 address to bind (default 127.0.0.1)
  --web DIR     the built web UI (default: the build tree's
                share/mapp-scope/web, written by `npm run build`)
  --rate-limit N  requests per second per client (default 50, bursts of 2N;
                0 = no limit)
  --control-token-file FILE  the job's control token (written by mapp-run
                --probe-control PORT; default FILE.control-token of --db)
  --control-file FILE  the control file of a job run with --probe-control
                FILE: the only file mapp-scope writes (never one the store
                names)
  --patch-plan PLAN --patch-weights W  let the page start activation
                patching runs (mapp-run PLAN --weights W --patch ...) with
                parameters only; off without them
  --patch-tokenizer T  mapp-run --tokenizer for those runs (default bytes)
  --mapp-run BIN  the mapp-run binary (default: the one beside mapp-scope)

serve prints http://ADDR:PORT/?token=TOKEN: every request needs that token
(the page keeps it in an HttpOnly cookie; scripts send
Authorization: Bearer TOKEN). docs/megascope.md, "Security".
)";

int main(int argc, char **argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1], db, tokenFile, controlFile;
  ServeOptions so;
  PatchRunnerOptions patch;
  so.webDir = MAPP_SCOPE_WEB_DIR;
  bool tokenFileGiven = false;
  std::vector<std::string> rest;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc)
          mapp::rt::fail(a, " needs a value");
        return argv[++i];
      };
      if (a == "--db")
        db = value();
      else if (a == "--host") {
        so.host = value();
        in_addr addr;
        if (inet_pton(AF_INET, so.host.c_str(), &addr) != 1)
          mapp::rt::fail("--host must be an IPv4 address, got '", so.host,
                         "'");
      } else if (a == "--web")
        so.webDir = value();
      else if (a == "--port")
        so.port = mapp::rt::parsePort("--port", value());
      else if (a == "--rate-limit") {
        std::string v = value();
        if (v.empty() || v.size() > 6 ||
            v.find_first_not_of("0123456789") != std::string::npos)
          mapp::rt::fail("--rate-limit needs 0..999999 requests a second, "
                         "got '", v, "'");
        so.ratePerSecond = std::stod(v);
      } else if (a == "--control-token-file") {
        tokenFile = value();
        tokenFileGiven = true;
      } else if (a == "--control-file")
        controlFile = value();
      else if (a == "--patch-plan")
        patch.plan = value();
      else if (a == "--patch-weights")
        patch.weights = value();
      else if (a == "--patch-tokenizer")
        patch.tokenizer = value();
      else if (a == "--mapp-run")
        patch.mappRun = value();
      else if (a.rfind("--", 0) == 0)
        mapp::rt::fail("unknown flag '", a, "'");
      else
        rest.push_back(a);
    }
  } catch (const mapp::rt::Error &e) {
    std::cerr << "mapp-scope: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (db.empty() || (cmd != "serve" && cmd != "get" && cmd != "post")) {
    std::cerr << kUsage;
    return 2;
  }
  if (patch.plan.empty() != patch.weights.empty()) {
    std::cerr << "mapp-scope: --patch-plan and --patch-weights go together\n";
    return 2;
  }
  if (!patch.plan.empty()) {
    if (patch.mappRun.empty())
      patch.mappRun = siblingMappRun();
    for (const std::string *f : {&patch.plan, &patch.weights, &patch.mappRun})
      if (f->empty() || ::access(f->c_str(), R_OK) != 0) {
        std::cerr << "mapp-scope: cannot read '" << *f
                  << "' (--patch-plan, --patch-weights, --mapp-run)\n";
        return 2;
      }
  }
  if (cmd == "serve" &&
      ::access((so.webDir + "/index.html").c_str(), R_OK) != 0) {
    std::cerr << "mapp-scope: no web UI in '" << so.webDir
              << "' (index.html missing): build it with `cmake --build build "
                 "--target mapp-scope-web` (npm ci && npm run build in "
                 "tools/mapp-scope/web), or pass --web DIR\n";
    return 1;
  }
  if (!tokenFileGiven)
    tokenFile = mapp::rt::defaultControlTokenFile(db);
  try {
    ScopeApi api(db, ControlOptions{tokenFile, controlFile});
    if (!patch.plan.empty())
      api.setPatchRunner(patch);
    if (cmd == "get" || cmd == "post") {
      if (rest.size() != (cmd == "get" ? 1u : 2u)) {
        std::cerr << kUsage;
        return 2;
      }
      Request r;
      r.method = cmd == "get" ? "GET" : "POST";
      size_t q = rest[0].find('?');
      r.path = rest[0].substr(0, q);
      if (q != std::string::npos)
        r.query = parseQuery(rest[0].substr(q + 1));
      if (cmd == "post")
        r.body = rest[1];
      Response resp;
      try {
        resp = api.handle(r);
      } catch (const mapp::rt::Error &e) {
        std::cerr << "mapp-scope: " << e.what() << "\n";
        return 1;
      }
      std::cout << resp.body << "\n";
      return resp.status == 200 ? 0 : 1;
    }
    std::signal(SIGPIPE, SIG_IGN);
    so.token = mapp::rt::randomToken();
    if (so.host != "127.0.0.1")
      std::cerr << "mapp-scope: warning: listening on " << so.host
                << ", not loopback: reachable from other machines (the "
                   "token still guards every request)\n";
    serve(api, so, [&](int port) {
      std::string shown = so.host == "0.0.0.0" ? "127.0.0.1" : so.host;
      std::cout << "mapp-scope: serving http://" << shown << ":" << port
                << "/?token=" << so.token << std::endl;
    });
  } catch (const std::exception &e) {
    std::cerr << "mapp-scope: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
