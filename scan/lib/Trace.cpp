//===- Trace.cpp - Trace reader and event matching ------------------------===//

#include "mapp/scan/Trace.h"
#include "mapp/rt/RegularFile.h"

#include <algorithm>
#include <cstdint>
#include <dirent.h>
#include <fstream>
#include <regex>
#include <sstream>
#include <sys/stat.h>

using namespace mapp::scan;

std::string Trace::rankLabel(int r) const {
  const Header &h = ranks[r].hdr;
  return "DP" + std::to_string(h.dp) + "-PP" + std::to_string(h.pp) + "-TP" +
         std::to_string(h.tp);
}

std::string Trace::eventRef(int r, const Event &e) const {
  return std::to_string(r) + ":" + std::to_string(e.id);
}

namespace {
struct LineError {
  std::string msg;
};

/// "... rank R, the header's: this file holds another rank's events".
std::string notThisRank(int rank, const std::string &what) {
  return what + " rank " + std::to_string(rank) +
         ", the header's: this file holds events of another rank (a header "
         "swapped or a file renamed?)";
}

} // namespace

bool mapp::scan::readRankFile(const std::string &path, const ReadOptions &opts,
                              RankTrace &out, std::string *error) {
  std::string text, why;
  bool notRegular = false;
  if (!rt::readRegularFile(path, text, why, &notRegular)) {
    *error = notRegular ? rt::openFailure("", path, why, true)
                        : path + ": cannot open file (" + why + ")";
    return false;
  }
  out.path = path;
  bool haveHeader = false;
  std::map<std::string, int> inlineGroups;
  size_t pos = 0;
  int lineNo = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    bool lastUnterminated = nl == std::string::npos;
    std::string line =
        text.substr(pos, lastUnterminated ? std::string::npos : nl - pos);
    pos = lastUnterminated ? text.size() : nl + 1;
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    auto fail = [&](const std::string &msg) {
      *error = path + ":" + std::to_string(lineNo) + ": " + msg;
      return false;
    };
    mapp::trace::TraceLine rec;
    mapp::trace::LineError bad;
    if (!mapp::trace::decodeLine(line, {lineNo, lastUnterminated}, rec, bad)) {
      if (bad.notJson && lastUnterminated && opts.allowTruncated && haveHeader)
        break; // a crash cut the last record: keep what came before
      return fail(bad.message);
    }
    using Type = mapp::trace::TraceLine::Type;
    try {
      if (!haveHeader) {
        if (rec.type != Type::Header)
          throw LineError{"first record must be the header "
                          "({\"type\":\"header\",...})"};
        out.hdr = rec.header;
        haveHeader = true;
      } else if (rec.type == Type::Header) {
        throw LineError{"second header record"};
      } else if (rec.type == Type::Group) {
        int id = rec.group.id;
        Group g{rec.group.kind, rec.group.members};
        for (int m : g.members)
          if (m < 0 || m >= out.hdr.world)
            throw LineError{"group member " + std::to_string(m) +
                            " outside world size " +
                            std::to_string(out.hdr.world)};
        if (std::find(g.members.begin(), g.members.end(), out.hdr.rank) ==
            g.members.end())
          throw LineError{notThisRank(out.hdr.rank, "group " +
                                                        std::to_string(id) +
                                                        " (" + g.kind + ")" +
                                                        " does not contain")};
        out.groups[id] = g;
      } else if (rec.type == Type::Footer) {
        out.dropped = rec.footer.dropped;
        out.hasFooter = true;
      } else {
        Event e;
        static_cast<mapp::trace::EventLine &>(e) = std::move(rec.event);
        e.line = lineNo;
        // Two clocks read back to back: CPU time can pass the span by a
        // reading's cost, never more than the span means anything.
        e.cpu = std::min<int64_t>(e.cpu, e.e - e.b);
        if (e.peer >= out.hdr.world)
          throw LineError{"peer " + std::to_string(e.peer) +
                          " outside world size " +
                          std::to_string(out.hdr.world)};
        if (e.peer == out.hdr.rank)
          throw LineError{notThisRank(out.hdr.rank,
                                      std::string(opName(e.op)) +
                                          " with itself as peer: not")};
        if (!rec.inlineGroup.kind.empty()) {
          Group g{rec.inlineGroup.kind, rec.inlineGroup.members};
          if (std::find(g.members.begin(), g.members.end(), out.hdr.rank) ==
              g.members.end())
            throw LineError{notThisRank(out.hdr.rank,
                                        "inline group (" + g.kind +
                                            ") does not contain")};
          std::string key = g.kind;
          for (int m : g.members)
            key += "," + std::to_string(m);
          auto it = inlineGroups.find(key);
          if (it == inlineGroups.end()) {
            int id = -2 - (int)inlineGroups.size();
            it = inlineGroups.emplace(key, id).first;
            out.groups[id] = g;
          }
          e.group = it->second;
        }
        out.events.push_back(std::move(e));
      }
    } catch (const LineError &le) {
      return fail(le.msg);
    }
  }
  if (!haveHeader) {
    *error = path + ":1: empty trace file (no header record)";
    return false;
  }
  for (const Event &e : out.events)
    if (e.group != -1 && !out.groups.count(e.group)) {
      *error = path + ":" + std::to_string(e.line) + ": group " +
               std::to_string(e.group) + " is not declared by a group record";
      return false;
    }
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const Event &a, const Event &b) {
                     return a.b != b.b ? a.b < b.b : a.id < b.id;
                   });
  return true;
}

