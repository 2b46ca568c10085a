//===- Exposure.h - Communication no compute runs beside ---------*- C++ -*-===//
//
// Exposed communication (docs/mapp-scan.md, "Exposed communication"): the
// part of a rank's communication event during which none of the rank's
// compute runs -- on any of its streams or threads. A CPU rank of one
// thread computes nothing while it blocks in a collective, so all of it is
// exposed; a CUDA rank's communication stream may run beside its compute
// stream, and a bucketed gradient all-reduce may hide behind the backward.
//
// Defined once here and used by mapp-scan (whole traces), the live
// monitor's step summaries and mapp-sim's ground truth. Standard library
// only: the bottom of the MegaScan stack, with Summary.h.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_EXPOSURE_H
#define MAPP_MONITOR_EXPOSURE_H

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::monitor {

/// What a communication event serves: collectives by the kind of group they
/// run over, point-to-point transfers by pipeline direction.
enum CommClass : int {
  CommTp,          // tensor parallel
  CommDp,          // data parallel (and expert data parallel, "edp")
  CommPp,          // collectives over a pipeline group
  CommEp,          // expert parallel (all_to_all dispatch / combine)
  CommCp,          // context parallel
  CommOther,       // world, model-parallel (mp) and unknown groups
  CommP2pForward,  // send/recv to the next pipeline stage
  CommP2pBackward, // ... to the previous one
  CommP2p,         // direction unknown (no layout, same stage)
  kCommClasses
};
const char *commClassName(int c); // "tp", ..., "p2p-forward", "p2p"
CommClass commClassOfGroupKind(const std::string &kind);
/// A transfer's class from the stages of its source and destination:
/// forward to the next stage (the last wraps to the first in interleaved
/// schedules, stages > 2), backward to the previous one.
CommClass p2pClass(int srcStage, int dstStage, int stages);

/// The execution track of an event: 0 for events without a stream (the
/// rank's one host thread, or one device stream that the host's marks
/// follow), else a hash of the stream's name.
uint32_t trackOf(const char *stream);

struct ExposureEvent {
  double b = 0, e = 0;
  int commClass = -1; // -1: compute-like (compute, optimizer, data, memcpy)
  uint32_t track = 0;
};

/// For each event: its exposed time (communication events), or -1 (compute
/// events, and regions). Regions are not counted: a compute event that
/// encloses another event of its track (e.g. an `optimizer` region around
/// the update's ops and all-reduces) is not compute of its own -- its
/// children are -- and a communication event that encloses another
/// communication event is a region around it. Compute runs on any track.
std::vector<double> exposedTimes(const std::vector<ExposureEvent> &events);

/// Which events of `events` are regions in the sense above.
std::vector<char> regionsOf(const std::vector<ExposureEvent> &events);

} // namespace mapp::monitor

#endif // MAPP_MONITOR_EXPOSURE_H
