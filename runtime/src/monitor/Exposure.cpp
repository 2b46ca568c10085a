//===- Exposure.cpp - Communication no compute runs beside ----------------===//
#include "mapp/monitor/Exposure.h"

#include <algorithm>

using namespace mapp::monitor;

const char *mapp::monitor::commClassName(int c) {
  static const char *names[] = {"tp",    "dp",          "pp",
                                "ep",    "cp",          "other",
                                "p2p-forward", "p2p-backward", "p2p"};
  return c >= 0 && c < kCommClasses ? names[c] : "?";
}

CommClass mapp::monitor::commClassOfGroupKind(const std::string &kind) {
  if (kind == "tp")
    return CommTp;
  if (kind == "dp" || kind == "edp")
    return CommDp;
  if (kind == "pp")
    return CommPp;
  if (kind == "ep")
    return CommEp;
  if (kind == "cp")
    return CommCp;
  return CommOther;
}

CommClass mapp::monitor::p2pClass(int a, int b, int n) {
  if (a < 0 || b < 0 || n < 2)
    return CommP2p;
  if (b == a + 1)
    return CommP2pForward;
  if (b == a - 1)
    return CommP2pBackward;
  if (n > 2 && a == n - 1 && b == 0) // interleaved schedules wrap around
    return CommP2pForward;
  if (n > 2 && a == 0 && b == n - 1)
    return CommP2pBackward;
  return CommP2p;
}

uint32_t mapp::monitor::trackOf(const char *stream) {
  if (!stream || !*stream)
    return 0;
  uint32_t h = 2166136261u; // FNV-1a, never 0 for a named stream
  for (const char *p = stream; *p; ++p)
    h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
  return h ? h : 1;
}

std::vector<char>
mapp::monitor::regionsOf(const std::vector<ExposureEvent> &ev) {
  std::vector<char> region(ev.size(), 0);
  // By track, then outer before inner: by begin, the longer first.
  std::vector<size_t> idx(ev.size());
  for (size_t i = 0; i < ev.size(); ++i)
    idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const ExposureEvent &x = ev[a], &y = ev[b];
    if (x.track != y.track)
      return x.track < y.track;
    if (x.b != y.b)
      return x.b < y.b;
    if (x.e != y.e)
      return x.e > y.e;
    return a < b;
  });
  for (size_t k = 0; k < idx.size(); ++k) {
    const ExposureEvent &outer = ev[idx[k]];
    bool compute = outer.commClass < 0;
    for (size_t n = k + 1; n < idx.size() && ev[idx[n]].track == outer.track &&
                           ev[idx[n]].b < outer.e;
         ++n) {
      const ExposureEvent &inner = ev[idx[n]];
      if (inner.e > outer.e)
        continue; // overlaps, not inside
      if (compute || inner.commClass >= 0) {
        region[idx[k]] = 1;
        break;
      }
    }
  }
  return region;
}

std::vector<double>
mapp::monitor::exposedTimes(const std::vector<ExposureEvent> &ev) {
  std::vector<char> region = regionsOf(ev);
  // The union of the compute intervals, on every track.
  std::vector<std::pair<double, double>> busy;
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].commClass < 0 && !region[i] && ev[i].e > ev[i].b)
      busy.push_back({ev[i].b, ev[i].e});
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<double, double>> merged;
  for (auto [b, e] : busy) {
    if (!merged.empty() && b <= merged.back().second)
      merged.back().second = std::max(merged.back().second, e);
    else
      merged.push_back({b, e});
  }
  std::vector<double> out(ev.size(), -1.0);
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].commClass < 0 || region[i])
      continue;
    double b = ev[i].b, e = std::max(ev[i].b, ev[i].e), covered = 0;
    // First merged interval that ends after b.
    auto it = std::upper_bound(
        merged.begin(), merged.end(), b,
        [](double x, const std::pair<double, double> &m) { return x < m.second; });
    for (; it != merged.end() && it->first < e; ++it)
      covered += std::min(e, it->second) - std::max(b, it->first);
    out[i] = std::max(0.0, (e - b) - covered);
  }
  return out;
}
