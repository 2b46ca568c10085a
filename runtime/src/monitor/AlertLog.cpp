//===- AlertLog.cpp -------------------------------------------------------===//
#include "mapp/monitor/AlertLog.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>

using namespace mapp::monitor;

std::string mapp::monitor::alertJson(const Alert &a, int64_t atStep) {
  nlohmann::ordered_json j;
  j["step"] = a.step;
  j["kind"] = a.kind;
  if (a.rank >= 0)
    j["rank"] = a.rank;
  if (a.src >= 0) {
    j["src"] = a.src;
    j["dst"] = a.dst;
  }
  if (!a.of.empty())
    j["of"] = a.of;
  j["confidence"] = a.confidence;
  j["ratio"] = std::isfinite(a.ratio) ? a.ratio : 0.0;
  if (a.since >= 0)
    j["since"] = a.since;
  if (!a.cause.empty())
    j["cause"] = a.cause;
  nlohmann::ordered_json ev = nlohmann::ordered_json::object();
  for (auto &[k, v] : a.evidence)
    ev[k] = std::isfinite(v) ? v : 0.0;
  j["evidence"] = ev;
  if (!a.victims.empty())
    j["victims"] = a.victims;
  if (atStep >= 0)
    j["at_step"] = atStep;
  j["text"] = a.text;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::unique_ptr<AlertLog> AlertLog::open(const std::string &path,
                                         const std::string &tool,
                                         std::string *error, bool append) {
  if (path == "-")
    return std::unique_ptr<AlertLog>(new AlertLog(stdout, false, tool));
  std::FILE *f = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f) {
    if (error)
      *error = "cannot write '" + path + "' (" + std::strerror(errno) + ")";
    return nullptr;
  }
  return std::unique_ptr<AlertLog>(new AlertLog(f, true, tool));
}

AlertLog::~AlertLog() {
  if (own_)
    std::fclose(file_);
  else
    std::fflush(file_);
}

void AlertLog::write(const Alert &a, int64_t atStep) {
  std::string line = alertJson(a, atStep) + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
  ++written_;
  // One write, so rank threads' messages do not interleave mid-line.
  std::string msg = tool_ + ": step " + std::to_string(a.step) + ": " +
                    a.kind + (a.of.empty() ? "" : " from " + a.of) + ": " +
                    a.text + "\n";
  std::fwrite(msg.data(), 1, msg.size(), stderr);
  std::fflush(stderr);
}
