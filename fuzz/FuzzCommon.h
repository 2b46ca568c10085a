//===- FuzzCommon.h - mutation loop support for the mapp fuzz drivers -----===//
//
// clang/libFuzzer are not available on the dev machines, so the drivers run
// their own loop: pick an input from the corpus, mutate it, feed it to the
// code under test, and treat only crashes, sanitizer reports and hangs as
// failures (a clean error is the expected outcome for most inputs).
//
// Feedback without coverage instrumentation: each outcome (the error message
// with numbers and quoted names stripped, or "ok") is a signature; an input
// that produces a signature not seen before joins the corpus. That steers the
// loop towards inputs that get past more of the checks.
//
// Crash capture: before each run the driver registers the current input;
// fatal signals, the ASan/UBSan death callback and the per-input watchdog
// (SIGALRM) write it to ARTIFACT_PREFIX + "crash-<pid>" / "timeout-<pid>"
// with async-signal-safe calls, then the process dies as it would have.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_FUZZ_COMMON_H
#define MAPP_FUZZ_COMMON_H

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <string_view>
#include <map>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace mappfuzz {

using Bytes = std::vector<uint8_t>;

/// SplitMix64: small, fast, reproducible from --seed.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  bool chance(unsigned pct) { return below(100) < pct; }
  template <typename T> const T &pick(const std::vector<T> &v) {
    return v[below(v.size())];
  }
};

/// Integers that tend to break size and index arithmetic.
inline int64_t interestingInt(Rng &r) {
  static const int64_t k[] = {0,
                              1,
                              -1,
                              2,
                              3,
                              7,
                              8,
                              16,
                              63,
                              64,
                              255,
                              256,
                              1023,
                              4096,
                              65535,
                              65536,
                              -2,
                              -128,
                              127,
                              0x7fffffffll,
                              0x80000000ll,
                              -0x80000000ll,
                              0xffffffffll,
                              0x100000000ll,
                              (1ll << 48),
                              (1ll << 48) + 1,
                              0x7fffffffffffffffll,
                              (int64_t)0x8000000000000000ull};
  return k[r.below(sizeof(k) / sizeof(k[0]))];
}

inline double interestingFloat(Rng &r) {
  static const double k[] = {0.0,   -0.0,  1.0,     -1.0,   0.5,    1e-30,
                             1e30,  1e300, -1e300,  2.0,    1e-8,   0.999,
                             1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0, 1e10, 4e9,
                             -4e9,  9.3e18, -9.3e18};
  return k[r.below(sizeof(k) / sizeof(k[0]))];
}

/// End of the JSON(ish) value starting at `b`: past a quoted string (with
/// escapes), else at the first of `stops`; may exceed s.size() for an
/// unterminated string.
inline size_t jsonValueEnd(const std::string &s, size_t b, const char *stops) {
  size_t e = b;
  if (e < s.size() && s[e] == '"') {
    ++e;
    while (e < s.size() && s[e] != '"')
      e += s[e] == '\\' ? 2 : 1;
    return e + 1;
  }
  const std::string_view stop(stops);
  while (e < s.size() && stop.find(s[e]) == std::string_view::npos)
    ++e;
  return e;
}

