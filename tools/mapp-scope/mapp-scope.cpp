//===- mapp-scope.cpp - MegaScope web UI server ---------------------------===//
//
//   mapp-scope serve --db probes.sqlite [--port P] [--host 127.0.0.1]
//                    [--web DIR]
//   mapp-scope get --db probes.sqlite '/api/steps?run=1'   (one request,
//                    printed: the API without a browser, for scripts/tests)
//
//===----------------------------------------------------------------------===//
#include "HttpServer.h"
#include "ScopeApi.h"
#include "mapp/rt/Error.h"

#include <csignal>
#include <iostream>

using namespace mapp::scope;

static const char *kUsage =
    R"(usage: mapp-scope serve --db FILE [--port P] [--host ADDR] [--web DIR]
       mapp-scope get --db FILE PATH?QUERY
       mapp-scope post --db FILE PATH BODY

  --db FILE     probe store written by mapp-run --probe-db
  --port P      port to listen on (default 8765; 0 = any free port)
  --host ADDR   address to bind (default 127.0.0.1)
  --web DIR     web UI files (default: the source tree's tools/mapp-scope/web)
)";

int main(int argc, char **argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1], db, host = "127.0.0.1", web = MAPP_SCOPE_WEB_DIR;
  int port = 8765;
  std::vector<std::string> rest;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "mapp-scope: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--db")
      db = value();
    else if (a == "--host")
      host = value();
    else if (a == "--web")
      web = value();
    else if (a == "--port") {
      std::string v = value();
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(v) > 65535) {
        std::cerr << "mapp-scope: --port needs 0..65535, got '" << v << "'\n";
        return 2;
      }
      port = std::stoi(v);
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "mapp-scope: unknown flag '" << a << "'\n" << kUsage;
      return 2;
    } else
      rest.push_back(a);
  }
  if (db.empty() || (cmd != "serve" && cmd != "get" && cmd != "post")) {
    std::cerr << kUsage;
    return 2;
  }
  try {
    ScopeApi api(db, web);
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
      Response resp = api.handle(r);
      std::cout << resp.body << "\n";
      return resp.status == 200 ? 0 : 1;
    }
    std::signal(SIGPIPE, SIG_IGN);
    int fd;
    int bound = listenOn(host, port, fd);
    std::cout << "mapp-scope: serving http://" << host << ":" << bound << "/"
              << std::endl;
    serve(fd, [&](const Request &r) { return api.handle(r); });
  } catch (const std::exception &e) {
    std::cerr << "mapp-scope: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
