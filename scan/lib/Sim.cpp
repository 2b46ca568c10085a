//===- Sim.cpp - Discrete-event engine and trace output -------------------===//

#include "mapp/scan/Sim.h"
#include "mapp/trace/TraceWriter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <set>

using namespace mapp::scan;

static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double mapp::scan::hashUniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = splitmix(splitmix(splitmix(seed) ^ a) ^ (b * 0x51ed27u));
  return ((h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double mapp::scan::hashNormal(uint64_t seed, uint64_t a, uint64_t b) {
  double u1 = hashUniform(seed, a, 2 * b), u2 = hashUniform(seed, a, 2 * b + 1);
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

const std::string &SimJob::streamOf(size_t program) const {
  static const std::string first;
  return program < static_cast<size_t>(world) ? first
                                              : streamName[program - world];
}

std::vector<size_t> SimJob::programsOf(int r) const {
  std::vector<size_t> p{static_cast<size_t>(r)};
  for (size_t k = 0; k < streamOwner.size(); ++k)
    if (streamOwner[k] == r)
      p.push_back(world + k);
  return p;
}

std::vector<std::pair<size_t, size_t>> SimJob::opsOf(int r) const {
  std::vector<std::pair<size_t, size_t>> ops;
  for (size_t p : programsOf(r))
    for (size_t i = 0; i < programs[p].size(); ++i)
      ops.push_back({p, i});
  return ops;
}

bool mapp::scan::runSim(const SimJob &job, const SimNetwork &net, SimTimes &out,
                        std::string *error) {
  int R = static_cast<int>(job.programs.size()); // ranks and their streams
  out.ops.assign(R, {});
  out.recvs.assign(R, {});
  for (int r = 0; r < R; ++r)
    out.ops[r].resize(job.programs[r].size());
  std::vector<size_t> pc(R, 0);
  std::vector<double> now(R, 0.0);
  std::vector<char> arrived(R, 0); // waiting inside a collective
  struct Msg {
    double sent, arrival;
  };
  std::map<std::tuple<int, int, int64_t>, std::deque<Msg>> inflight;
  std::map<std::pair<int, int>, double> linkFree;
  struct CollState {
    std::vector<double> arrivals;
    size_t count = 0;
    double end = -1;
  };
  std::map<std::pair<int, int64_t>, CollState> colls;

  size_t remaining = 0;
  for (auto &p : job.programs)
    remaining += p.size();
  while (remaining) {
    bool progress = false;
    for (int r = 0; r < R; ++r) {
      const auto &prog = job.programs[r];
      while (pc[r] < prog.size()) {
        const SimOp &op = prog[pc[r]];
        double start = now[r] + op.gapNs;
        double end;
        if (op.kind == SimOp::Compute) {
          end = start + op.durNs;
        } else if (op.kind == SimOp::Send) {
          double &free = linkFree[{r, op.peer}];
          double xfer = op.streamSync ? 0
                        : op.xferNs >= 0
                            ? op.xferNs
                            : net.p2p(r, op.peer, op.bytes);
          if (op.async) {
            double latency = op.xferNs >= 0 ? 0 : net.p2p(r, op.peer, 0);
            inflight[{r, op.peer, op.tag}].push_back(
                {start, postAsyncSend(start, free, xfer, latency)});
            end = start;
          } else {
            end = std::max(start, free) + xfer;
            free = end;
            inflight[{r, op.peer, op.tag}].push_back({start, end});
          }
        } else if (op.kind == SimOp::Recv) {
          auto it = inflight.find({op.peer, r, op.tag});
          if (it == inflight.end() || it->second.empty())
            break;
          const Msg &m = it->second.front();
          end = std::max(start, m.arrival);
          out.recvs[r].push_back({pc[r], m.sent, m.arrival});
          it->second.pop_front();
        } else {
          const SimGroup &g = job.groups[op.group];
          CollState &cs = colls[{op.group, op.seq}];
          if (cs.arrivals.empty())
            cs.arrivals.assign(g.members.size(), -1);
          if (!arrived[r]) {
            size_t idx =
                std::lower_bound(g.members.begin(), g.members.end(), r) -
                g.members.begin();
            cs.arrivals[idx] = start;
            arrived[r] = 1;
            if (++cs.count == g.members.size()) {
              double last =
                  *std::max_element(cs.arrivals.begin(), cs.arrivals.end());
              cs.end = last + (op.xferNs >= 0 ? op.xferNs
                                              : net.coll(g, op.op, op.bytes));
            }
            progress = true;
          }
          if (cs.end < 0)
            break;
          arrived[r] = 0;
          end = cs.end + op.exitSkewNs;
        }
        out.ops[r][pc[r]] = {start, end};
        now[r] = end;
        ++pc[r];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::string msg = "simulation deadlocked; blocked ranks:";
      int shown = 0;
      for (int r = 0; r < R && shown < 8; ++r)
        if (pc[r] < job.programs[r].size()) {
          const SimOp &op = job.programs[r][pc[r]];
          msg +=
              "\n  rank " + std::to_string(job.ownerOf(r)) +
              (job.streamOf(r).empty() ? "" : " stream " + job.streamOf(r)) +
              " at op " +
              std::to_string(pc[r]) + " '" + op.name + "' (" +
              (op.kind == SimOp::Recv ? "recv from " + std::to_string(op.peer) +
                                            " tag " + std::to_string(op.tag)
                                      : std::string(opName(op.op)) + " seq " +
                                            std::to_string(op.seq)) +
              ")";
          ++shown;
        }
      *error = msg;
      return false;
    }
  }
  return true;
}

std::vector<double> mapp::scan::stepTimesNs(const SimJob &job,
                                            const SimTimes &times) {
  std::map<int, double> lastEnd;
  double first = 1e300;
  for (size_t r = 0; r < job.programs.size(); ++r)
    for (size_t i = 0; i < job.programs[r].size(); ++i) {
      const SimOp &op = job.programs[r][i];
      first = std::min(first, times.ops[r][i].first);
      double &le = lastEnd[op.step];
      le = std::max(le, times.ops[r][i].second);
    }
  std::vector<double> out;
  double prev = first;
  for (auto &[s, e] : lastEnd) {
    if (s < 0)
      continue;
    out.push_back(e - prev);
    prev = e;
  }
  return out;
}

std::vector<SimClock> mapp::scan::makeClocks(const SimConfig &c) {
  int R = c.tp * c.pp * c.dp;
  std::vector<SimClock> out(R);
  int gpn = c.gpusPerNode > 0 ? c.gpusPerNode : c.tp;
  for (int r = 0; r < R; ++r) {
    // Monotonic clocks of different hosts share no epoch: a large base plus
    // a random spread; drift and the wall clock's NTP error are uniform.
    // The ranks of one node read that node's clock.
    int node = r / gpn;
    double u1 = hashUniform(c.seed, 0xC10C, node);
    double u2 = hashUniform(c.seed, 0xD21F, node);
    double u3 = hashUniform(c.seed, 0xAA11, node);
    out[r].offsetNs = 1e11 + c.clockOffsetMs * 1e6 * u1;
    out[r].driftPpm = c.clockDriftPpm * (2 * u2 - 1);
    out[r].wallErrorNs = c.wallErrorMs * 1e6 * (2 * u3 - 1);
  }
  return out;
}

nlohmann::json mapp::scan::simExposureTruth(const SimJob &job,
                                            const SimTimes &times) {
  namespace mon = mapp::monitor;
  std::set<int> steps;
  for (const auto &prog : job.programs)
    for (const SimOp &op : prog)
      if (op.step >= 0)
        steps.insert(op.step);
  double n = std::max<size_t>(1, steps.size());
  int stage = std::max(1, job.tp * job.dp);
  nlohmann::json ranks = nlohmann::json::array();
  double sumExposed = 0, sumComm = 0;
  for (int r = 0; r < job.world; ++r) {
    // The engine's true times of every op of the rank, on all its streams.
    std::vector<mon::ExposureEvent> ev;
    std::vector<int> stepOf;
    for (size_t p : job.programsOf(r))
      for (size_t i = 0; i < job.programs[p].size(); ++i) {
        const SimOp &op = job.programs[p][i];
        if (op.streamSync)
          continue;
        mon::ExposureEvent x;
        x.b = times.ops[p][i].first;
        x.e = times.ops[p][i].second;
        x.track = mon::trackOf(job.streamOf(p).c_str());
        if (op.kind == SimOp::Coll)
          x.commClass = mon::commClassOfGroupKind(job.groups[op.group].kind);
        else if ((op.kind == SimOp::Send || op.kind == SimOp::Recv) &&
                 op.group >= 0) // a transfer inside a group (the cp ring)
          x.commClass = mon::commClassOfGroupKind(job.groups[op.group].kind);
        else if (op.kind == SimOp::Send || op.kind == SimOp::Recv) {
          int peer = job.ownerOf(op.peer);
          int a = op.kind == SimOp::Send ? r : peer;
          int b = op.kind == SimOp::Send ? peer : r;
          x.commClass = mon::p2pClass(a / stage, b / stage, job.pp);
        }
        ev.push_back(x);
        stepOf.push_back(op.step);
      }
    std::vector<double> exposed = mon::exposedTimes(ev);
    double cls[mon::kCommClasses] = {}, comm[mon::kCommClasses] = {};
    for (size_t i = 0; i < ev.size(); ++i) {
      if (exposed[i] < 0 || stepOf[i] < 0)
        continue;
      cls[ev[i].commClass] += exposed[i];
      comm[ev[i].commClass] += ev[i].e - ev[i].b;
    }
    nlohmann::json classes = nlohmann::json::object();
    double rankExposed = 0, rankComm = 0;
    for (int c = 0; c < mon::kCommClasses; ++c) {
      if (comm[c] <= 0)
        continue;
      classes[mon::commClassName(c)] = {
          {"exposed_ms_per_step", cls[c] / n * 1e-6},
          {"comm_ms_per_step", comm[c] / n * 1e-6}};
      rankExposed += cls[c];
      rankComm += comm[c];
    }
    ranks.push_back({{"rank", r},
                     {"exposed_ms_per_step", rankExposed / n * 1e-6},
                     {"comm_ms_per_step", rankComm / n * 1e-6},
                     {"classes", classes}});
    sumExposed += rankExposed;
    sumComm += rankComm;
  }
  double world = std::max(1, job.world);
  return {{"steps", steps.size()},
          {"exposed_ms_per_step", sumExposed / world / n * 1e-6},
          {"comm_ms_per_step", sumComm / world / n * 1e-6},
          {"ranks", ranks}};
}

bool mapp::scan::writeSimTraces(const std::string &dir, const SimConfig &c,
                                const SimJob &job, const SimTimes &times,
                                std::string *error) {
  std::vector<SimClock> clocks = makeClocks(c);
  const double wall0 = 1.7e18; // a fixed, plausible epoch time
  // One run id per simulated job, a function of what was simulated (config,
  // faults, seed all show in the times), so reruns are byte-identical.
  uint64_t id = 1469598103934665603ull;
  for (const auto &rank : times.ops)
    for (const auto &[b, e] : rank)
      for (double v : {b, e})
        id = (id ^ static_cast<uint64_t>(std::llround(v))) * 1099511628211ull;
  char runId[32];
  std::snprintf(runId, sizeof runId, "sim-%016llx", (unsigned long long)id);
  auto clockOf = [&](int r, double t) {
    const SimClock &k = clocks[r];
    return (uint64_t)std::llround(k.offsetNs + (1 + k.driftPpm * 1e-6) * t);
  };
  for (int r = 0; r < job.world; ++r) {
    auto local = [&](double t) { return clockOf(r, t); };
    const SimClock &k = clocks[r];
    std::map<size_t, size_t> nextStamp; // program -> its next recv stamp
    mapp::TraceHeader h;
    h.rank = r;
    h.world = job.world;
    h.tp = r % c.tp;
    h.dp = (r / c.tp) % c.dp;
    h.pp = r / (c.tp * c.dp);
    h.tpSize = c.tp;
    h.dpSize = c.dp;
    h.ppSize = c.pp;
    int gpn = c.gpusPerNode > 0 ? c.gpusPerNode : c.tp;
    h.host = "sim-node" + std::to_string(r / gpn);
    h.device = "sim:" + std::to_string(r % gpn);
    h.monoStartNs = local(0);
    h.wallStartNs = (uint64_t)(wall0 + k.wallErrorNs);
    h.runId = runId;
    // In time order over the rank's streams, as a recorder appends them
    // (mapp-scan --follow takes a later step's event as the end of a step).
    std::vector<std::pair<size_t, size_t>> ops = job.opsOf(r);
    std::stable_sort(ops.begin(), ops.end(), [&](auto x, auto y) {
      return times.ops[x.first][x.second].first <
             times.ops[y.first][y.second].first;
    });
    auto w = mapp::MappTraceWriter::open(dir, h, error, ops.size() + 64);
    if (!w)
      return false;
    w->setBlockWhenFull(true);
    std::map<int, int> localGroup;
    for (auto [p, i] : ops) { // every stream of the rank
      const SimOp &op = job.programs[p][i];
      if (op.streamSync)
        continue; // a wait between the rank's streams, not an event
      mapp::TraceRecord rec;
      rec.setName(op.name.c_str());
      if (!job.streamOf(p).empty())
        rec.setStream(job.streamOf(p).c_str());
      rec.cat = (mapp::TraceCategory)op.cat;
      rec.op = (mapp::TraceOp)op.op;
      rec.phase = op.phase;
      rec.step = op.step;
      rec.microbatch = op.mb;
      rec.layer = op.layer;
      rec.chunk = op.chunk;
      rec.bytes = op.bytes;
      if (op.kind == SimOp::Send || op.kind == SimOp::Recv) {
        rec.peer = job.ownerOf(op.peer);
        rec.tag = op.tag;
      }
      if (op.kind == SimOp::Coll) {
        auto it = localGroup.find(op.group);
        if (it == localGroup.end()) {
          std::vector<int> members; // ranks, not their streams' programs
          for (int m : job.groups[op.group].members)
            members.push_back(job.ownerOf(m));
          it = localGroup
                   .emplace(op.group,
                            w->registerGroup(job.groups[op.group].kind,
                                             members))
                   .first;
        }
        rec.group = it->second;
        rec.seq = op.seq;
        if (op.peerBytes >= 0)
          rec.peerBytes = w->storePeerBytes(job.peerBytes[op.peerBytes].send,
                                            job.peerBytes[op.peerBytes].recv);
      }
      rec.beginNs = local(times.ops[p][i].first);
      rec.endNs = local(times.ops[p][i].second);
      // What the runtime's receives carry: the send call on the sender's
      // clock, the payload's arrival on this rank's.
      if (op.kind == SimOp::Recv && p < times.recvs.size()) {
        const std::vector<SimRecvStamp> &stamps = times.recvs[p];
        size_t &k = nextStamp[p];
        while (k < stamps.size() && stamps[k].op < i)
          ++k; // the stream waits skipped above
        if (k < stamps.size() && stamps[k].op == i) {
          rec.sentNs = clockOf(job.ownerOf(op.peer), stamps[k].sentNs);
          rec.arrivedNs = local(stamps[k].arrivedNs);
        }
      }
      w->append(rec);
    }
    w->close();
  }
  nlohmann::json truth;
  truth["world"] = job.world;
  for (int r = 0; r < job.world; ++r)
    truth["clocks"].push_back({{"rank", r},
                               {"offset_ns", clocks[r].offsetNs},
                               {"drift_ppm", clocks[r].driftPpm},
                               {"wall_error_ns", clocks[r].wallErrorNs}});
  truth["faults"] = nlohmann::json::array();
  for (const Fault &f : c.faults)
    truth["faults"].push_back(f.text);
  std::vector<double> st = stepTimesNs(job, times);
  double sum = 0;
  for (double s : st) {
    truth["step_ms"].push_back(s * 1e-6);
    sum += s;
  }
  truth["mean_step_ms"] = st.empty() ? 0.0 : sum / st.size() * 1e-6;
  truth["exposed_comm"] = simExposureTruth(job, times);
  if (!job.peakBytes.empty())
    truth["peak_bytes"] = job.peakBytes;
  std::ofstream out(dir + "/sim-truth.json");
  out << truth.dump(1) << "\n";
  if (!out) {
    *error = dir + "/sim-truth.json: cannot write";
    return false;
  }
  return true;
}
