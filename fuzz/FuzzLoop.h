//===- FuzzLoop.h - the corpus loop shared by the file-format drivers -----===//
//
// The drivers of one input format (safetensors, Megatron/JSONL data,
// tokenizer files, probe specs, mapp-scope requests) differ only in how an
// input is run and how it is mutated; this header holds the rest: the
// corpus and its signature feedback (FuzzCommon.h), --repro, bundles
// (several files as one input), a memory watchdog, progress lines and the
// summary line that docs/reliability.md records.
//
// Outcomes: the target returns a message ("ok..." when the input was
// accepted) or throws. An exception of the library's error type is a clean
// error; any other exception is counted as a contract violation (with
// --strict it fails the run); crashes, sanitizer reports, watchdog timeouts
// and the memory cap write the input as an artifact and end the process.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_FUZZ_LOOP_H
#define MAPP_FUZZ_LOOP_H

#include "FuzzCommon.h"

#include <atomic>
#include <dirent.h>
#include <exception>
#include <functional>
#include <sys/stat.h>
#include <thread>

namespace mappfuzz {

// ---- bundles: several named files as one input -----------------------------

struct File {
  std::string name;
  Bytes data;
};
using FileSet = std::vector<File>;

/// "#FILE name size\n" + bytes, per file (what --repro and artifacts hold).
inline Bytes bundle(const FileSet &s) {
  Bytes b;
  for (const File &f : s) {
    std::string h =
        "#FILE " + f.name + " " + std::to_string(f.data.size()) + "\n";
    b.insert(b.end(), h.begin(), h.end());
    b.insert(b.end(), f.data.begin(), f.data.end());
  }
  return b;
}

inline bool unbundle(const Bytes &b, FileSet &out) {
  size_t i = 0;
  while (i < b.size()) {
    size_t nl = i;
    while (nl < b.size() && b[nl] != '\n')
      ++nl;
    std::string h(b.begin() + i, b.begin() + nl);
    char name[256];
    size_t size;
    if (std::sscanf(h.c_str(), "#FILE %255s %zu", name, &size) != 2 ||
        nl + 1 + size > b.size() || nl + 1 + size < nl)
      return false;
    out.push_back({name, Bytes(b.begin() + nl + 1, b.begin() + nl + 1 + size)});
    i = nl + 1 + size;
  }
  return true;
}

/// The file called `name` in `s` (nullptr when absent).
inline File *fileNamed(FileSet &s, const std::string &name) {
  for (File &f : s)
    if (f.name == name)
      return &f;
  return nullptr;
}

/// Writes every file of `s` into `dir` (created; earlier files removed).
inline void writeSet(const std::string &dir, const FileSet &s) {
  ::mkdir(dir.c_str(), 0755);
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d))
      if (e->d_name[0] != '.')
        ::unlink((dir + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  for (const File &f : s)
    writeFile(dir + "/" + f.name, f.data);
}

// ---- memory cap -------------------------------------------------------------

/// A thread that reads the resident set size every 20 ms; past `limitMb` it
/// writes the input as ARTIFACT_PREFIX oom-<pid> and ends the process with
/// status 71. (RLIMIT_AS does not work under ASan, which maps terabytes of
/// shadow; the RSS is what an unbounded input really costs.)
inline void startMemoryWatch(size_t limitMb) {
  std::thread([limitMb] {
    long page = ::sysconf(_SC_PAGESIZE);
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int fd = ::open("/proc/self/statm", O_RDONLY);
      if (fd < 0)
        continue;
      char buf[128] = {0};
      ssize_t n = ::read(fd, buf, sizeof buf - 1);
      ::close(fd);
      unsigned long size = 0, rss = 0;
      if (n <= 0 || std::sscanf(buf, "%lu %lu", &size, &rss) != 2)
        continue;
      if (rss * static_cast<unsigned long>(page) > (limitMb << 20)) {
        const char *m = "\nmapp-fuzz: OUT OF MEMORY (resident set over the "
                        "--rss-limit-mb cap)";
        (void)!::write(2, m, std::strlen(m));
        writeArtifact(crashState().oomPath);
        ::_exit(71);
      }
    }
  }).detach();
}

// ---- the loop ---------------------------------------------------------------

struct LoopConfig {
  const char *name;          // "mapp-fuzz-safetensors"
  size_t maxCorpus = 2000;
};

/// Outcome of one input.
struct Outcome {
  std::string msg;
  bool accepted = false; // the library took it (msg starts with "ok")
};

/// Runs `run` on one input under the watchdog; clean errors (ErrorT) and
/// other exceptions become outcomes.
template <typename ErrorT, typename RunFn>
Outcome runGuarded(const Options &o, const Bytes &b, RunFn &run,
                   uint64_t &contract) {
  setCurrentInput(b);
  alarm(o.watchdog);
  Outcome out;
  try {
    out.msg = run(b);
    out.accepted = out.msg.rfind("ok", 0) == 0;
  } catch (const ErrorT &e) {
    out.msg = e.what();
  } catch (const std::exception &e) {
    ++contract;
    out.msg = std::string("NON-ERROR EXCEPTION: ") + e.what();
    std::fprintf(stderr, "%s\n", out.msg.c_str());
    if (o.strict) {
      writeArtifact(crashState().crashPath);
      std::exit(1);
    }
  }
  alarm(0);
  return out;
}

