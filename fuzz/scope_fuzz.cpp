//===- scope_fuzz.cpp - fuzz mapp-scope's HTTP server, API and store ------===//
//
//   mapp-fuzz-scope --db STORE.sqlite [--work DIR] [--time S] [--iters N]
//                   [--seed X] [common options]
//   mapp-fuzz-scope --db STORE.sqlite --repro FILE...
//
// STORE is a probe store written by mapp-run --probe-db (fuzz/smoke.sh makes
// one with the normal build's compiler and mapp-run). The driver runs
// mapp-scope's own code (tools/mapp-scope/*.cpp compiled in): `serve` on
// 127.0.0.1 (a free port, a fixed token "fuzz-token", no rate limit) in a
// background thread over a read-only copy of STORE, and ScopeApi in-process.
// Three kinds of input, by their first line:
//   * "#HTTP" + raw request bytes ("@PORT@" / "@TOKEN@" are replaced): sent
//     over TCP, the write side closed, the reply read: cpp-httplib's parser,
//     RequestGuard, ScopeApi::handle, static files. Every 50 inputs and
//     after any input without a reply, a valid request must still be
//     answered (else: the server died or hangs -> abort);
//   * "#SQL" + statements: applied with SQLite to a copy of STORE (a store a
//     crashed or buggy writer, or a hostile file, left behind), which
//     ScopeApi then opens and serves twelve requests from (the endpoints
//     and parameters picked from the input's hash, so --repro repeats it);
//   * a whole database file (the "SQLite format 3" header), opened and
//     served the same way.
// Failures: crashes, sanitizer reports, hangs; an exception other than
// mapp::rt::Error out of ScopeApi is counted (serve turns it into a 400).
//
//===----------------------------------------------------------------------===//
#include "FuzzLoop.h"

#include "ScopeApi.h"
#include "ScopeServer.h"
#include "mapp/rt/Error.h"

#include <sqlite3.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

using namespace mappfuzz;
using namespace mapp::scope;