/// Generic byte mutations (libFuzzer-style).
inline void mutateBytes(Rng &r, Bytes &b, const std::vector<Bytes> &others,
                        size_t maxLen) {
  int n = 1 + static_cast<int>(r.below(r.chance(70) ? 3 : 12));
  for (int k = 0; k < n; ++k) {
    switch (r.below(10)) {
    case 0: // bit flip
      if (!b.empty())
        b[r.below(b.size())] ^= static_cast<uint8_t>(1u << r.below(8));
      break;
    case 1: // random byte
      if (!b.empty())
        b[r.below(b.size())] = static_cast<uint8_t>(r.next());
      break;
    case 2: { // interesting integer, little-endian, width 1/2/4/8
      static const size_t widths[] = {1, 2, 4, 8};
      size_t w = widths[r.below(4)];
      if (b.size() < w)
        break;
      size_t at = r.below(b.size() - w + 1);
      if (r.chance(50))
        at &= ~(w - 1); // aligned: where FlatBuffers scalars live
      int64_t v = interestingInt(r);
      std::memcpy(&b[at], &v, w);
      break;
    }
    case 3: { // add a small delta to a 32-bit word
      if (b.size() < 4)
        break;
      size_t at = r.below(b.size() - 3) & ~size_t(3);
      int32_t v;
      std::memcpy(&v, &b[at], 4);
      v = static_cast<int32_t>(static_cast<uint32_t>(v) +
                               static_cast<uint32_t>(r.below(33)) - 16u);
      std::memcpy(&b[at], &v, 4);
      break;
    }
    case 4: { // insert random bytes
      if (b.size() >= maxLen)
        break;
      size_t at = r.below(b.size() + 1), len = 1 + r.below(16);
      Bytes ins(len);
      for (auto &x : ins)
        x = static_cast<uint8_t>(r.next());
      b.insert(b.begin() + at, ins.begin(), ins.end());
      break;
    }
    case 5: { // delete a range
      if (b.empty())
        break;
      size_t at = r.below(b.size());
      size_t len = 1 + r.below(std::min<size_t>(b.size() - at, 64));
      b.erase(b.begin() + at, b.begin() + at + len);
      break;
    }
    case 6: { // copy a chunk inside the input
      if (b.size() < 2)
        break;
      size_t from = r.below(b.size()), to = r.below(b.size());
      size_t len = 1 + r.below(std::min<size_t>(
                           std::min(b.size() - from, b.size() - to), 32));
      std::memmove(&b[to], &b[from], len);
      break;
    }
    case 7: { // splice with another corpus input
      if (others.empty())
        break;
      const Bytes &o = r.pick(others);
      if (o.empty() || b.empty())
        break;
      size_t cut = r.below(b.size()), ocut = r.below(o.size());
      b.resize(cut);
      b.insert(b.end(), o.begin() + ocut, o.end());
      if (b.size() > maxLen)
        b.resize(maxLen);
      break;
    }
    case 8: // truncate
      if (!b.empty())
        b.resize(r.below(b.size()));
      break;
    case 9: { // overwrite a range with one byte value
      if (b.empty())
        break;
      size_t at = r.below(b.size());
      size_t len = 1 + r.below(std::min<size_t>(b.size() - at, 16));
      std::memset(&b[at], r.chance(50) ? 0 : 0xff, len);
      break;
    }
    }
  }
}

inline bool readFile(const std::string &path, Bytes &out) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return false;
  out.assign(std::istreambuf_iterator<char>(f),
             std::istreambuf_iterator<char>());
  return !f.bad();
}

inline bool writeFile(const std::string &path, const Bytes &b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char *>(b.data()),
          static_cast<std::streamsize>(b.size()));
  return static_cast<bool>(f);
}

/// Error message -> outcome signature: digits and quoted text removed, cut.
inline std::string signature(const std::string &msg) {
  std::string s;
  bool quote = false;
  for (char c : msg) {
    if (c == '\'') {
      quote = !quote;
      continue;
    }
    if (quote || (c >= '0' && c <= '9'))
      continue;
    s += c;
    if (s.size() >= 72)
      break;
  }
  return s;
}

// ---- crash capture ---------------------------------------------------------

inline bool sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#else
  return false;
#endif
}

/// One artifact per process, whichever path gets there first.
inline volatile sig_atomic_t &artifactWritten() {
  static volatile sig_atomic_t w = 0;
  return w;
}

struct CrashState {
  const uint8_t *data = nullptr;
  size_t size = 0;
  char crashPath[512] = {0};
  char timeoutPath[512] = {0};
  char oomPath[512] = {0};
  const char *note = ""; // extra text for the report (e.g. a trace dir)
};
inline CrashState &crashState() {
  static CrashState s;
  return s;
}

inline void writeArtifact(const char *path) {
  if (artifactWritten())
    return;
  artifactWritten() = 1;
  CrashState &s = crashState();
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    size_t done = 0;
    while (done < s.size) {
      ssize_t w = ::write(fd, s.data + done, s.size - done);
      if (w <= 0)
        break;
      done += static_cast<size_t>(w);
    }
    ::close(fd);
  }
  const char *m1 = "\nmapp-fuzz: input written to ";
  (void)!::write(2, m1, std::strlen(m1));
  (void)!::write(2, path, std::strlen(path));
  (void)!::write(2, "\n", 1);
  if (*s.note) {
    (void)!::write(2, s.note, std::strlen(s.note));
    (void)!::write(2, "\n", 1);
  }
}

