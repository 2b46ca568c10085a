//===- TraceFormat.h - The trace vocabulary, defined once -------*- C++ -*-===//
//
// The bottom of the MegaScan stack (docs/trace-format.md): the categories and
// communication ops of trace events and their names in the files. The line
// codec (TraceLine.h) and everything over it use these; nothing here depends
// on anything but the standard library.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRACE_TRACEFORMAT_H
#define MAPP_TRACE_TRACEFORMAT_H

#include <cstdint>
#include <string>
#include <string_view>

namespace mapp::trace {

/// Trace format version written in every header ("version").
constexpr int kFormatVersion = 1;

/// "cat" of an event.
enum class Category : uint8_t { Compute, Comm, Memcpy, Data, Optimizer };
/// "op" of a communication event (None: not one). Collectives are the ops
/// from AllReduce on.
enum class Op : uint8_t {
  None,
  Send,
  Recv,
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Barrier
};

/// "phase" of an event: the part of the training step that ran it (the
/// plan block's kind). None: not recorded, or outside the passes (data,
/// optimizer, the step's metrics).
enum class Phase : uint8_t {
  None,
  Forward,
  Backward,
  BackwardInput,  // split backward (MegaDPP, zero-bubble): input gradients
  BackwardWeight, // ... and weight gradients
};

const char *categoryName(Category c); // "compute", "comm", ...
const char *opName(Op o);             // "" for None, "send", "all_reduce", ...
bool parseCategory(const std::string &s, Category &out);
bool parseOp(const std::string &s, Op &out); // "" parses as None
const char *phaseName(Phase p); // "" for None, "fwd", "bwd", "bwd_input", "bwd_weight"
bool parsePhase(const std::string &s, Phase &out); // "" parses as None
inline bool isCollective(Op o) { return o >= Op::AllReduce; }

/// The keys of a trace event line (docs/trace-format.md), encoded and
/// decoded by the line codec (TraceLine.h) alone.
namespace field {
constexpr const char *kId = "id", *kName = "name", *kCat = "cat", *kOp = "op",
                     *kPhase = "phase", *kBegin = "b", *kEnd = "e",
                     *kStep = "step", *kMicrobatch = "mb", *kLayer = "layer",
                     *kChunk = "chunk", *kBytes = "bytes", *kCpu = "cpu",
                     *kPeer = "peer", *kTag = "tag", *kSent = "sent",
                     *kArrived = "arrived", *kPending = "pending",
                     *kGroup = "group", *kSeq = "seq",
                     *kSendBytes = "send_bytes", *kRecvBytes = "recv_bytes",
                     *kStream = "stream";
} // namespace field

/// Appends `s` as a JSON string: quoted, `"` and `\` escaped, control
/// characters as \u00XX (every hand-written JSON of MegaScan uses this).
void appendJsonString(std::string &out, std::string_view s);

} // namespace mapp::trace

#endif // MAPP_TRACE_TRACEFORMAT_H
