//===- mapp-adaptive-plan.cpp - MegaDPP test plans from compiled ones -----===//
//
// Test tooling until the compiler emits adaptive plans (issue 14, the
// compiler half): mapp-adaptive-plan IN.mplan OUT.mplan [key=value ...]
//
//   mode=adaptive (default) Plan.schedule "adaptive", each program's
//                 schedule_tables = [{"dfc", its table}, {"bfc", the looped
//                 breadth-first order of the same tasks}], AdaptivePolicy
//   mode=bfc      a static plan whose table is the bfc order
//   mode=dfc      the plan as compiled (slots and stash_bytes set)
//   mem_cap=B, ratio=R, smoothing=S   AdaptivePolicy fields
//   stash=B       stash_bytes per (chunk, microbatch); default the
//                 program's arena_bytes / chunks (the arena holds one
//                 microbatch's activations of every chunk)
//
// The bfc order (PyTorch's looped BFS): every forward task by (chunk,
// microbatch), then every backward task by (chunk descending, microbatch);
// optimizer tasks last. slots is raised to num_microbatches so the
// breadth-first order has an arena slot per microbatch in flight.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/plan_generated.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace fb = mapp::plan;
using mapp::rt::checkPlanSeal;
using mapp::rt::Error;
using mapp::rt::sealPlan;

namespace {

std::vector<fb::Task> bfcOrder(const fb::ProgramT &p) {
  std::vector<std::tuple<int, int, int, int, fb::Task>> keyed;
  for (const fb::Task &t : p.tasks) {
    const fb::BlockT &b = *p.blocks.at(t.block());
    int phase = b.kind == fb::BlockKind::Forward     ? 0
                : b.kind == fb::BlockKind::Optimizer ? 2
                                                      : 1;
    int chunk = phase == 1 ? -b.chunk : b.chunk;
    keyed.emplace_back(phase, chunk, t.microbatch(), t.block(), t);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](auto &a, auto &b) {
    return std::make_tuple(std::get<0>(a), std::get<1>(a), std::get<2>(a),
                           std::get<3>(a)) <
           std::make_tuple(std::get<0>(b), std::get<1>(b), std::get<2>(b),
                           std::get<3>(b));
  });
  std::vector<fb::Task> out;
  for (auto &k : keyed)
    out.push_back(std::get<4>(k));
  return out;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: mapp-adaptive-plan IN.mplan OUT.mplan [mode=adaptive|"
                 "bfc|dfc] [mem_cap=B] [ratio=R] [smoothing=S] [stash=B]\n";
    return 2;
  }
  std::string mode = "adaptive";
  uint64_t memCap = 0, stash = 0;
  double ratio = 1.5, smoothing = 0.25;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    try {
      if (k == "mode" && (v == "adaptive" || v == "bfc" || v == "dfc"))
        mode = v;
      else if (k == "mem_cap")
        memCap = std::stoull(v);
      else if (k == "stash")
        stash = std::stoull(v);
      else if (k == "ratio")
        ratio = std::stod(v);
      else if (k == "smoothing")
        smoothing = std::stod(v);
      else
        throw std::invalid_argument(a);
    } catch (const std::exception &) {
      std::cerr << "mapp-adaptive-plan: bad argument '" << a << "'\n";
      return 2;
    }
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
  size_t body = 0;
  try {
    uint32_t checksum = 0;
    body = checkPlanSeal(buf.data(), buf.size(), checksum);
  } catch (const Error &e) {
    std::cerr << "mapp-adaptive-plan: " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  flatbuffers::Verifier ver(buf.data(), body);
  if (!fb::VerifyPlanBuffer(ver)) {
    std::cerr << "mapp-adaptive-plan: " << argv[1] << " is not a plan\n";
    return 1;
  }
  std::unique_ptr<fb::PlanT> plan(fb::GetPlan(buf.data())->UnPack());
  int chunks = std::max(1, plan->chunks);
  for (auto &p : plan->programs) {
    if (p->tasks.empty()) {
      std::cerr << "mapp-adaptive-plan: rank " << p->rank
                << " has an empty table (compile a pipeline plan)\n";
      return 1;
    }
    p->slots = std::max(p->slots, plan->num_microbatches);
    p->stash_bytes = stash ? stash : p->arena_bytes / chunks;
    std::vector<fb::Task> bfc = bfcOrder(*p);
    p->schedule_tables.clear();
    if (mode == "adaptive") {
      auto d = std::make_unique<fb::ScheduleTableT>();
      d->name = "dfc";
      d->tasks = p->tasks;
      auto b = std::make_unique<fb::ScheduleTableT>();
      b->name = "bfc";
      b->tasks = bfc;
      p->schedule_tables.push_back(std::move(d));
      p->schedule_tables.push_back(std::move(b));
    } else if (mode == "bfc") {
      p->tasks = bfc;
    }
  }
  if (mode == "adaptive") {
    plan->schedule = "adaptive";
    plan->adaptive = std::make_unique<fb::AdaptivePolicyT>();
    plan->adaptive->mem_cap_bytes = memCap;
    plan->adaptive->slow_link_ratio = ratio;
    plan->adaptive->bandwidth_smoothing = smoothing;
  } else if (mode == "bfc") {
    plan->schedule = "bfc";
  }
  flatbuffers::FlatBufferBuilder fbb;
  fb::FinishPlanBuffer(fbb, fb::Plan::Pack(fbb, plan.get()));
  std::vector<uint8_t> sealed = sealPlan(fbb.GetBufferPointer(), fbb.GetSize());
  std::ofstream out(argv[2], std::ios::binary);
  out.write(reinterpret_cast<const char *>(sealed.data()),
            static_cast<std::streamsize>(sealed.size()));
  return out ? 0 : 1;
}