namespace {

const char *kUsage =
    "usage: mapp-fuzz-scope --db STORE.sqlite [--work DIR] [--time S]\n"
    "         [--iters N] [--seed X] [--artifact-prefix P] [--watchdog S]\n"
    "         [--rss-limit-mb M] [-q]\n"
    "       mapp-fuzz-scope --db STORE.sqlite --repro FILE...\n";

constexpr size_t kMaxLen = 1 << 20;
const char *kToken = "fuzz-token";

bool startsWith(const Bytes &b, const char *p) {
  size_t n = std::strlen(p);
  return b.size() >= n && std::memcmp(b.data(), p, n) == 0;
}

std::string replaceAll(std::string s, const std::string &a,
                       const std::string &b) {
  for (size_t at = s.find(a); at != std::string::npos;
       at = s.find(a, at + b.size()))
    s.replace(at, a.size(), b);
  return s;
}

// ---- the store's schema, for SQL edits ----------------------------------------

struct Column {
  std::string table, name;
};
std::vector<Column> &schema() {
  static std::vector<Column> cols;
  return cols;
}

void readSchema(const std::string &db) {
  sqlite3 *h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return;
  std::vector<std::string> tables;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(h, "SELECT name FROM sqlite_master WHERE type='table'",
                         -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW)
      tables.push_back(reinterpret_cast<const char *>(sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
  }
  for (const std::string &t : tables) {
    std::string q = "PRAGMA table_info(\"" + t + "\")";
    if (sqlite3_prepare_v2(h, q.c_str(), -1, &st, nullptr) != SQLITE_OK)
      continue;
    while (sqlite3_step(st) == SQLITE_ROW)
      schema().push_back(
          {t, reinterpret_cast<const char *>(sqlite3_column_text(st, 1))});
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
}

const char *kSqlValues[] = {
    "NULL", "0", "1", "-1", "2", "7", "9223372036854775807",
    "-9223372036854775808", "4294967296", "1e308", "-1e308", "0.5", "'x'",
    "''", "'[4,0]'", "'[0,4]'", "'[0]'", "'[-1,2]'", "'[2,8,64]'", "'[]'",
    "'{}'", "'null'", "'[1e30,1]'", "'[2,8,8]'", "'[1,4]'", "'[3]'",
    "'[\"a\"]'", "'{\"tokens\":[0,1,99]}'", "'{\"control\":\"file:/etc/x\"}'",
    "'{\"control\":\"tcp:127.0.0.1:1\"}'", "'max'", "'lens'", "'sketch'",
    "'train'", "'generate'", "X''", "X'00'", "X'0000803f'",
    "X'0000803f0000c07f'", "X'ffffffffffffffff'", "zeroblob(3)",
    "zeroblob(64)", "randomblob(12)", "randomblob(1000)"};

std::string randomStatement(Rng &r) {
  if (schema().empty())
    return "SELECT 1";
  const Column &c = r.pick(schema());
  std::string row = "(SELECT rowid FROM \"" + c.table + "\" LIMIT 1 OFFSET " +
                    std::to_string(r.below(r.chance(70) ? 3 : 40)) + ")";
  switch (r.below(10)) {
  case 0:
    return "DELETE FROM \"" + c.table + "\" WHERE rowid = " + row;
  case 1:
    return "INSERT INTO \"" + c.table + "\" SELECT * FROM \"" + c.table +
           "\" LIMIT 1";
  case 2: // every row at once
    return "UPDATE \"" + c.table + "\" SET \"" + c.name + "\" = " +
           kSqlValues[r.below(sizeof kSqlValues / sizeof *kSqlValues)];
  default:
    return "UPDATE \"" + c.table + "\" SET \"" + c.name + "\" = " +
           kSqlValues[r.below(sizeof kSqlValues / sizeof *kSqlValues)] +
           " WHERE rowid = " + row;
  }
}

// ---- HTTP edits -------------------------------------------------------------------

const char *kPaths[] = {
    "/api/runs", "/api/probes?run=1", "/api/series?run=1&probe=0&reduction=max",
    "/api/sample?run=1&probe=3&reduction=attn&step=1",
    "/api/sample?run=1&probe=1&reduction=topk", "/api/lens?run=1&step=0",
    "/api/pca?run=1&step=2", "/api/steps?run=1", "/api/ranks?run=1",
    "/api/tokens?run=1&step=0", "/api/generation?run=1", "/api/switches?run=1",
    "/api/live?run=1", "/api/patches", "/api/control", "/api/patch", "/",
    "/index.html", "/?token=@TOKEN@", "/../../etc/passwd", "/%2e%2e/x",
    "/.hidden", "/assets/x.js", "/api/series?run=1&probe=0%20OR%201&reduction=max",
    "/api/sample?run=99999999999999999999&probe=0&reduction=raw",
    "/api/series?run=-9223372036854775808&probe=0&reduction=mean"};

const char *kHeaders[] = {
    "Host: 127.0.0.1:@PORT@", "Host: localhost:@PORT@", "Host: evil.example",
    "Host:", "Authorization: Bearer @TOKEN@", "Authorization: Bearer wrong",
    "Authorization: bearer    @TOKEN@  ", "Cookie: mapp_scope_@PORT@=@TOKEN@",
    "Cookie: ;;=;mapp_scope_@PORT@", "Origin: http://127.0.0.1:@PORT@",
    "Origin: http://evil.example", "Origin: null",
    "Content-Type: application/json", "Content-Type: text/plain",
    "Content-Length: 0", "Content-Length: 5", "Content-Length: 99999999999",
    "Content-Length: -1", "Content-Length: 18446744073709551616",
    "Transfer-Encoding: chunked", "Range: bytes=0-1",
    "Range: bytes=-99999999999999", "Accept-Encoding: gzip, br",
    "Connection: keep-alive", "Expect: 100-continue", "X: \x01\xff"};

const char *kBodies[] = {
    "{\"run\":1,\"switch\":7,\"enabled\":true}",
    "{\"run\":1,\"switch\":7,\"magnitude\":1e38}", "{\"run\":\"1\"}", "{}",
    "[]", "null", "{\"run\":1,\"switch\":-1}",
    "{\"into\":\"a\",\"from\":\"b\",\"site\":\"layers.0\",\"layer\":0,"
    "\"pos\":0,\"target\":\"c\"}",
    "{\"run\":1,\"switch\":9223372036854775807,\"enabled\":false}"};

std::vector<std::string> splitCrlf(const std::string &s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (true) {
    size_t e = s.find("\r\n", p);
    if (e == std::string::npos) {
      out.push_back(s.substr(p));
      return out;
    }
    out.push_back(s.substr(p, e - p));
    p = e + 2;
  }
}

std::string request(const std::string &method, const std::string &path,
                    std::vector<std::string> headers, const std::string &body) {
  std::string s = method + " " + path + " HTTP/1.1\r\n";
  for (const std::string &h : headers)
    s += h + "\r\n";
  if (!body.empty())
    s += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return s + "\r\n" + body;
}

void mutateHttp(Rng &r, std::string &req) {
  size_t end = req.find("\r\n\r\n");
  if (end == std::string::npos || r.chance(15)) {
    Bytes b(req.begin(), req.end());
    mutateBytes(r, b, {}, 1 << 16);
    req.assign(b.begin(), b.end());
    return;
  }
  std::vector<std::string> lines = splitCrlf(req.substr(0, end));
  std::string body = req.substr(end + 4);
  switch (r.below(6)) {
  case 0: { // another path or method
    static const char *methods[] = {"GET", "POST", "HEAD", "PUT", "OPTIONS",
                                    "get", "GET\t", ""};
    std::string m = r.chance(70) ? (r.chance(50) ? "GET" : "POST")
                                 : methods[r.below(8)];
    std::string p = kPaths[r.below(sizeof kPaths / sizeof *kPaths)];
    lines[0] = m + " " + p + (r.chance(90) ? " HTTP/1.1" : " HTTP/9.9");
    break;
  }
  case 1: // a header added
    lines.insert(lines.begin() + 1 + r.below(lines.size()),
                 kHeaders[r.below(sizeof kHeaders / sizeof *kHeaders)]);
    break;
  case 2: // a header dropped or duplicated
    if (lines.size() > 1) {
      size_t i = 1 + r.below(lines.size() - 1);
      if (r.chance(50))
        lines.erase(lines.begin() + i);
      else
        lines.insert(lines.begin() + i, lines[i]);
    }
    break;
  case 3: // a body
    body = kBodies[r.below(sizeof kBodies / sizeof *kBodies)];
    break;
  case 4: { // a query value replaced
    size_t q = lines[0].find('=');
    if (q != std::string::npos) {
      static const char *vals[] = {"0", "-1", "1", "x", "", "9223372036854775807",
                                   "1e3", "%00", "%ff", "0x10", " 1"};
      size_t e = lines[0].find_first_of("& ", q);
      lines[0] = lines[0].substr(0, q + 1) + vals[r.below(11)] +
                 (e == std::string::npos ? "" : lines[0].substr(e));
    }
    break;
  }
  case 5: { // bytes of the body
    Bytes b(body.begin(), body.end());
    mutateBytes(r, b, {}, 1 << 16);
    body.assign(b.begin(), b.end());
    break;
  }
  }
  req.clear();
  for (const std::string &l : lines)
    req += l + "\r\n";
  req += "\r\n" + body;
}

void mutate(Rng &r, Bytes &b, const std::vector<Bytes> &corpus) {
  if (startsWith(b, "#HTTP\n")) {
    std::string req(b.begin() + 6, b.end());
    mutateHttp(r, req);
    b.assign(b.begin(), b.begin() + 6);
    b.insert(b.end(), req.begin(), req.end());
  } else if (startsWith(b, "#SQL\n")) {
    std::string s(b.begin(), b.end());
    if (r.chance(85)) {
      int n = 1 + static_cast<int>(r.below(3));
      for (int k = 0; k < n; ++k)
        s += randomStatement(r) + "\n";
    } else {
      size_t nl = s.find('\n', 5 + r.below(s.size() - 4));
      size_t prev = s.rfind('\n', nl == std::string::npos ? s.size() - 1 : nl - 1);
      if (nl != std::string::npos && prev != std::string::npos && prev >= 4)
        s.erase(prev + 1, nl - prev); // one statement dropped
    }
    b.assign(s.begin(), s.end());
  } else {
    mutateBytes(r, b, corpus, kMaxLen);
  }
}

// ---- running an input ---------------------------------------------------------

struct Target {
  std::string work, base;
  std::atomic<int> port{0};
  uint64_t noReply = 0;

  /// One raw request to the server; the status code, 0 without a reply.
  int send(const std::string &raw, std::string *reply = nullptr) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port.load()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
      ::close(fd);
      return 0;
    }
    size_t done = 0;
    while (done < raw.size()) {
      ssize_t w = ::send(fd, raw.data() + done, raw.size() - done, MSG_NOSIGNAL);
      if (w <= 0)
        break;
      done += static_cast<size_t>(w);
    }
    // cpp-httplib writes no reply to a client that has closed its side, so
    // the side stays open: an incomplete request ends by the server's read
    // timeout (1 s). Only past twice that is the side closed.
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 2000) == 0)
      ::shutdown(fd, SHUT_WR);
    std::string got;
    char buf[4096];
    while (got.size() < (1u << 20)) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0)
        break;
      got.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    if (reply)
      *reply = got;
    int status = 0;
    if (std::sscanf(got.c_str(), "HTTP/1.%*d %d", &status) != 1)
      return 0;
    return status;
  }

  void checkAlive() {
    std::string ok = request("GET", "/api/runs",
                             {"Host: 127.0.0.1:" + std::to_string(port.load()),
                              std::string("Authorization: Bearer ") + kToken},
                             "");
    std::string reply;
    if (send(ok, &reply) != 200) {
      std::fprintf(stderr, "mapp-fuzz-scope: the server no longer answers a "
                           "valid request (reply: %.300s)\n", reply.c_str());
      std::abort();
    }
  }

  std::string http(const Bytes &b) {
    std::string raw(b.begin() + 6, b.end());
    raw = replaceAll(replaceAll(raw, "@PORT@", std::to_string(port.load())),
                     "@TOKEN@", kToken);
    int status = send(raw);
    static uint64_t count = 0;
    if (status == 0 || ++count % 50 == 0)
      checkAlive();
    if (status == 0)
      return "no reply";
    return (status / 100 == 2 ? "ok: HTTP " : "HTTP ") + std::to_string(status);
  }

  /// Twelve requests picked from the input's hash, against `db`.
  std::string serveStore(const std::string &db, const Bytes &b) {
    ScopeApi api(db, ControlOptions{work + "/no-token", work + "/control.json"});
    uint64_t h = 1469598103934665603ull;
    for (uint8_t c : b)
      h = (h ^ c) * 1099511628211ull;
    Rng r(h);
    static const char *reds[] = {"max",    "min",  "mean",   "std",
                                 "absmax", "sparsity", "hist", "topk",
                                 "sketch", "raw",  "attn",   "lens"};
    std::string statuses;
    for (int i = 0; i < 12; ++i) {
      Request q;
      q.method = "GET";
      std::string run = std::to_string(r.below(3));
      std::string step = std::to_string(static_cast<int64_t>(r.below(5)) - 1);
      std::string probe = std::to_string(r.below(8));
      std::string red = reds[r.below(12)];
      switch (r.below(14)) {
      case 0: q.path = "/api/runs"; break;
      case 1: q.path = "/api/probes"; q.query = {{"run", run}}; break;
      case 2:
        q.path = "/api/series";
        q.query = {{"run", run}, {"probe", probe}, {"reduction", red}};
        break;
      case 3:
        q.path = "/api/sample";
        q.query = {{"run", run}, {"probe", probe}, {"reduction", red}};
        if (r.chance(60))
          q.query["step"] = step;
        break;
      case 4: q.path = "/api/steps"; q.query = {{"run", run}}; break;
      case 5: q.path = "/api/lens"; q.query = {{"run", run}, {"step", step}}; break;
      case 6: q.path = "/api/pca"; q.query = {{"run", run}, {"step", step}}; break;
      case 7: q.path = "/api/ranks"; q.query = {{"run", run}}; break;
      case 8: q.path = "/api/tokens"; q.query = {{"run", run}, {"step", step}}; break;
      case 9: q.path = "/api/generation"; q.query = {{"run", run}}; break;
      case 10: q.path = "/api/switches"; q.query = {{"run", run}}; break;
      case 11: q.path = "/api/live"; q.query = {{"run", run}}; break;
      case 12:
        q.method = "POST";
        q.path = "/api/control";
        q.body = kBodies[r.below(3)];
        break;
      default:
        q.path = "/api/lens";
        q.query = {{"run", "1"}, {"step", std::to_string(r.below(3))}};
        break;
      }
      try {
        Response resp = api.handle(q);
        statuses += std::to_string(resp.status / 100);
      } catch (const mapp::rt::Error &) {
        statuses += "E"; // a 400 with the message
      }
    }
    return "ok: " + statuses;
  }

  std::string sql(const Bytes &b) {
    std::string cur = work + "/cur.sqlite";
    Bytes db;
    readFile(base, db);
    writeFile(cur, db);
    ::unlink((cur + "-wal").c_str());
    ::unlink((cur + "-shm").c_str());
    sqlite3 *h = nullptr;
    if (sqlite3_open(cur.c_str(), &h) != SQLITE_OK)
      return "cannot open the copy";
    std::string text(b.begin() + 5, b.end());
    size_t p = 0, failed = 0;
    while (p < text.size()) {
      size_t e = text.find('\n', p);
      std::string stmt = text.substr(p, e == std::string::npos ? e : e - p);
      p = e == std::string::npos ? text.size() : e + 1;
      if (!stmt.empty() && sqlite3_exec(h, stmt.c_str(), nullptr, nullptr,
                                        nullptr) != SQLITE_OK)
        ++failed;
    }
    sqlite3_close(h);
    return serveStore(cur, b);
  }

  std::string file(const Bytes &b) {
    std::string cur = work + "/raw.sqlite";
    ::unlink((cur + "-wal").c_str());
    ::unlink((cur + "-shm").c_str());
    writeFile(cur, b);
    return serveStore(cur, b);
  }

  std::string run(const Bytes &b) {
    if (startsWith(b, "#HTTP\n"))
      return http(b);
    if (startsWith(b, "#SQL\n"))
      return sql(b);
    return file(b);
  }
};

