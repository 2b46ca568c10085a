//===- AllToAllLoad.cpp ---------------------------------------------------===//
#include "mapp/scan/AllToAllLoad.h"

#include <algorithm>
#include <map>

using namespace mapp::scan;

namespace {
double maxOverMean(const std::vector<uint64_t> &v) {
  if (v.empty())
    return 1;
  double sum = 0, mx = 0;
  for (uint64_t b : v) {
    sum += double(b);
    mx = std::max(mx, double(b));
  }
  return sum > 0 ? mx / (sum / double(v.size())) : 1;
}
} // namespace

std::vector<AllToAllLoad> mapp::scan::allToAllLoads(const Trace &t) {
  std::vector<AllToAllLoad> out;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::map<std::string, AllToAllLoad> byName;
    for (const Event &e : t.ranks[r].events) {
      if (e.op != Op::AllToAll || e.recvBytes.empty())
        continue;
      AllToAllLoad &l = byName[e.name];
      if (l.events == 0) {
        l.rank = static_cast<int>(r);
        l.name = e.name;
        l.sendBytes.assign(e.sendBytes.size(), 0);
        l.recvBytes.assign(e.recvBytes.size(), 0);
        auto g = t.ranks[r].groups.find(e.group);
        if (g != t.ranks[r].groups.end() &&
            g->second.members.size() == e.recvBytes.size())
          l.members = g->second.members;
      }
      if (l.recvBytes.size() != e.recvBytes.size())
        continue; // another group under the same name: first one kept
      ++l.events;
      for (size_t i = 0; i < e.recvBytes.size(); ++i) {
        l.sendBytes[i] += e.sendBytes[i];
        l.recvBytes[i] += e.recvBytes[i];
      }
    }
    for (auto &[name, l] : byName) {
      l.recvImbalance = maxOverMean(l.recvBytes);
      l.sendImbalance = maxOverMean(l.sendBytes);
      out.push_back(std::move(l));
    }
  }
  return out;
}
