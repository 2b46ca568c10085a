//===- AdaptiveScheduler.h - internal --------------------------*- C++ -*-===//
#ifndef MAPP_RT_SCHED_ADAPTIVE_SCHEDULER_H
#define MAPP_RT_SCHED_ADAPTIVE_SCHEDULER_H

#include "mapp/rt/Scheduler.h"

namespace mapp::rt::sched {
std::unique_ptr<TaskScheduler> createAdaptiveScheduler(const Plan &plan,
                                                       const Program &p,
                                                       Communicator &comm,
                                                       const SchedOptions &o);
} // namespace mapp::rt::sched

#endif