inline void onFatal(int sig) {
  if (!artifactWritten()) {
    const char *m = "\nmapp-fuzz: CRASH (fatal signal)";
    (void)!::write(2, m, std::strlen(m));
    writeArtifact(crashState().crashPath);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

inline void onAlarm(int) {
  const char *m = "\nmapp-fuzz: TIMEOUT (one input ran past the watchdog)";
  (void)!::write(2, m, std::strlen(m));
  writeArtifact(crashState().timeoutPath);
  ::_exit(70);
}

#if defined(__SANITIZE_ADDRESS__)
// UBSan's fatal path does not run the death callback; with abort_on_error
// both sanitizers end in abort(), which onFatal turns into an artifact.
// (Defined here, not inline: each driver includes this header once.)
extern "C" __attribute__((used)) const char *__asan_default_options() {
  // A huge allocation returns null (the runtime reports "out of host
  // memory") instead of ending the run.
  return "abort_on_error=1:allocator_may_return_null=1";
}
extern "C" __attribute__((used)) const char *__ubsan_default_options() {
  return "abort_on_error=1:print_stacktrace=1";
}

inline void onSanitizerDeath() {
  const char *m = "\nmapp-fuzz: CRASH (sanitizer report above)";
  (void)!::write(2, m, std::strlen(m));
  writeArtifact(crashState().crashPath);
}
#endif

inline void installCrashHandlers(const std::string &prefix) {
  CrashState &s = crashState();
  std::snprintf(s.crashPath, sizeof s.crashPath, "%scrash-%d", prefix.c_str(),
                static_cast<int>(::getpid()));
  std::snprintf(s.timeoutPath, sizeof s.timeoutPath, "%stimeout-%d",
                prefix.c_str(), static_cast<int>(::getpid()));
  std::snprintf(s.oomPath, sizeof s.oomPath, "%soom-%d", prefix.c_str(),
                static_cast<int>(::getpid()));
  // Under ASan its own SEGV/BUS/FPE handlers report (then the death callback
  // writes the input); taking them over would lose the report.
  if (sanitized())
    std::signal(SIGABRT, onFatal);
  else
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL})
      std::signal(sig, onFatal);
  std::signal(SIGALRM, onAlarm);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_set_death_callback(onSanitizerDeath);
#endif
}

inline void setCurrentInput(const Bytes &b) {
  crashState().data = b.data();
  crashState().size = b.size();
}

// ---- command line and loop bookkeeping ------------------------------------

struct Options {
  double seconds = 10;
  uint64_t iters = 0; // 0 = until the time is up
  uint64_t seed = 1;
  unsigned watchdog = 30; // seconds per input
  size_t rssLimitMb = 2048; // the memory cap of the FuzzLoop.h drivers
  std::string artifactPrefix = "./";
  std::string writeSeeds; // FuzzLoop.h drivers: write the seeds here, too
  bool repro = false, quiet = false, exec = true;
  bool strict = false; // a non-Error exception also fails the run
  std::vector<std::string> inputs;
};

/// Parses the options every driver shares; unknown ones are returned.
inline Options parseCommon(int argc, char **argv, const char *usage) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n%s", a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--time")
        o.seconds = std::stod(val());
      else if (a == "--iters")
        o.iters = std::stoull(val());
      else if (a == "--seed")
        o.seed = std::stoull(val());
      else if (a == "--watchdog")
        o.watchdog = static_cast<unsigned>(std::stoul(val()));
      else if (a == "--rss-limit-mb")
        o.rssLimitMb = std::stoul(val());
      else if (a == "--write-seeds")
        o.writeSeeds = val();
      else if (a == "--artifact-prefix")
        o.artifactPrefix = val();
      else if (a == "--repro")
        o.repro = true;
      else if (a == "--no-exec")
        o.exec = false;
      else if (a == "--strict")
        o.strict = true;
      else if (a == "-q" || a == "--quiet")
        o.quiet = true;
      else if (a == "-h" || a == "--help") {
        std::fputs(usage, stdout);
        std::exit(0);
      } else if (!a.empty() && a[0] == '-') {
        std::fprintf(stderr, "unknown option '%s'\n%s", a.c_str(), usage);
        std::exit(2);
      } else
        o.inputs.push_back(a);
    } catch (const std::exception &) {
      std::fprintf(stderr, "bad value for %s\n%s", a.c_str(), usage);
      std::exit(2);
    }
  }
  return o;
}

struct Clock {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  }
};

/// Outcome signatures with their first message and count.
struct Outcomes {
  std::map<std::string, std::pair<std::string, uint64_t>> seen;
  /// True when `sig` was not seen before.
  bool add(const std::string &sig, const std::string &msg) {
    auto it = seen.find(sig);
    if (it != seen.end()) {
      ++it->second.second;
      return false;
    }
    seen[sig] = {msg, 1};
    return true;
  }
  void print(FILE *f, size_t top) const {
    std::vector<std::pair<uint64_t, std::string>> v;
    for (auto &[sig, p] : seen)
      v.push_back({p.second, p.first});
    std::sort(v.rbegin(), v.rend());
    for (size_t i = 0; i < v.size() && i < top; ++i)
      std::fprintf(f, "  %10llu  %.150s\n",
                   static_cast<unsigned long long>(v[i].first),
                   v[i].second.c_str());
  }
};

} // namespace mappfuzz

#endif // MAPP_FUZZ_COMMON_H
