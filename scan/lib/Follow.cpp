//===- Follow.cpp - mapp-scan --follow ------------------------------------===//
#include "mapp/scan/Follow.h"

#include "mapp/monitor/Summary.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/trace/TraceLine.h"
#include "mapp/trace/TraceWriter.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <dirent.h>
#include <memory>
#include <thread>

using namespace mapp::scan;
using mapp::monitor::StepSummary;
using mapp::TraceRecord;

namespace {

/// One rank file being tailed: complete lines only, the partial last line
/// kept until its newline arrives.
/// Files are opened per read (a 16,384-rank job has more files than a
/// process may hold open) and read a chunk at a time, so memory stays
/// bounded by the chunk per rank, not by the traces' size.
struct Tail {
  std::string path;
  long offset = 0;
  std::string partial;
  std::deque<std::string> pending; // complete lines not processed yet
  int line = 0;
  bool header = false, footer = false;
  int rank = -1;
  int64_t lastStep = -1; // steps below this were handed to the diagnoser
  mapp::monitor::Summarizer sum;
};

constexpr size_t kChunk = 1 << 20;

/// Reads what the file gained (up to a chunk); false with the message in
/// `why` on an open error (a FIFO named like a trace file is one: it would
/// block the read).
bool readMore(Tail &t, bool &grew, std::string &why) {
  bool notRegular = false;
  int fd = mapp::rt::openRegularFile(t.path, why, &notRegular);
  std::FILE *f = fd < 0 ? nullptr : ::fdopen(fd, "r");
  if (!f) {
    if (fd >= 0) {
      why = std::strerror(errno);
      ::close(fd);
    }
    why = mapp::rt::openFailure("", t.path, why, notRegular);
    return false;
  }
  std::fseek(f, t.offset, SEEK_SET);
  std::string buf(kChunk, '\0');
  size_t n = std::fread(&buf[0], 1, kChunk, f);
  std::fclose(f);
  if (!n)
    return true;
  grew = true;
  t.offset += static_cast<long>(n);
  t.partial.append(buf.data(), n);
  size_t start = 0, nl;
  while ((nl = t.partial.find('\n', start)) != std::string::npos) {
    t.pending.push_back(t.partial.substr(start, nl - start));
    start = nl + 1;
  }
  t.partial.erase(0, start);
  return true;
}

std::vector<std::string> rankFiles(const std::string &dir) {
  std::vector<std::string> out;
  if (DIR *d = opendir(dir.c_str())) {
    while (dirent *e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("rank-", 0) == 0 && n.size() > 17 &&
          n.compare(n.size() - 12, 12, ".trace.jsonl") == 0)
        out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  return out;
}

} // namespace

bool mapp::scan::follow(const FollowOptions &opts, FollowResult &out,
                        std::string *error) {
  using Clock = std::chrono::steady_clock;
  auto fail = [&](const std::string &m) {
    if (error)
      *error = m;
    return false;
  };
  DIR *probe = opendir(opts.dir.c_str());
  if (!probe)
    return fail("'" + opts.dir + "': not a readable directory");
  closedir(probe);
  std::unique_ptr<monitor::AlertLog> log;
  {
    std::string err;
    log = monitor::AlertLog::open(opts.alerts, "mapp-scan --follow", &err);
    if (!log)
      return fail("--alerts: " + err);
  }
  std::map<std::string, std::unique_ptr<Tail>> tails;
  std::unique_ptr<monitor::WindowDiagnoser> diag;
  int world = -1;
  auto lastGrowth = Clock::now();
  bool stalled = false;
  int64_t lastNext = -1;
  const double stallS = std::min(10.0, opts.idleTimeoutS / 2);
  using Type = trace::TraceLine::Type;
  auto handleLine = [&](Tail &t, const trace::TraceLine &rec,
                        const std::string &where) {
    if (rec.type == Type::Header) {
      const trace::HeaderLine &h = rec.header;
      t.header = true;
      t.rank = h.rank;
      if (world >= 0 && h.world != world)
        return fail(where + ": world " + std::to_string(h.world) +
                    " differs from the other files' " + std::to_string(world));
      world = h.world;
      if (!diag)
        diag = std::make_unique<monitor::WindowDiagnoser>(world,
                                                          opts.diagnosis);
      t.sum.setIdentity(t.rank, h.tp, h.dp, h.pp, h.host);
      t.sum.setLayout(h.tpSize, h.dpSize, h.ppSize);
      return true;
    }
    if (!t.header)
      return fail(where + ": no header line before it");
    if (rec.type == Type::Group) {
      t.sum.setGroupKind(rec.group.id, rec.group.kind, rec.group.members);
      return true;
    }
    if (rec.type == Type::Footer) {
      t.footer = true;
      for (int s : t.sum.openSteps())
        diag->add(t.sum.take(s));
      return true;
    }
    TraceRecord r = traceRecordOf(rec.event);
    monitor::SummaryEvent e = monitor::summaryEventOf(r);
    // Events come in step order per rank: a later step closes the earlier.
    if (e.step > t.lastStep + 1) {
      for (int s : t.sum.openSteps())
        if (s < e.step)
          diag->add(t.sum.take(s));
      t.lastStep = e.step - 1;
    }
    t.sum.add(e);
    return true;
  };
  for (;;) {
    bool grew = false;
    for (const std::string &p : rankFiles(opts.dir))
      if (!tails.count(p)) {
        auto t = std::make_unique<Tail>();
        t->path = p;
        tails[p] = std::move(t);
        grew = true;
      }
    for (bool progress = true; progress;) {
      progress = false;
      for (auto &[path, tp] : tails) {
        Tail &t = *tp;
        std::string why;
        if (t.pending.empty() && !t.footer && !readMore(t, grew, why))
          return fail(why);
        // A rank ahead of the others waits (its lines stay pending) so the
        // diagnoser's window holds every rank's step.
        while (!t.pending.empty()) {
          const std::string &l = t.pending.front();
          // Up to missingAfter steps ahead, so that a rank read later in the
          // pass is not taken for a missing one; once the pass is stalled
          // (a rank's file stopped growing) up to the window, so the
          // diagnoser names the rank that is behind.
          const int64_t limit =
              !diag ? INT64_MAX
                    : diag->nextStep() + (stalled ? diag->options().window - 1
                                                  : diag->options().missingAfter);
          std::string where = path + ":" + std::to_string(t.line + 1);
          // Complete lines only (a partly written last line waits in
          // `partial`): a line that does not decode is an error.
          trace::TraceLine rec;
          trace::LineError bad;
          if (!trace::decodeLine(l, {t.line + 1, false}, rec, bad))
            return fail(where + ": " + bad.message);
          int64_t step = rec.type == Type::Event ? rec.event.step : -1;
          if (rec.type == Type::Event && step >= limit) {
            // The earlier steps of this rank are complete: hand them over.
            for (int st : t.sum.openSteps())
              if (st < step)
                diag->add(t.sum.take(st));
            t.lastStep = std::max(t.lastStep, step - 1);
            break;
          }
          t.pending.pop_front();
          ++t.line;
          progress = true;
          if (!handleLine(t, rec, where))
            return false;
        }
      }
      if (diag)
        for (const monitor::Alert &a : diag->poll())
          log->write(a), progress = true;
    }
    if (diag) {
      out.peakMemoryBytes = std::max(out.peakMemoryBytes, diag->memoryBytes());
    }
    bool allEnded = world > 0 && static_cast<int>(tails.size()) == world;
    for (auto &[p, t] : tails)
      allEnded = allEnded && t->footer;
    if (grew || (diag && diag->nextStep() != lastNext)) {
      lastGrowth = Clock::now();
      stalled = false;
    }
    if (diag)
      lastNext = diag->nextStep();
    if (std::chrono::duration<double>(Clock::now() - lastGrowth).count() >=
        stallS)
      stalled = true;
    bool idle = std::chrono::duration<double>(Clock::now() - lastGrowth)
                    .count() >= opts.idleTimeoutS;
    if (allEnded || idle) {
      if (!diag)
        return fail("'" + opts.dir + "': no rank-*.trace.jsonl within " +
                    std::to_string(opts.idleTimeoutS) + " s");
      for (auto &[p, t] : tails) {
        if (!t->footer)
          out.unfinished.push_back(t->rank);
        for (int s : t->sum.openSteps()) // a cut-off file: what it has
          diag->add(t->sum.take(s));
      }
      for (const monitor::Alert &a : diag->finish())
        log->write(a);
      out.world = world;
      out.steps = diag->nextStep();
      out.alerts = log->written();
      out.complete = allEnded;
      out.peakMemoryBytes = std::max(out.peakMemoryBytes, diag->memoryBytes());
      out.exposure = monitor::exposureText(diag->exposure());
      return true;
    }
    if (!grew)
      std::this_thread::sleep_for(std::chrono::duration<double>(opts.pollS));
  }
}
