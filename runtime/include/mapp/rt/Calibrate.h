//===- Calibrate.h - mapp-run --calibrate: measure a cost profile -*- C++ -*-===//
//
// Measures the machine through the runtime's own backend kernels (matmul,
// add, attention, send/recv, all_reduce: the functions the executor calls)
// and the Executor's cost of one more instruction, and writes a cost
// profile (mapp/cost/CostModel.h, profileJson) that the auto-parallel
// search and mapp-sim read. docs/auto-parallel.md, "Calibration", says
// which measurement feeds which key.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CALIBRATE_H
#define MAPP_RT_CALIBRATE_H

#include <string>

namespace mapp::rt {

struct CalibrateOptions {
  std::string backend = "cpu"; // cpu | cuda
  std::string comm = "local";  // local (rank threads) | mpi (mpirun)
  int threads = 0;             // CPU workers per rank; 0 = cores / ranks
  std::string out;             // the profile file (-o)
  double seconds = 20;         // the budget (--calibrate-seconds)
  bool quiet = false;          // no table on stderr
};

/// True when argv holds --calibrate (mapp-run then calibrates, no plan).
bool isCalibrateCommandLine(int argc, char **argv);
/// Parses a --calibrate command line; throws RunUsageError (RunFlags.h) with
/// the message for a bad flag, a plan argument, a missing -o, an unknown
/// backend or communicator, a budget <= 0.
CalibrateOptions parseCalibrateCommandLine(int argc, char **argv);
/// Measures and writes the profile (rank 0 under mpirun); the exit status.
/// Throws Error on a failure (an unwritable file, a backend that cannot
/// start).
int runCalibration(const CalibrateOptions &o);

} // namespace mapp::rt

#endif
