//===- SimFbd.h - MegaFBD pieces of mapp-sim's plan replay ------*- C++ -*-===//
//
// What the runtime does for a split (MegaFBD) plan outside the plan's
// instructions, so that the replay can model it: the forward side's own
// layout for named groups (Comm.h setSecondLayout), the step-end parameter
// copy of syncFbdParams (runtime/src/exec/Fbd.cpp), and per-placement
// device speeds. Private to scan/lib.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_LIB_SIMFBD_H
#define MAPP_SCAN_LIB_SIMFBD_H

#include "mapp/rt/Plan.h"
#include "mapp/scan/SimPlan.h"

#include <string>
#include <vector>

namespace mapp::scan::fbd {

/// The members (ascending global ranks) of program `p`'s named group
/// ("tp", "dp", "ep", "pp", "world"), as the communicator resolves them:
/// a forward rank's tp/dp/pp groups lie in the forward side's layout
/// {fwd tp, dp, pp} starting after the backward ranks; the world spans
/// both sides. False with a message on an unknown name.
bool namedGroup(const rt::Plan &plan, const rt::Program &p,
                const std::string &name, std::vector<int> &members,
                std::string *error);

/// One step-end parameter message: backward rank `bwd` sends `bytes` (fp32)
/// to forward rank `fwd` of its (stage, dp): its tp piece of each sharded
/// parameter the forward rank holds, the replicated ones from tp index 0.
struct ParamMessage {
  int bwd, fwd;
  uint64_t bytes;
};

/// Every (backward, forward) pair in (bwd, fwd) rank order — the order of
/// syncFbdParams, whose index is the coordinator's op id. Empty for an
/// unsplit plan. False with a message when a forward parameter has no
/// backward counterpart (the runtime fails there too).
bool paramMessages(const rt::Plan &plan, std::vector<ParamMessage> &out,
                   std::string *error);

/// Host memory syncFbdParams stages per program (rank order): a backward
/// rank its largest message plus its largest tensor piece; a forward rank
/// every piece it receives plus two full tensors (the reassembled one and
/// its piece of it).
std::vector<uint64_t> stagingBytes(const rt::Plan &plan,
                                   const std::vector<ParamMessage> &msgs);

/// The speed of program `p`: the product of the factors its backend and
/// role match (1 for an unplaced program or an unnamed key).
double speedOf(const PlanCluster &c, const rt::Program &p);

} // namespace mapp::scan::fbd

#endif // MAPP_SCAN_LIB_SIMFBD_H
