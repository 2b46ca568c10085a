//===- TraceFile.h - reading a rank's trace file back in tests -*- C++ -*-===//
//
// A rank-0 trace writer into a folder, the event lines of
// `DIR/rank-0.trace.jsonl` read back (header and footer lines left out),
// and the fields two runs of one plan must share per event, for comparing
// their traces as multisets.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TEST_RUNTIME_UNIT_TRACEFILE_H
#define MAPP_TEST_RUNTIME_UNIT_TRACEFILE_H

#include "mapp/trace/TraceWriter.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace mapp::rt::test {

/// A writer of rank 0's trace into `dir` (a failure to open fails the test).
inline std::unique_ptr<mapp::MappTraceWriter>
openTestTrace(const std::filesystem::path &dir, const std::string &device) {
  mapp::TraceHeader h;
  h.device = device;
  std::string err;
  auto writer = mapp::MappTraceWriter::open(dir.string(), h, &err);
  EXPECT_TRUE(writer) << err;
  return writer;
}

inline std::vector<nlohmann::json>
traceEvents(const std::filesystem::path &dir) {
  std::ifstream in(dir / "rank-0.trace.jsonl");
  std::vector<nlohmann::json> ev;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("type"))
      ev.push_back(j);
  }
  return ev;
}

/// step, name, category, microbatch, chunk, comm op.
using TraceKey = std::tuple<int, std::string, std::string, int, int, std::string>;

inline TraceKey traceKeyOf(const nlohmann::json &e) {
  return {e.value("step", -1), e["name"].get<std::string>(),
          e["cat"].get<std::string>(), e.value("mb", -1), e.value("chunk", -1),
          e.value("op", std::string())};
}

/// How often each key occurs (deferred records reach the file after the
/// host-timed ones of their step, so order is not compared).
inline std::map<TraceKey, int>
traceKeyCounts(const std::vector<nlohmann::json> &ev) {
  std::map<TraceKey, int> n;
  for (const nlohmann::json &e : ev)
    ++n[traceKeyOf(e)];
  return n;
}

} // namespace mapp::rt::test

#endif
