//===- LocalComm.cpp - single-process communicator
//-------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <cstring>

using namespace mapp::rt;

bool mapp::rt::parseGroup(const std::string &s, Group &out) {
  if (s == "tp")
    out = Group::TP;
  else if (s == "dp")
    out = Group::DP;
  else if (s == "pp")
    out = Group::PP;
  else if (s == "ep")
    out = Group::EP;
  else if (s == "world")
    out = Group::World;
  else
    return false;
  return true;
}

bool mapp::rt::parseReduceOp(const std::string &s, ReduceOp &out) {
  if (s == "sum")
    out = ReduceOp::Sum;
  else if (s == "max")
    out = ReduceOp::Max;
  else if (s == "avg")
    out = ReduceOp::Avg;
  else
    return false;
  return true;
}

namespace {

/// World of one rank: every group is {0}, so reductions leave the buffer as
/// it is (sum/max/avg of one contribution) and gathers copy.
class LocalComm final : public Communicator {
public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int worldSize() const override { return 1; }
  int groupSize(Group) const override { return 1; }
  void allReduce(float *, int64_t, ReduceOp, Group) override {}
  void allGather(const float *in, float *out, int64_t count, Group) override {
    if (in != out)
      std::memmove(out, in, static_cast<size_t>(count) * sizeof(float));
  }
  void send(const void *, size_t, int peer, int) override {
    fail("send to rank ", peer, ": the local communicator has one rank");
  }
  void recv(void *, size_t, int peer, int) override {
    fail("recv from rank ", peer, ": the local communicator has one rank");
  }
  void barrier() override {}
};

} // namespace

std::unique_ptr<Communicator> mapp::rt::createLocalComm() {
  return std::make_unique<LocalComm>();
}

std::unique_ptr<Communicator> mapp::rt::createComm(const std::string &name) {
  if (name == "local")
    return createLocalComm();
  if (name == "mpi" || name == "nccl")
    fail("--comm=", name, " is not built into this runtime (only 'local')");
  fail("unknown communicator '", name, "' (choices: local)");
}