bool mapp::scan::readTraceDir(const std::string &dir, const ReadOptions &opts,
                              Trace &out, std::string *error) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = dir + ": trace directory does not exist";
    return false;
  }
  DIR *d = opendir(dir.c_str());
  if (!d) {
    *error = dir + ": cannot read directory";
    return false;
  }
  std::regex re("rank-([0-9]+)\\.trace\\.jsonl");
  std::map<int, std::string> files;
  while (dirent *ent = readdir(d)) {
    std::smatch m;
    std::string name = ent->d_name;
    if (!std::regex_match(name, m, re))
      continue;
    // No world holds a rank that does not fit an int (std::stoi would throw).
    std::string num = m[1];
    if (num.size() > 9) {
      *error = dir + "/" + name + ": rank number out of range";
      closedir(d);
      return false;
    }
    int r = std::stoi(num);
    // Before the header pass below opens it: a FIFO would block it forever.
    bool notRegular = false;
    std::string why = rt::whyNotRegularFile(dir + "/" + name, &notRegular);
    if (notRegular) {
      *error = rt::openFailure("", dir + "/" + name, why, true);
      closedir(d);
      return false;
    }
    auto [it, fresh] = files.emplace(r, dir + "/" + name);
    if (!fresh) {
      *error = dir + "/" + name + " and " + it->second + " both name rank " +
               std::to_string(r);
      closedir(d);
      return false;
    }
  }
  closedir(d);
  if (files.empty()) {
    *error = dir + ": no rank-*.trace.jsonl files";
    return false;
  }
  // Headers first, so a rank from another job is reported as such rather
  // than as whatever it contains that this world cannot hold.
  Header first;
  std::string firstPath;
  std::map<std::string, std::vector<std::string>> byRun; // "run_id plan"
  for (auto &[r, path] : files) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    mapp::trace::TraceLine rec;
    mapp::trace::LineError bad;
    if (!mapp::trace::decodeLine(line, {1, false}, rec, bad) ||
        rec.type != mapp::trace::TraceLine::Type::Header)
      continue; // the full parse below reports it
    const Header &h = rec.header;
    std::string base = path.substr(path.rfind('/') + 1);
    byRun[h.runId.empty() ? std::string("(none)")
                          : "'" + h.runId + "' (plan " +
                                (h.plan.empty() ? "-" : h.plan) + ")"]
        .push_back(base);
    if (firstPath.empty()) {
      first = h;
      firstPath = path;
    } else if (h.world != first.world || h.tpSize != first.tpSize ||
               h.ppSize != first.ppSize || h.dpSize != first.dpSize) {
      *error = path + ":1: world size " + std::to_string(h.world) + " (tp " +
               std::to_string(h.tpSize) + ", pp " + std::to_string(h.ppSize) +
               ", dp " + std::to_string(h.dpSize) + ") is inconsistent with " +
               firstPath + " (world " + std::to_string(first.world) + ")";
      return false;
    }
  }
  if (byRun.size() > 1) {
    std::string msg = dir + ": traces of different runs cannot be merged:";
    // The majority first: the odd files out come last.
    std::vector<std::pair<std::string, std::vector<std::string>>> runs(
        byRun.begin(), byRun.end());
    std::stable_sort(runs.begin(), runs.end(), [](auto &x, auto &y) {
      return x.second.size() > y.second.size();
    });
    for (auto &[run, names] : runs) {
      msg += " run_id " + run + " in ";
      for (size_t i = 0; i < names.size(); ++i)
        msg += (i ? ", " : "") + names[i];
      msg += ";";
    }
    msg.back() = '.';
    *error = msg + " Keep one run's files in one directory.";
    return false;
  }
  std::vector<RankTrace> ranks;
  for (auto &[r, path] : files) {
    RankTrace rt;
    if (!readRankFile(path, opts, rt, error))
      return false;
    if (rt.hdr.rank != r) {
      *error = path + ":1: header says rank " + std::to_string(rt.hdr.rank) +
               " but the file name says rank " + std::to_string(r);
      return false;
    }
    ranks.push_back(std::move(rt));
  }
  const Header &h0 = ranks.front().hdr;
  for (const RankTrace &rt : ranks) {
    const Header &h = rt.hdr;
    if (h.world != h0.world || h.tpSize != h0.tpSize || h.ppSize != h0.ppSize ||
        h.dpSize != h0.dpSize) {
      *error = rt.path + ":1: world size " + std::to_string(h.world) + " (tp " +
               std::to_string(h.tpSize) + ", pp " + std::to_string(h.ppSize) +
               ", dp " + std::to_string(h.dpSize) + ") is inconsistent with " +
               ranks.front().path + " (world " + std::to_string(h0.world) + ")";
      return false;
    }
  }
  out.world = h0.world;
  out.tp = h0.tpSize;
  out.pp = h0.ppSize;
  out.dp = h0.dpSize;
  for (int r = 0; r < out.world; ++r)
    if (!files.count(r)) {
      *error = dir + "/rank-" + std::to_string(r) +
               ".trace.jsonl: missing (world size is " +
               std::to_string(out.world) + ")";
      return false;
    }
  out.ranks = std::move(ranks);
  for (RankTrace &rt : out.ranks) {
    const Header &h = rt.hdr;
    // Coordinates inside the sizes keep the product below world (no overflow).
    bool inside = h.tp >= 0 && h.tp < h.tpSize && h.dp >= 0 &&
                  h.dp < h.dpSize && h.pp >= 0 && h.pp < h.ppSize;
    int64_t expect =
        inside ? h.tp + int64_t(h.tpSize) * (h.dp + int64_t(h.dpSize) * h.pp)
               : -1;
    if (expect != h.rank)
      out.warnings.push_back(
          rt.path + ": coordinates (dp " + std::to_string(h.dp) + ", pp " +
          std::to_string(h.pp) + ", tp " + std::to_string(h.tp) +
          ") are not in Megatron order for rank " + std::to_string(h.rank));
    if (rt.dropped)
      out.warnings.push_back(rt.path + ": recorder dropped " +
                             std::to_string(rt.dropped) + " events");

  }
  return true;
}

