//===- ScopePatch.cpp - mapp-run --patch runs for the page ----------------===//
#include "ScopePatch.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;

namespace {

constexpr size_t kMaxPrompt = 4096, kMaxTarget = 64, kMaxSite = 64;
constexpr size_t kMaxResults = 200;

std::string textField(const json &j, const char *k, size_t max) {
  if (!j.contains(k) || !j[k].is_string())
    fail("patch: \"", k, "\" must be a string");
  std::string s = j[k];
  if (s.empty() || s.size() > max)
    fail("patch: \"", k, "\" must be 1..", max, " bytes, got ", s.size());
  if (s.find('\0') != std::string::npos)
    fail("patch: \"", k, "\" contains a NUL byte");
  return s;
}

long long intField(const json &j, const char *k) {
  if (!j.contains(k) || !j[k].is_number_integer())
    fail("patch: \"", k, "\" must be an integer");
  long long v = j[k];
  if (v < 0 || v > 1000000)
    fail("patch: \"", k, "\" must be in [0, 1000000], got ", v);
  return v;
}

/// A private folder with the two prompt files; removed on destruction.
class PromptFiles {
public:
  PromptFiles(const std::string &a, const std::string &b) {
    const char *t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/mapp-patch-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) // 0700, a fresh name
      fail("patch: cannot create a temporary folder: ", std::strerror(errno));
    dir = buf.data();
    write(dir + "/A.txt", a);
    write(dir + "/B.txt", b);
  }
  ~PromptFiles() {
    ::unlink((dir + "/A.txt").c_str());
    ::unlink((dir + "/B.txt").c_str());
    ::rmdir(dir.c_str());
  }
  std::string dir;

private:
  static void write(const std::string &path, const std::string &text) {
    int fd = ::open(path.c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
      fail("patch: cannot create '", path, "': ", std::strerror(errno));
    // mapp-run drops one final newline: keep a trailing one of the text.
    std::string body = text + "\n";
    bool ok = ::write(fd, body.data(), body.size()) ==
              static_cast<ssize_t>(body.size());
    ::close(fd);
    if (!ok)
      fail("patch: cannot write '", path, "'");
  }
};

std::string readAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0)
    out.append(buf, static_cast<size_t>(n));
  return out;
}

} // namespace

PatchParams mapp::scope::parsePatchRequest(const std::string &body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("patch needs a JSON object");
  static const char *keys[] = {"into", "from", "site", "layer", "pos",
                               "target"};
  for (const auto &[k, v] : j.items()) {
    bool known = false;
    for (const char *key : keys)
      known |= k == key;
    if (!known)
      fail("patch: unknown key '", k,
           "' (into, from, site, layer, pos, target)");
  }
  PatchParams p;
  p.into = textField(j, "into", kMaxPrompt);
  p.from = textField(j, "from", kMaxPrompt);
  p.site = textField(j, "site", kMaxSite);
  // A dotted name (resid, attn, mlp.fc1): mapp-run resolves it against the
  // plan's value names; nothing else may reach its spec.
  if (p.site.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQR"
                               "STUVWXYZ0123456789_.") != std::string::npos ||
      p.site.front() == '.' || p.site.back() == '.')
    fail("patch: site '", p.site, "' is not a dotted name");
  p.target = textField(j, "target", kMaxTarget);
  // The spec is KEY=VALUE,...: a target holding ',' could not be passed.
  if (p.target.find_first_of(",\n") != std::string::npos)
    fail("patch: the target may not contain ',' or a newline");
  p.layer = intField(j, "layer");
  p.pos = intField(j, "pos");
  return p;
}

std::string mapp::scope::siblingMappRun() {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return "";
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "mapp-run";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

std::string PatchRunner::run(const PatchParams &p) {
  if (!enabled())
    fail("patching from the page is off (start mapp-scope serve with "
         "--patch-plan PLAN --patch-weights W)");
  std::unique_lock<std::mutex> busy(runMu_, std::try_to_lock);
  if (!busy.owns_lock())
    fail("patch: busy (one patch run at a time)");
  PromptFiles files(p.into, p.from);
  std::string spec = "into=" + files.dir + "/A.txt,from=" + files.dir +
                     "/B.txt,site=" + p.site +
                     ",layer=" + std::to_string(p.layer) +
                     ",pos=" + std::to_string(p.pos) + ",target=" + p.target;
  std::vector<std::string> args = {opts_.mappRun, opts_.plan, "--weights",
                                   opts_.weights, "--patch", spec, "--quiet"};
  if (!opts_.tokenizer.empty()) {
    args.push_back("--tokenizer");
    args.push_back(opts_.tokenizer);
  }
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    fail("patch: pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pid_t pid;
  int rc = posix_spawn(&pid, opts_.mappRun.c_str(), &fa, nullptr, argv.data(),
                       environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    fail("patch: cannot start '", opts_.mappRun, "': ", std::strerror(rc));
  }
  // Reading both pipes on two threads: neither can fill up and stall the
  // child; a watchdog kills a run past the time limit.
  std::string so, se;
  std::thread te([&] { se = readAll(err[0]); });
  bool done = false;
  std::mutex m;
  std::thread watchdog([&] {
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::seconds(opts_.timeoutSeconds);
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> l(m);
        if (done)
          return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
  });
  so = readAll(out[0]);
  te.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  {
    std::lock_guard<std::mutex> l(m);
    done = true;
  }
  watchdog.join();
  ::close(out[0]);
  ::close(err[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = se;
    while (!why.empty() && (why.back() == '\n' || why.back() == '\r'))
      why.pop_back();
    if (WIFSIGNALED(status))
      fail("patch: mapp-run was stopped (signal ", WTERMSIG(status),
           WTERMSIG(status) == SIGKILL ? ", over the time limit)" : ")");
    fail(why.empty() ? "patch: mapp-run failed" : why);
  }
  json r = json::parse(so, nullptr, false);
  if (r.is_discarded() || !r.is_object())
    fail("patch: mapp-run printed no result");
  r["into"] = p.into;
  r["from"] = p.from;
  r["site"] = p.site;
  r["target_text"] = p.target;
  std::string dumped = r.dump(-1, ' ', false, json::error_handler_t::replace);
  std::lock_guard<std::mutex> l(resultsMu_);
  results_.push_back(dumped);
  if (results_.size() > kMaxResults)
    results_.erase(results_.begin());
  return dumped;
}

std::string PatchRunner::list() {
  json out = {{"enabled", enabled()}, {"results", json::array()}};
  std::lock_guard<std::mutex> l(resultsMu_);
  for (const std::string &r : results_)
    out["results"].push_back(json::parse(r));
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}