/// The whole driver after option parsing: --repro of o.inputs, or the
/// mutation loop from `seeds`. `mutate(rng, input, corpus)` edits an input
/// in place. Returns the process status.
template <typename ErrorT, typename RunFn, typename MutateFn>
int corpusLoop(const LoopConfig &cfg, const Options &o,
               std::vector<Bytes> seeds, RunFn run, MutateFn mutate) {
  uint64_t contract = 0;
  startMemoryWatch(o.rssLimitMb);
  if (o.repro) {
    int status = 0;
    for (const std::string &in : o.inputs) {
      Bytes b;
      if (!readFile(in, b)) {
        std::fprintf(stderr, "%s: cannot read '%s'\n", cfg.name, in.c_str());
        return 2;
      }
      Outcome r = runGuarded<ErrorT>(o, b, run, contract);
      std::printf("%s: %s\n", in.c_str(), r.msg.c_str());
    }
    if (contract)
      status = 1;
    return status;
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no seeds\n", cfg.name);
    return 2;
  }
  if (!o.writeSeeds.empty()) { // for --repro and regression inputs
    ::mkdir(o.writeSeeds.c_str(), 0755);
    for (size_t i = 0; i < seeds.size(); ++i)
      writeFile(o.writeSeeds + "/seed-" + std::to_string(i), seeds[i]);
  }
  Rng rng(o.seed);
  Outcomes outcomes;
  std::vector<Bytes> corpus;
  size_t acceptedSeeds = 0;
  for (Bytes &s : seeds) {
    Outcome r = runGuarded<ErrorT>(o, s, run, contract);
    outcomes.add(signature(r.msg), r.msg);
    acceptedSeeds += r.accepted;
    if (!r.accepted && !o.quiet)
      std::fprintf(stderr, "%s: note: seed %zu is refused: %.200s\n", cfg.name,
                   corpus.size(), r.msg.c_str());
    corpus.push_back(std::move(s));
  }
  std::printf("%s: %zu seeds (%zu accepted), seed %llu, %s build, %s%.0f s\n",
              cfg.name, corpus.size(), acceptedSeeds,
              static_cast<unsigned long long>(o.seed),
              sanitized() ? "ASan+UBSan" : "unsanitized",
              o.iters ? "iteration-bounded, " : "", o.seconds);
  std::fflush(stdout);

  Clock clock;
  uint64_t iters = 0, accepted = 0, added = 0;
  double lastReport = 0;
  Bytes cur;
  while (o.iters ? iters < o.iters : clock.seconds() < o.seconds) {
    ++iters;
    cur = rng.pick(corpus);
    mutate(rng, cur, corpus);
    Outcome r = runGuarded<ErrorT>(o, cur, run, contract);
    accepted += r.accepted;
    if (outcomes.add(signature(r.msg), r.msg) &&
        corpus.size() < cfg.maxCorpus) {
      corpus.push_back(cur);
      ++added;
    }
    double t = clock.seconds();
    if (!o.quiet && t - lastReport >= 30) {
      lastReport = t;
      std::printf("  %6.0f s  %10llu iters  %8.0f/s  accepted %llu  outcomes "
                  "%zu  corpus %zu\n",
                  t, static_cast<unsigned long long>(iters), iters / t,
                  static_cast<unsigned long long>(accepted),
                  outcomes.seen.size(), corpus.size());
      std::fflush(stdout);
    }
  }
  double t = clock.seconds();
  std::printf("%s: done: %llu iterations in %.1f s (%.0f/s); %llu accepted; "
              "%zu distinct outcomes; corpus %zu (+%llu); %llu non-Error "
              "exceptions; no crash\n",
              cfg.name, static_cast<unsigned long long>(iters), t, iters / t,
              static_cast<unsigned long long>(accepted), outcomes.seen.size(),
              corpus.size(), static_cast<unsigned long long>(added),
              static_cast<unsigned long long>(contract));
  if (!o.quiet) {
    std::printf("most frequent outcomes:\n");
    outcomes.print(stdout, 25);
  }
  return contract && o.strict ? 1 : 0;
}

/// Adds FILE, or every file of directory DIR (sorted), to `out`.
inline bool addSeedPath(const std::string &path, std::vector<Bytes> &out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return false;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = ::opendir(path.c_str());
    std::vector<std::string> names;
    while (dirent *e = d ? ::readdir(d) : nullptr)
      if (e->d_name[0] != '.')
        names.push_back(path + "/" + e->d_name);
    if (d)
      ::closedir(d);
    std::sort(names.begin(), names.end());
    for (auto &n : names)
      if (!addSeedPath(n, out))
        return false;
    return true;
  }
  Bytes b;
  if (!readFile(path, b))
    return false;
  out.push_back(std::move(b));
  return true;
}

/// Takes `--NAME VALUE` options of one driver out of argv before the common
/// parser sees them; `get(name)` then returns the value ("" when absent).
struct ExtraArgs {
  std::map<std::string, std::string> values;
  std::vector<char *> rest;
  ExtraArgs(int argc, char **argv, std::initializer_list<const char *> names) {
    for (int i = 0; i < argc; ++i) {
      bool taken = false;
      for (const char *n : names)
        if (i > 0 && std::string(argv[i]) == n && i + 1 < argc) {
          values[n] = argv[++i];
          taken = true;
        }
      if (!taken)
        rest.push_back(argv[i]);
    }
  }
  std::string get(const std::string &n) const {
    auto it = values.find(n);
    return it == values.end() ? "" : it->second;
  }
  int argc() const { return static_cast<int>(rest.size()); }
  char **argv() { return rest.data(); }
};

} // namespace mappfuzz

#endif // MAPP_FUZZ_LOOP_H
