//===- CommChecks.h - closed-form checks of a communicator ------*- C++ -*-===//
#ifndef MAPP_RT_TEST_COMMCHECKS_H
#define MAPP_RT_TEST_COMMCHECKS_H

#include "mapp/rt/Comm.h"

namespace mapp::rt::test {

/// Runs every collective and point-to-point operation of `c` (whose layout
/// is set) through the communicator and the CPU communication kernels and
/// compares against closed-form results; throws Error on the first mismatch.
/// Every rank of the world must call it.
void runCommChecks(Communicator &c);

} // namespace mapp::rt::test

#endif
