//===- SimPlanOps.h - what mapp-sim reads off a plan's instructions -*- C++ -*-===//
//
// Sizes, FLOPs, collective kinds and schedule tables of a compiled plan's
// instructions, as the plan replay (SimPlan.cpp) charges them. Private to
// scan/lib.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_LIB_SIMPLANOPS_H
#define MAPP_SCAN_LIB_SIMPLANOPS_H

#include "mapp/rt/Plan.h"
#include "mapp/scan/Sim.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::scan::planops {

int64_t numel(const rt::Value &v);

/// The rows a grouped expert product (moe_grouped_matmul, its wgrad)
/// multiplies under balanced routing: its capacity buffer's share of the
/// rank's experts among the model's.
double routedRows(const rt::Program &p, const rt::Instr &in);
/// FLOPs of the instructions that dominate (matrix products, the MoE's
/// grouped expert products, attention); every other kernel is charged its
/// bytes.
double flopsOf(const rt::Program &p, const rt::Instr &in);
/// A matmul's, linear's or grouped expert product's smallest dimension
/// (its rate in a gemm_rates profile), 0 for every other instruction.
double gemmMinDimOf(const rt::Program &p, const rt::Instr &in);
/// The elements an instruction runs an activation function on (gelu,
/// silu and their gradients: a tanh or exp per element, which the
/// profile's activation_gelems prices): its output's for such a kernel, the
/// domain's per such statement of a `fused` region's program, else 0.
double activationElements(const rt::Program &p, const rt::Instr &in);

bool isCollective(const std::string &k);

Op collOp(const std::string &k, const rt::Attrs &a);

/// The named schedule table of a program (its own tasks for the plan's
/// schedule); null when it has none.
const std::vector<rt::Task> *tableOf(const rt::Program &p,
                                     const rt::Plan &plan,
                                     const std::string &name);

double blockFlops(const rt::Program &p, const rt::Block &b);

/// The most chunks a table keeps forwarded and not yet backwarded.
int64_t peakChunksInFlight(const rt::Program &p,
                           const std::vector<rt::Task> &t);

} // namespace mapp::scan::planops

#endif // MAPP_SCAN_LIB_SIMPLANOPS_H
