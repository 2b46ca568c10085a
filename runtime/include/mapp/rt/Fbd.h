//===- Fbd.h - MegaFBD in the runtime ---------------------------*- C++ -*-===//
//
// A split plan (--mapp-split-fwd-bwd) holds backward-side programs on ranks
// [0, tp·dp·pp) in the plan's layout and forward-side programs after them in
// their own layout (Placement.tp, dp, pp). The backward ranks own and update
// the parameters; after every step they send them to the forward ranks,
// which reshard them to their degree (docs/megafbd.md).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FBD_H
#define MAPP_RT_FBD_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Plan.h"

#include <string>

namespace mapp::rt {

class Executor;

/// The forward side's layout {Placement.tp, dp, pp}; {0, dp, pp} without
/// one. The plan verifier has checked that the forward programs agree.
Layout fbdForwardLayout(const Plan &plan);
/// The backend a program runs on: its placement's, else `fallback`.
std::string placedBackend(const Program &p, const std::string &fallback);
/// The device index of a program: its placement's, else `fallback`.
int placedDevice(const Program &p, int fallback);
/// Every placement names a known backend ("cpu" | "cuda", the CUDA one
/// built in) and a device that can exist (cpu: index 0); Error naming the
/// rank otherwise. CUDA device indices are checked when the backend starts.
void checkPlacements(const Plan &plan, const std::string &fallback);
/// One line per rank: rank, role, stage/dp/tp, backend:device, peer.
std::string placementTable(const Plan &plan, const std::string &fallback);
/// Sends (backward side) or receives and reshards (forward side) the
/// parameters updated this step. Every rank of a split plan calls it once
/// per step after the optimizer. `coordinated`: the transfers (one per
/// backward/forward pair) go through the coordinator (Coordinator.h), so a
/// pair whose other side never posts is an error naming it, not a hang.
void syncFbdParams(Executor &exec, bool coordinated);

} // namespace mapp::rt

#endif
