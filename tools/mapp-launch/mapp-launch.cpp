//===- mapp-launch.cpp - elastic supervisor of an mpirun job --------------===//
//
// A thin main over mapp::rt::launchElastic (runtime/src/elastic/Launch.cpp).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Launch.h"

#include <iostream>
#include <string>

namespace {
const char *kUsage = R"(usage: mapp-launch --elastic [flags] -- mpirun ... -np N ... mapp-run PLAN ... --save-dir DIR ...

Runs the command; when a rank process dies or hangs, runs it again on the
largest layout that fits the ranks left (dp shrinks first; every layout keeps
the global batch), resumed from the newest intact checkpoint in DIR. Each
decision is one stderr line and one JSON line in mapp-run's --monitor file.
SIGUSR1 to mapp-launch: a rank is back (the job checkpoints, stops and grows
to the largest layout that fits); SIGTERM/SIGINT end the job, no restart.
docs/elastic.md.

  --elastic                  required (the only mode so far)
  --elastic-plan PLAN        a layout the job may switch to (repeatable)
  --repartition-plan PLAN    another stage partition of the job's layout: at
                             each checkpoint the ranks measure their stages
                             and the job moves to the partition predicted
                             >= 1.15x faster in >= 80% of the steps since
                             (repeatable)
  --elastic-max-restarts N   give up after N restarts (default 8)
  --help                     this text

Exit status: the job's (0 when every step ran), 1 when no layout fits or a
failure lost no rank (it would fail again), 2 bad command line.
)";

[[noreturn]] void usageError(const std::string &msg) {
  std::cerr << "mapp-launch: " << msg << "\n" << kUsage;
  std::exit(2);
}
} // namespace

int main(int argc, char **argv) {
  mapp::rt::LaunchOptions o;
  bool elastic = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--elastic") {
      elastic = true;
      continue;
    }
    if ((a == "--elastic-plan" || a == "--elastic-max-restarts" ||
         a == "--repartition-plan") &&
        i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--elastic-plan" || a == "--repartition-plan") {
        (a == "--elastic-plan" ? o.plans : o.repartitionPlans).push_back(v);
        continue;
      }
      try {
        size_t used;
        o.maxRestarts = std::stoi(v, &used);
        if (used != v.size() || o.maxRestarts < 0 || o.maxRestarts > 1000)
          throw std::invalid_argument(v);
      } catch (const std::exception &) {
        usageError("--elastic-max-restarts needs an integer in [0, 1000], got '" +
                   v + "'");
      }
      continue;
    }
    usageError("unknown flag '" + a + "' (the job's command follows --)");
  }
  if (!elastic)
    usageError("give --elastic (the supervisor's only mode)");
  for (; i < argc; ++i)
    o.command.push_back(argv[i]);
  if (o.command.empty())
    usageError("no command after --");
  try {
    return mapp::rt::launchElastic(o);
  } catch (const mapp::rt::Error &e) {
    std::cerr << e.what() << "\n";
  } catch (const std::exception &e) {
    std::cerr << "mapp-launch: " << e.what() << "\n";
  }
  return 1;
}
