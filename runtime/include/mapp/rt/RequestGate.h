//===- RequestGate.h - wait for a request head, then hand over --*- C++ -*-===//
//
// The front of mapp's two loopback servers, mapp-run's probe-control port
// (ProbeControl.cpp) and mapp-scope's HTTP server (ScopeServer.cpp): one
// poll() loop that accepts connections and holds each until its request
// head has arrived. Only a complete head reaches the server proper (its
// token check, its worker threads), so a client that trickles bytes or
// never finishes costs a slot here and nothing else. Limits a client
// cannot stretch:
//  - a deadline from accept to the end of the head: a total, not an idle
//    timeout per read, so a byte a second does not keep a connection;
//  - a cap on the head's bytes;
//  - a cap on connections still waiting for their head. At the cap the
//    oldest waiting connection is dropped, never the newcomer: clients that
//    reconnect in a loop displace each other while a client that sends its
//    request at once is served (refusing newcomers locked the control port
//    out, issue 43).
// Accepting drains the listen queue each round, a bounded number at a time,
// and reads each new connection at once (its request has usually come with
// it). Single-threaded: run() is the only caller of the handlers.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_REQUESTGATE_H
#define MAPP_RT_REQUESTGATE_H

#include <atomic>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace mapp::rt {

struct GateLimits {
  int headMs = 3000;          // accept -> end of head (and, for a reply the
                              // gate sends, the end of that reply)
  size_t maxHeadBytes = 4096; // more than this without the head's end: refused
  size_t maxWaiting = 64;     // connections waiting for their head
};

/// Why the gate closed a connection before its request was complete.
enum class GateDrop {
  Left,     // connected and closed without sending a byte
  Failed,   // a connection error, or closed with half a request
  Idle,     // the deadline passed before a byte came (a browser's
            // preconnect: best closed without an answer)
  TimedOut, // the deadline passed with part of a request
  TooLarge, // more than maxHeadBytes without the head's end
  Evicted,  // the oldest of maxWaiting waiting connections, for a newcomer
};

class RequestGate {
public:
  struct Handlers {
    /// The length of the request head at the start of `in`, 0 while it is
    /// incomplete; `closed`: the client will send no more.
    std::function<size_t(const std::string &in, bool closed)> headLength;
    /// A complete head (with whatever followed it in the same reads). Either
    /// returns the reply to send before closing, or takes `fd` (non-blocking;
    /// the callee closes it) and returns nullopt.
    std::function<std::optional<std::string>(int fd, std::string in,
                                             const std::string &peer)>
        onRequest;
    /// A connection the gate drops: the bytes to send it first (best effort,
    /// one non-blocking send; "" = none). `why` says what happened.
    std::function<std::string(GateDrop, const std::string &peer,
                              const std::string &why)>
        onDrop;
  };

  /// `listenFd`: a listening TCP socket (made non-blocking here; the gate
  /// does not close it).
  RequestGate(int listenFd, GateLimits limits, Handlers handlers);
  /// Serves until `stop` is set (looked at every 100 ms); then closes the
  /// connections it still holds.
  void run(const std::atomic<bool> &stop);

private:
  int listenFd_;
  GateLimits limits_;
  Handlers h_;
};

/// "ADDR:PORT" of a connected socket's peer ("?" when unknown).
std::string peerName(int fd);

} // namespace mapp::rt

#endif