std::vector<Bytes> httpSeeds() {
  std::vector<std::string> auth = {"Host: 127.0.0.1:@PORT@",
                                   "Authorization: Bearer @TOKEN@"};
  std::vector<std::string> raw;
  for (const char *p : kPaths)
    raw.push_back(request("GET", p, auth, ""));
  std::vector<std::string> post = auth;
  post.push_back("Content-Type: application/json");
  for (const char *body : kBodies)
    raw.push_back(request("POST", "/api/control", post, body));
  raw.push_back(request("POST", "/api/patch", post, kBodies[7]));
  raw.push_back(request("GET", "/?token=@TOKEN@", {"Host: 127.0.0.1:@PORT@"}, ""));
  raw.push_back(request("GET", "/api/runs",
                        {"Host: localhost:@PORT@", "Cookie: mapp_scope_@PORT@=@TOKEN@",
                         "Origin: http://localhost:@PORT@"},
                        ""));
  std::vector<Bytes> out;
  for (const std::string &s : raw) {
    std::string in = "#HTTP\n" + s;
    out.push_back(Bytes(in.begin(), in.end()));
  }
  return out;
}

} // namespace

int main(int argc, char **argv) {
  ExtraArgs extra(argc, argv, {"--db", "--work"});
  Options o = parseCommon(extra.argc(), extra.argv(), kUsage);
  installCrashHandlers(o.artifactPrefix);
  Target t;
  t.work = extra.get("--work").empty() ? "mapp-fuzz-scope-work"
                                       : extra.get("--work");
  ::mkdir(t.work.c_str(), 0755);
  Bytes db;
  if (extra.get("--db").empty() || !readFile(extra.get("--db"), db)) {
    std::fprintf(stderr, "mapp-fuzz-scope: cannot read --db\n%s", kUsage);
    return 2;
  }
  t.base = t.work + "/base.sqlite";
  writeFile(t.base, db);
  readSchema(t.base);
  ::mkdir((t.work + "/web").c_str(), 0755);
  writeFile(t.work + "/web/index.html", Bytes{'<', 'p', '>'});

  // The server, as `mapp-scope serve` runs it, over the seed store.
  static ScopeApi *api = nullptr;
  try {
    api = new ScopeApi(t.base, ControlOptions{t.work + "/no-token",
                                              t.work + "/control.json"});
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mapp-fuzz-scope: the seed store: %s\n", e.what());
    return 2;
  }
  ServeOptions so;
  so.port = 0;
  so.webDir = t.work + "/web";
  so.token = kToken;
  so.ratePerSecond = 0;
  so.threads = 4;
  so.headTimeoutMs = 1000;
  so.bodyTimeoutMs = 1000;
  std::signal(SIGPIPE, SIG_IGN); // as mapp-scope serve does
  std::thread([&t, so] {
    try {
      serve(*api, so, [&t](int p) { t.port = p; });
    } catch (const std::exception &e) {
      std::fprintf(stderr, "mapp-fuzz-scope: serve: %s\n", e.what());
      std::_Exit(2);
    }
  }).detach();
  for (int i = 0; i < 500 && !t.port; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!t.port) {
    std::fprintf(stderr, "mapp-fuzz-scope: the server did not start\n");
    return 2;
  }

  std::vector<Bytes> seeds;
  if (!o.repro) {
    seeds = httpSeeds();
    std::string s = "#SQL\n";
    seeds.push_back(Bytes(s.begin(), s.end()));
    seeds.push_back(db);
  }
  int status = corpusLoop<mapp::rt::Error>(
      {"mapp-fuzz-scope"}, o, std::move(seeds),
      [&](const Bytes &b) { return t.run(b); }, mutate);
  std::fflush(stdout);
  std::_Exit(status); // the server thread never returns
}
