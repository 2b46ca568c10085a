//===- mapp-run.cpp - execute a training plan -----------------------------===//
//
// Thin main over the run object (mapp/rt/Run.h): parse flags into
// RunOptions (mapp/rt/RunFlags.h) and run the job. Flags are documented in
// runtime/README.md and by --help.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Run.h"
#include "mapp/rt/RunFlags.h"

#include <iostream>
#include <new>
#include <stdexcept>

using namespace mapp::rt;

int main(int argc, char **argv) {
  RunCommandLine cl;
  try {
    cl = parseRunCommandLine(argc, argv);
  } catch (const RunUsageError &e) {
    std::cerr << "mapp-run: " << e.what()
              << "\n(run mapp-run --help for the flags)\n";
    return 2;
  }
  if (cl.help) {
    std::cout << runUsage();
    return 0;
  }
  try {
    return cl.calibrate ? runCalibration(cl.calibration) : runJob(cl.options);
  } catch (const Error &e) {
    std::cerr << "mapp-run: " << e.what() << "\n";
  } catch (const std::bad_alloc &) {
    std::cerr << "mapp-run: out of memory\n";
  } catch (const std::exception &e) {
    std::cerr << "mapp-run: " << e.what() << "\n";
  }
  return 1;
}
