//===- FaultComm.cpp - injected slow links and slow ranks -----------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Faults.h"

#include <cmath>

#include <chrono>
#include <map>
#include <thread>

using namespace mapp::rt;

Injection mapp::rt::parseInjection(const std::string &spec) {
  size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  Injection in;
  if (kind == "slow-compute")
    in.kind = Injection::SlowCompute;
  else if (kind == "link-delay")
    in.kind = Injection::LinkDelay;
  else if (kind == "link-bandwidth")
    in.kind = Injection::LinkBandwidth;
  else
    fail("--inject '", spec,
         "': unknown fault (slow-compute, link-delay, link-bandwidth)");
  std::map<std::string, std::string> kv;
  if (colon != std::string::npos) {
    std::string rest = spec.substr(colon + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
      size_t comma = rest.find(',', pos);
      std::string item = rest.substr(
          pos, comma == std::string::npos ? std::string::npos : comma - pos);
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        fail("--inject '", spec, "': expected key=value, got '", item, "'");
      kv[item.substr(0, eq)] = item.substr(eq + 1);
      if (comma == std::string::npos)
        break;
      pos = comma + 1;
    }
  }
  auto num = [&](const char *key, double lo, bool integer) {
    auto it = kv.find(key);
    if (it == kv.end())
      fail("--inject '", spec, "': ", kind, " needs ", key, "=");
    try {
      size_t used;
      double v = std::stod(it->second, &used);
      // !isfinite first: NaN passes `v < lo`, and casting 1e300 is UB.
      if (used != it->second.size() || !std::isfinite(v) || v < lo ||
          (integer && (v > 2147483647.0 || v != std::floor(v))))
        throw std::invalid_argument(it->second);
      kv.erase(it);
      return v;
    } catch (const std::exception &) {
      fail("--inject '", spec, "': ", key, " must be ",
           integer ? "an integer" : "a number", " >= ", lo, ", got '",
           it->second, "'");
    }
  };
  switch (in.kind) {
  case Injection::SlowCompute:
    in.rank = static_cast<int>(num("rank", 0, true));
    in.factor = num("factor", 1, false);
    break;
  case Injection::LinkDelay:
    in.src = static_cast<int>(num("src", 0, true));
    in.dst = static_cast<int>(num("dst", 0, true));
    in.us = num("us", 0, false);
    break;
  case Injection::LinkBandwidth:
    in.src = static_cast<int>(num("src", 0, true));
    in.dst = static_cast<int>(num("dst", 0, true));
    in.gbps = num("gbps", 1e-9, false);
    break;
  }
  if (!kv.empty())
    fail("--inject '", spec, "': unknown key '", kv.begin()->first, "'");
  return in;
}

double mapp::rt::slowComputeFactor(const std::vector<Injection> &inj,
                                   int rank) {
  double f = 1;
  for (const Injection &i : inj)
    if (i.kind == Injection::SlowCompute && i.rank == rank)
      f *= i.factor;
  return f;
}

namespace {

/// Forwards everything to the wrapped communicator; sends to a faulty link
/// first sleep for the link's delay plus bytes / bandwidth.
class FaultComm final : public Communicator {
public:
  FaultComm(std::unique_ptr<Communicator> c, std::map<int, double> delayUs,
            std::map<int, double> gbps)
      : c_(std::move(c)), delayUs_(std::move(delayUs)), gbps_(std::move(gbps)) {
    timeoutS_ = c_->timeout();
  }
  std::string name() const override { return c_->name(); }
  int rank() const override { return c_->rank(); }
  int worldSize() const override { return c_->worldSize(); }
  void allReduce(float *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    c_->allReduce(b, n, op, g);
  }
  void allReduce(double *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    c_->allReduce(b, n, op, g);
  }
  void allGather(const float *in, float *out, int64_t n,
                 const CommGroup &g) override {
    c_->allGather(in, out, n, g);
  }
  void reduceScatter(const float *in, float *out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    c_->reduceScatter(in, out, n, op, g);
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    c_->allToAll(in, out, bytes, g);
  }
  void send(const void *buf, size_t bytes, int peer, int64_t tag) override {
    double s = 0;
    if (auto it = delayUs_.find(peer); it != delayUs_.end())
      s += it->second * 1e-6;
    if (auto it = gbps_.find(peer); it != gbps_.end())
      s += static_cast<double>(bytes) * 8 / (it->second * 1e9);
    if (s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
    c_->send(buf, bytes, peer, tag);
  }
  void recv(void *buf, size_t bytes, int peer, int64_t tag) override {
    c_->recv(buf, bytes, peer, tag);
  }
  void barrier() override { c_->barrier(); }
  void flush() override { c_->flush(); }
  bool sharesAddressSpace() const override { return c_->sharesAddressSpace(); }
  int ranksOnThisHost() const override { return c_->ranksOnThisHost(); }
  void *deviceImpl() const override { return c_->deviceImpl(); }
  int deviceOrdinal() const override { return c_->deviceOrdinal(); }

private:
  std::unique_ptr<Communicator> c_;
  std::map<int, double> delayUs_, gbps_;
};

} // namespace

std::unique_ptr<Communicator>
mapp::rt::withLinkFaults(std::unique_ptr<Communicator> c,
                         const std::vector<Injection> &inj) {
  std::map<int, double> delay, gbps;
  for (const Injection &i : inj) {
    if (i.src != c->rank())
      continue;
    if (i.kind == Injection::LinkDelay)
      delay[i.dst] += i.us;
    else if (i.kind == Injection::LinkBandwidth)
      gbps[i.dst] = gbps.count(i.dst) ? std::min(gbps[i.dst], i.gbps) : i.gbps;
  }
  if (delay.empty() && gbps.empty())
    return c;
  return std::make_unique<FaultComm>(std::move(c), std::move(delay),
                                     std::move(gbps));
}
