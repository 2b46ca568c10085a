//===- Comm.h - communicators -----------------------------------*- C++ -*-===//
//
// Collectives and point-to-point transfers between ranks. `local` runs every
// rank of the world in one process (world 1 today; ranks as threads later),
// `mpi` and `nccl` plug in behind the same interface.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_COMM_H
#define MAPP_RT_COMM_H

#include "mapp/rt/DType.h"

#include <cstdint>
#include <memory>
#include <string>

namespace mapp::rt {

enum class ReduceOp { Sum, Max, Avg };
/// Parallel group a collective runs over (docs/semantics.md `group`).
enum class Group { World, TP, DP, PP, EP };
bool parseGroup(const std::string &s, Group &out);
bool parseReduceOp(const std::string &s, ReduceOp &out);

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  /// Number of ranks in `g` that this rank belongs to.
  virtual int groupSize(Group g) const = 0;
  /// In-place reduction of `count` floats over the group.
  virtual void allReduce(float *buf, int64_t count, ReduceOp op, Group g) = 0;
  /// out = concatenation over group ranks of `count` elements each.
  virtual void allGather(const float *in, float *out, int64_t count,
                         Group g) = 0;
  virtual void send(const void *buf, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void *buf, size_t bytes, int peer, int tag) = 0;
  virtual void barrier() = 0;
};

/// Single-process communicator of world size 1: collectives are identities,
/// point-to-point is an Error (there is no peer).
std::unique_ptr<Communicator> createLocalComm();
std::unique_ptr<Communicator> createComm(const std::string &name);

} // namespace mapp::rt

#endif
