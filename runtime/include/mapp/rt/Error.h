//===- Error.h - runtime error reporting ------------------------*- C++ -*-===//
//
// Every user-facing failure (bad plan, bad data, bad flags, out-of-range ids)
// is an Error carrying one readable sentence. mapp-run catches it at the top,
// prints it and exits non-zero, so no input can crash the process.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_ERROR_H
#define MAPP_RT_ERROR_H

#include <sstream>
#include <stdexcept>
#include <string>

namespace mapp::rt {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string &msg) : std::runtime_error(msg) {}
};

/// Builds a message from streamable parts and throws it as an Error.
template <typename... Parts> [[noreturn]] void fail(const Parts &...parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

} // namespace mapp::rt

#endif
