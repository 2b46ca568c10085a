//===- Launch.cpp - mapp-launch --elastic: restart an mpirun job ----------===//
//
// Runs `mpirun ... mapp-run PLAN ...` as a child, passes its output through
// (keeping the tail of stderr, where mpirun and mapp-run name the ranks that
// died or hung), and after it ends asks ElasticJob what to do: the next
// attempt is the same command with -np, the plan, --resume and
// --elastic-attempt rewritten (and --repartition-plan given: the ranks'
// switch to another stage partition, reported on stderr, is a restart too).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Launch.h"

#include "mapp/rt/Elastic.h"
#include "mapp/rt/Error.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <sys/wait.h>
#include <unistd.h>

using namespace mapp::rt;

namespace {

std::atomic<pid_t> gChild{0};
std::atomic<bool> gStop{false};
std::atomic<int> gReturned{0};

/// SIGUSR1: a rank is back. The job is asked to checkpoint and stop (mpirun
/// forwards SIGUSR1 to every rank; mapp-run with --save-dir saves and exits
/// 0 on it), then grows.
extern "C" void rankReturned(int) {
  gReturned.fetch_add(1);
  pid_t c = gChild.load();
  if (c > 0)
    kill(c, SIGUSR1);
}

extern "C" void forwardStop(int sig) {
  gStop.store(true);
  pid_t c = gChild.load();
  if (c > 0)
    kill(c, sig);
}

/// Index of the value of `flag` in `args` from `from` on (`--flag V` or
/// `--flag=V`: then the index of that token, `inline` set); -1 if absent.
int findFlag(const std::vector<std::string> &args, size_t from,
             const std::string &flag, bool &inlineValue) {
  for (size_t i = from; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) {
      inlineValue = false;
      return static_cast<int>(i + 1);
    }
    if (args[i].rfind(flag + "=", 0) == 0) {
      inlineValue = true;
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string flagValue(const std::vector<std::string> &args, size_t from,
                      const std::string &flag) {
  bool inl = false;
  int i = findFlag(args, from, flag, inl);
  if (i < 0)
    return "";
  return inl ? args[i].substr(flag.size() + 1) : args[i];
}

/// Runs `argv`, stderr passed through and its last 64 KiB kept.
int runChild(const std::vector<std::string> &argv, std::string &errTail) {
  int fds[2];
  if (pipe(fds) != 0)
    fail("mapp-launch: pipe: ", std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0)
    fail("mapp-launch: fork: ", std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char *> av;
    for (const std::string &a : argv)
      av.push_back(const_cast<char *>(a.c_str()));
    av.push_back(nullptr);
    execvp(av[0], av.data());
    std::string msg = "mapp-launch: cannot run '" + argv[0] + "': " +
                      std::strerror(errno) + "\n";
    (void)!write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  gChild.store(pid);
  close(fds[1]);
  char buf[4096];
  while (true) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    (void)!write(STDERR_FILENO, buf, static_cast<size_t>(n));
    errTail.append(buf, static_cast<size_t>(n));
    if (errTail.size() > (1u << 16))
      errTail.erase(0, errTail.size() - (1u << 16));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  gChild.store(0);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

/// The failure's first line that says what went wrong (for the decision).
std::string firstFailureLine(const std::string &err) {
  size_t pos = 0;
  std::string first;
  while (pos < err.size()) {
    size_t nl = err.find('\n', pos);
    std::string line = err.substr(pos, nl == std::string::npos ? nl : nl - pos);
    pos = nl == std::string::npos ? err.size() : nl + 1;
    if (line.find("exited on signal") != std::string::npos ||
        line.find("did not answer") != std::string::npos)
      return line;
    if (first.empty() && line.rfind("mapp-run: rank ", 0) == 0)
      first = line;
  }
  return first.empty() ? "the job ended with an error" : first;
}

} // namespace

int mapp::rt::launchElastic(const LaunchOptions &lo) {
  const std::vector<std::string> &cmd = lo.command;
  size_t app = cmd.size();
  for (size_t i = 0; i < cmd.size(); ++i) {
    std::string base = cmd[i].substr(cmd[i].find_last_of('/') + 1);
    if (base == "mapp-run") {
      app = i;
      break;
    }
  }
  if (app == cmd.size())
    fail("mapp-launch: the command runs no mapp-run (expected mpirun ... "
         "mapp-run PLAN ...)");
  int npAt = -1;
  for (size_t i = 0; i + 1 < app; ++i)
    if (cmd[i] == "-np" || cmd[i] == "-n" || cmd[i] == "--np" ||
        cmd[i] == "-c")
      npAt = static_cast<int>(i + 1);
  if (npAt < 0)
    fail("mapp-launch: no -np N before mapp-run in the command (the "
         "supervisor sets the number of processes of each attempt)");
  int planAt = -1;
  for (size_t i = app + 1; i < cmd.size(); ++i)
    if (cmd[i].size() > 6 && cmd[i].compare(cmd[i].size() - 6, 6, ".mplan") == 0 &&
        cmd[i - 1].rfind("--", 0) != 0) {
      planAt = static_cast<int>(i);
      break;
    }
  if (planAt < 0)
    fail("mapp-launch: no plan (a *.mplan argument) after mapp-run");
  for (const char *f :
       {"--resume", "--elastic-attempt", "--elastic", "--repartition-plan"})
    for (size_t i = app + 1; i < cmd.size(); ++i)
      if (cmd[i] == f || cmd[i].rfind(std::string(f) + "=", 0) == 0)
        fail("mapp-launch: leave ", f, " out of the mapp-run command: the "
             "supervisor sets it on each attempt");
  ElasticJob::Options eo;
  eo.plans.push_back(cmd[planAt]);
  eo.plans.insert(eo.plans.end(), lo.plans.begin(), lo.plans.end());
  eo.saveDir = flagValue(cmd, app + 1, "--save-dir");
  eo.metrics = flagValue(cmd, app + 1, "--metrics");
  eo.monitor = flagValue(cmd, app + 1, "--monitor");
  eo.dumpBatches = flagValue(cmd, app + 1, "--dump-batches");
  std::string steps = flagValue(cmd, app + 1, "--steps");
  eo.steps = steps.empty() ? 1 : std::stoll(steps);
  eo.maxRestarts = lo.maxRestarts;
  eo.tool = "mapp-launch";
  if (eo.saveDir.empty())
    fail("mapp-launch --elastic: the mapp-run command needs --save-dir DIR "
         "(a restart resumes from its newest checkpoint)");
  ElasticJob job(eo);
  // The job's own plan first: every attempt gets the whole list and finds
  // its own plan in it (Run.cpp), so a switch names a plan, not an index.
  PartitionSet parts;
  if (!lo.repartitionPlans.empty())
    parts = loadPartitionSet(cmd[planAt], lo.repartitionPlans);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = forwardStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = rankReturned;
  sigaction(SIGUSR1, &sa, nullptr);
  std::string lastSwitch; // the evidence of the switch that began this attempt
  while (true) {
    const ElasticAttempt &a = job.attempt();
    std::vector<std::string> argv = cmd;
    argv[npAt] = std::to_string(a.layout.world);
    argv[planAt] = a.layout.plan;
    argv.push_back("--elastic-attempt");
    argv.push_back(std::to_string(a.index));
    if (a.index > 0 && !a.resume.empty()) {
      argv.push_back("--resume");
      argv.push_back(a.resume);
    }
    if (parts.indexOf(a.layout.plan) >= 0) // not after a shrink
      for (const std::string &p : parts.plans) {
        argv.push_back("--repartition-plan");
        argv.push_back(p);
      }
    std::string errTail;
    AttemptEnd end;
    end.status = runChild(argv, errTail);
    if (gStop.load()) // a person stopped the job: no restart
      return end.status;
    if (end.status != 0) {
      end.lost = lostRanksIn(errTail);
      end.why = firstFailureLine(errTail);
    }
    ElasticReport rep = lastElasticReport(errTail);
    if (rep.windowStepMs > 0 && !lastSwitch.empty())
      job.measuredAfterRepartition(lastSwitch, rep.windowStepMs);
    lastSwitch.clear();
    int returned = gReturned.exchange(0);
    if (returned)
      job.ranksReturnNow(returned);
    // Ranks back take precedence: the layout changes anyway.
    if (end.status == 0 && !rep.switchTo.empty() && !returned) {
      job.repartition(rep.switchTo, rep.evidence);
      lastSwitch = rep.evidence;
      continue;
    }
    if (!job.next(end))
      return job.exitStatus();
  }
}