Matches mapp::scan::matchEvents(const Trace &t) {
  Matches m;
  using Key = std::tuple<int, int, int64_t>;
  std::map<Key, std::vector<size_t>> sends, recvs;
  std::map<std::string, CollInstance> colls;
  for (int r = 0; r < t.world; ++r) {
    const RankTrace &rt = t.ranks[r];
    for (size_t i = 0; i < rt.events.size(); ++i) {
      const Event &e = rt.events[i];
      if (e.op == Op::Send)
        sends[{r, e.peer, e.tag}].push_back(i);
      else if (e.op == Op::Recv)
        recvs[{e.peer, r, e.tag}].push_back(i);
      else if (isCollective(e.op)) {
        const Group &g = rt.groups.at(e.group);
        std::vector<int> mem = g.members;
        std::sort(mem.begin(), mem.end());
        std::string key = g.kind + "|" + std::to_string(e.seq);
        for (int x : mem)
          key += "," + std::to_string(x);
        CollInstance &ci = colls[key];
        ci.kind = g.kind;
        ci.members = mem;
        ci.seq = e.seq;
        ci.events.push_back({r, i});
      }
    }
  }
  for (auto &[k, sv] : sends) {
    auto it = recvs.find(k);
    size_t n = it == recvs.end() ? 0 : it->second.size();
    size_t both = std::min(sv.size(), n);
    for (size_t i = 0; i < both; ++i)
      m.p2p.push_back({std::get<0>(k), std::get<1>(k), sv[i], it->second[i]});
    m.unmatchedSends += sv.size() - both;
    if (it != recvs.end())
      m.unmatchedRecvs += n - both;
  }
  for (auto &[k, rv] : recvs)
    if (!sends.count(k))
      m.unmatchedRecvs += rv.size();
  for (auto &[k, ci] : colls) {
    std::vector<int> got;
    for (auto &p : ci.events)
      got.push_back(p.first);
    std::sort(got.begin(), got.end());
    if (got == ci.members)
      m.colls.push_back(std::move(ci));
    else
      ++m.incompleteColls;
  }
  return m;
}

bool mapp::scan::parseIndexList(const std::string &s, std::set<int> &out) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t dash = item.find('-');
      size_t used;
      if (dash == std::string::npos) {
        out.insert(std::stoi(item, &used));
        if (used != item.size())
          return false;
      } else {
        int a = std::stoi(item.substr(0, dash)),
            b = std::stoi(item.substr(dash + 1));
        if (a > b || a < 0)
          return false;
        for (int r = a; r <= b; ++r)
          out.insert(r);
      }
    } catch (const std::exception &) {
      return false;
    }
  }
  return !out.empty();
}
