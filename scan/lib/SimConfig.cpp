//===- SimConfig.cpp - mapp-sim's job model: config, faults, network ----===//

#include "mapp/cost/CostModel.h"
#include "mapp/rt/FaultSpec.h"
#include "mapp/scan/Sim.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

using namespace mapp::scan;
using json = nlohmann::json;

int mapp::scan::SimConfig::firstLayer(int vs) const {
  if (stageLayers.empty())
    return vs * (layers / (pp * chunks));
  int first = 0;
  for (int k = 0; k < vs; ++k)
    first += stageLayers[k];
  return first;
}

bool mapp::scan::parseFault(const std::string &s, int world, Fault &f,
                            std::string *error) {
  auto fail = [&](const std::string &m) {
    *error = "bad fault '" + s + "': " + m;
    return false;
  };
  mapp::rt::FaultSpec spec;
  std::string why;
  if (!mapp::rt::parseFaultSpec(s, spec, &why))
    return fail(why);
  // The checks only the simulator can make: its world, its kinds, and
  // faults that last the whole run.
  auto inWorld = [&](int r) { return r < world; };
  f.text = s;
  switch (spec.kind) {
  case mapp::rt::FaultSpec::SlowCompute:
    if (!inWorld(spec.rank))
      return fail("rank outside world size " + std::to_string(world));
    f.kind = Fault::SlowCompute;
    f.rank = spec.rank;
    f.value = spec.factor;
    break;
  case mapp::rt::FaultSpec::LinkDelay:
  case mapp::rt::FaultSpec::LinkBandwidth:
    if (!inWorld(spec.src) || !inWorld(spec.dst))
      return fail("src and dst must be distinct ranks below " +
                  std::to_string(world));
    f.kind = spec.kind == mapp::rt::FaultSpec::LinkDelay ? Fault::LinkDelay
                                                        : Fault::LinkBandwidth;
    f.src = spec.src;
    f.dst = spec.dst;
    f.value = f.kind == Fault::LinkDelay ? spec.us : spec.gbps;
    break;
  default:
    return fail(std::string("mapp-sim models slow-compute, link-delay and "
                            "link-bandwidth, not ") +
                mapp::rt::faultKindName(spec.kind));
  }
  if (spec.fromStep != 0 || spec.toStep >= 0)
    return fail(
        "mapp-sim applies a fault to every step (no from-step/to-step)");
  return true;
}

// The cp keys, with the compiler's rules and messages where it has them
// (lib/Transforms/Parallel/ContextParallel.cpp).
static bool checkContextParallel(const SimConfig &c, std::string *error) {
  auto bad = [&](const std::string &m) {
    *error = m;
    return false;
  };
  std::string cpIs = "cp=" + std::to_string(c.cp);
  if (c.cp < 1)
    return bad("cp must be >= 1, got " + std::to_string(c.cp));
  if (c.cpComm != "ring" && c.cpComm != "a2a")
    return bad("cp_comm must be ring or a2a, got \"" + c.cpComm + "\"");
  if (c.dp % c.cp)
    return bad(cpIs + " does not divide the data-parallel ranks dp=" +
               std::to_string(c.dp) +
               " (cp lives inside dp: the cp group is cp consecutive dp "
               "ranks, world = tp·pp·dp)");
  if (c.cp > 1 && c.ep > 1)
    return bad("cp > 1 with ep > 1 is not supported (as in the compiler)");
  if (c.batchRows < 1 || c.dtypeBytes < 1)
    return bad("batch_rows and dtype_bytes must be >= 1");
  if (c.attentionBackwardFactor < 0 || c.attentionForwardUs < 0 ||
      c.attentionTflops < 0)
    return bad("attention_forward_us, attention_tflops and "
               "attention_backward_factor must be >= 0");
  bool attention = c.attentionForwardUs > 0 || c.attentionTflops > 0;
  if (c.cp == 1 && !attention)
    return true;
  if (c.seqLen < 1)
    return bad(c.cp > 1 ? "cp > 1 needs seq_len"
                        : "attention_* keys need seq_len");
  if (c.seqLen % (2 * c.cp))
    return bad("sequence length " + std::to_string(c.seqLen) +
               " is not divisible by 2·cp = " + std::to_string(2 * c.cp) +
               " (each rank holds two equal chunks: causal load balancing)");
  if (c.heads < 1 || c.kvHeads < 1 || c.headDim < 1)
    return bad("cp and attention modeling need heads, kv_heads and head_dim "
               "(>= 1)");
  if (c.heads % c.kvHeads)
    return bad("kv_heads=" + std::to_string(c.kvHeads) +
               " does not divide heads=" + std::to_string(c.heads));
  if (c.heads % c.tp || c.kvHeads % c.tp)
    return bad("tp=" + std::to_string(c.tp) + " does not divide heads=" +
               std::to_string(c.heads) + " and kv_heads=" +
               std::to_string(c.kvHeads));
  if (c.cpComm == "a2a" && ((c.heads / c.tp) % c.cp || (c.kvHeads / c.tp) % c.cp))
    return bad("cp_comm=a2a splits the heads over the cp group: " +
               std::to_string(c.heads / c.tp) + " heads and " +
               std::to_string(c.kvHeads / c.tp) +
               " key/value heads (after tensor parallelism) must be "
               "divisible by " + cpIs);
  if (!attention)
    return bad("cp > 1 needs the attention core's cost: attention_forward_us, "
               "or attention_tflops");
  return true;
}

double SimConfig::layerForwardNs() const {
  if (layerForwardUs > 0)
    return layerForwardUs * 1e3;
  return layerForwardFlops / (deviceTflops * 1e12) * 1e9;
}

double SimConfig::attentionForwardNs() const {
  if (attentionForwardUs > 0)
    return attentionForwardUs * 1e3;
  if (attentionTflops <= 0 || seqLen <= 0 || heads <= 0 || headDim <= 0)
    return 0;
  // QK^T and PV over the causal (query, key) pairs: 2 x 2 FLOPs a pair and
  // head dimension, for this rank's heads.
  double pairs = double(seqLen) * double(seqLen + 1) / 2;
  double flops = 4.0 * batchRows * (heads / tp) * headDim * pairs;
  return flops / (attentionTflops * 1e12) * 1e9;
}

uint64_t SimConfig::headsShareBytes(int h) const {
  return uint64_t(batchRows) * uint64_t(seqLen / cp) * uint64_t(h) *
         uint64_t(headDim) * uint64_t(dtypeBytes);
}

uint64_t SimConfig::kvBlockBytes() const {
  return 2 * headsShareBytes(kvHeads / tp);
}

double SimConfig::causalPairShare(int member, int src) const {
  // 2cp chunks of c tokens; member r holds chunks r and 2cp-1-r. A query
  // chunk sees all of an earlier key chunk and the lower triangle (with the
  // diagonal) of its own.
  double c = double(seqLen) / (2 * cp);
  auto pairs = [&](int qc, int kc) {
    return kc < qc ? c * c : kc == qc ? c * (c + 1) / 2 : 0.0;
  };
  double n = 0;
  for (int qc : {member, 2 * cp - 1 - member})
    for (int kc : {src, 2 * cp - 1 - src})
      n += pairs(qc, kc);
  return n / (double(seqLen) * double(seqLen + 1) / 2);
}

bool mapp::scan::parseSimConfig(const std::string &text, SimConfig &c,
                                std::string *error) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error &e) {
    *error = std::string("invalid JSON: ") + e.what();
    return false;
  }
  if (!j.is_object()) {
    *error = "config must be a JSON object";
    return false;
  }
  static const std::set<std::string> known = {"tp",
                                              "pp",
                                              "dp",
                                              "microbatches",
                                              "steps",
                                              "chunks",
                                              "layers",
                                              "stage_layers",
                                              "schedule",
                                              "layer_forward_us",
                                              "layer_forward_flops",
                                              "device_tflops",
                                              "backward_factor",
                                              "embedding_us",
                                              "loss_us",
                                              "optimizer_us",
                                              "data_us",
                                              "activation_bytes",
                                              "tp_allreduce_bytes",
                                              "dp_allreduce_bytes",
                                              "grad_norm_allreduce",
                                              "overlap_grad_reduce",
                                              "ep",
                                              "moe_experts",
                                              "moe_dispatch_bytes",
                                              "moe_expert_us",
                                              "moe_expert_load",
                                              "network",
                                              "clock",
                                              "jitter",
                                              "exit_skew_us",
                                              "seed",
                                              "faults",
                                              "cp",
                                              "cp_comm",
                                              "seq_len",
                                              "batch_rows",
                                              "heads",
                                              "kv_heads",
                                              "head_dim",
                                              "dtype_bytes",
                                              "attention_forward_us",
                                              "attention_tflops",
                                              "attention_backward_factor",
                                              "recompute",
                                              "persistent_bytes",
                                              "layer_stash_bytes",
                                              "working_bytes",
                                              "comment"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) {
      *error = "unknown config key '" + it.key() + "'";
      return false;
    }
  try {
    c.tp = j.value("tp", 1);
    c.pp = j.value("pp", 1);
    c.dp = j.value("dp", 1);
    c.microbatches = j.value("microbatches", 1);
    c.steps = j.value("steps", 1);
    c.chunks = j.value("chunks", 1);
    c.layers = j.value("layers", c.pp * c.chunks);
    c.stageLayers = j.value("stage_layers", std::vector<int>{});
    c.schedule = j.value("schedule", std::string("1f1b"));
    c.layerForwardUs = j.value("layer_forward_us", 0.0);
    c.layerForwardFlops = j.value("layer_forward_flops", 0.0);
    c.deviceTflops = j.value("device_tflops", 0.0);
    c.backwardFactor = j.value("backward_factor", 2.0);
    c.embeddingUs = j.value("embedding_us", 0.0);
    c.lossUs = j.value("loss_us", 0.0);
    c.optimizerUs = j.value("optimizer_us", 0.0);
    c.dataUs = j.value("data_us", 0.0);
    c.activationBytes = j.value("activation_bytes", (uint64_t)0);
    c.tpAllreduceBytes = j.value("tp_allreduce_bytes", (uint64_t)0);
    c.dpAllreduceBytes = j.value("dp_allreduce_bytes", (uint64_t)0);
    c.gradNormAllreduce = j.value("grad_norm_allreduce", true);
    c.overlapGradReduce = j.value("overlap_grad_reduce", false);
    c.ep = j.value("ep", 1);
    c.moeExperts = j.value("moe_experts", 0);
    c.moeDispatchBytes = j.value("moe_dispatch_bytes", (uint64_t)0);
    c.moeExpertUs = j.value("moe_expert_us", 0.0);
    c.moeExpertLoad = j.value("moe_expert_load", std::vector<double>{});
    if (j.contains("network")) {
      const json &n = j["network"];
      c.gpusPerNode = n.value("gpus_per_node", 0);
      c.interGbps = n.value("gbps", c.interGbps);
      c.interLatencyUs = n.value("latency_us", c.interLatencyUs);
      c.intraGbps = n.value("intra_gbps", c.intraGbps);
      c.intraLatencyUs = n.value("intra_latency_us", c.intraLatencyUs);
    }
    if (j.contains("clock")) {
      const json &k = j["clock"];
      c.clockOffsetMs = k.value("offset_ms", 0.0);
      c.clockDriftPpm = k.value("drift_ppm", 0.0);
      c.wallErrorMs = k.value("wall_error_ms", 0.0);
    }
    c.jitter = j.value("jitter", 0.0);
    c.exitSkewUs = j.value("exit_skew_us", 0.0);
    c.seed = j.value("seed", (uint64_t)1);
    c.cp = j.value("cp", 1);
    c.cpComm = j.value("cp_comm", std::string("ring"));
    c.seqLen = j.value("seq_len", (int64_t)0);
    c.batchRows = j.value("batch_rows", (int64_t)1);
    c.heads = j.value("heads", 0);
    c.kvHeads = j.value("kv_heads", c.heads);
    c.headDim = j.value("head_dim", 0);
    c.dtypeBytes = j.value("dtype_bytes", 2);
    c.attentionForwardUs = j.value("attention_forward_us", 0.0);
    c.attentionTflops = j.value("attention_tflops", 0.0);
    c.attentionBackwardFactor = j.value("attention_backward_factor", 0.0);
    std::string rc = j.value("recompute", std::string("none"));
    if (rc != "none" && rc != "full") {
      *error = "recompute must be none or full, got \"" + rc + "\"";
      return false;
    }
    c.recomputeFull = rc == "full";
    c.persistentBytes = j.value("persistent_bytes", (uint64_t)0);
    c.layerStashBytes = j.value("layer_stash_bytes", (uint64_t)0);
    c.workingBytes = j.value("working_bytes", (uint64_t)0);
  } catch (const json::exception &e) {
    *error = std::string("bad config value: ") + e.what();
    return false;
  }
  auto bad = [&](const std::string &m) {
    *error = m;
    return false;
  };
  if (c.tp < 1 || c.pp < 1 || c.dp < 1 || c.microbatches < 1 || c.steps < 1 ||
      c.chunks < 1)
    return bad("tp, pp, dp, microbatches, steps and chunks must be >= 1");
  if (c.schedule != "gpipe" && c.schedule != "1f1b" &&
      c.schedule != "interleaved")
    return bad("schedule must be gpipe, 1f1b or interleaved");
  if (c.schedule == "1f1b" && c.chunks != 1)
    return bad("1f1b runs one chunk per stage; use interleaved for chunks > 1");
  if (c.schedule == "interleaved" && c.microbatches % c.pp)
    return bad("interleaved needs microbatches divisible by pp");
  if (!c.stageLayers.empty()) {
    int sum = 0;
    for (int n : c.stageLayers) {
      if (n < 1)
        return bad("every stage_layers entry must be >= 1");
      sum += n;
    }
    if ((int)c.stageLayers.size() != c.pp * c.chunks || sum != c.layers)
      return bad("stage_layers needs pp*chunks entries summing to layers");
  } else if (c.layers % (c.pp * c.chunks)) {
    return bad("layers must be divisible by pp*chunks (or give stage_layers)");
  }
  if (c.layerForwardUs <= 0 &&
      (c.layerForwardFlops <= 0 || c.deviceTflops <= 0))
    return bad("give layer_forward_us, or layer_forward_flops and "
               "device_tflops");
  if (c.interGbps <= 0 || c.intraGbps <= 0)
    return bad("link bandwidths must be positive");
  if (c.ep < 1 || c.dp % c.ep)
    return bad("ep must be >= 1 and divide dp (" + std::to_string(c.dp) +
               ")");
  if (c.moeExperts < 0 || (c.ep > 1 && c.moeExperts == 0))
    return bad("ep > 1 needs moe_experts");
  if (c.moeExperts > 0) {
    if (c.moeExperts % c.ep)
      return bad(std::to_string(c.moeExperts) + " experts cannot be split "
                 "evenly over ep " + std::to_string(c.ep));
    if (c.moeExpertUs <= 0)
      return bad("moe_experts needs moe_expert_us > 0");
    if (c.ep > 1 && c.moeDispatchBytes == 0)
      return bad("ep > 1 needs moe_dispatch_bytes > 0");
    if (c.moeExpertLoad.empty())
      c.moeExpertLoad.assign(c.moeExperts, 1.0);
    if (static_cast<int>(c.moeExpertLoad.size()) != c.moeExperts)
      return bad("moe_expert_load needs one entry per expert (" +
                 std::to_string(c.moeExperts) + "), got " +
                 std::to_string(c.moeExpertLoad.size()));
    double sum = 0;
    for (double w : c.moeExpertLoad) {
      if (!(w >= 0) || !std::isfinite(w))
        return bad("moe_expert_load entries must be finite and >= 0");
      sum += w;
    }
    if (sum <= 0)
      return bad("moe_expert_load must give some expert a load");
    for (double &w : c.moeExpertLoad)
      w /= sum;
  } else if (c.moeDispatchBytes || c.moeExpertUs > 0 ||
             !c.moeExpertLoad.empty()) {
    return bad("moe_* keys need moe_experts");
  }
  if (!checkContextParallel(c, error))
    return false;
  if (j.contains("faults")) {
    if (!j["faults"].is_array())
      return bad("'faults' must be an array of strings");
    for (const json &f : j["faults"]) {
      Fault fault;
      if (!f.is_string())
        return bad("'faults' must be an array of strings");
      if (!parseFault(f.get<std::string>(), c.tp * c.pp * c.dp, fault, error))
        return false;
      c.faults.push_back(fault);
    }
  }
  return true;
}

SimNetwork mapp::scan::makeNetwork(const SimConfig &c) {
  int gpn = c.gpusPerNode > 0 ? c.gpusPerNode : c.tp;
  std::map<std::pair<int, int>, double> extraUs, gbps;
  for (const Fault &f : c.faults) {
    if (f.kind == Fault::LinkDelay)
      extraUs[{f.src, f.dst}] += f.value;
    else if (f.kind == Fault::LinkBandwidth)
      gbps[{f.src, f.dst}] = f.value;
  }
  // The link and ring formulas are the cost model's (mapp/cost), which
  // the auto-parallel search prices layouts with.
  using mapp::cost::Costs;
  auto link = [=](int a, int b) {
    bool intra = a / gpn == b / gpn;
    mapp::cost::Link l{intra ? c.intraGbps : c.interGbps,
                       intra ? c.intraLatencyUs : c.interLatencyUs};
    auto e = extraUs.find({a, b});
    if (e != extraUs.end())
      l.latencyUs += e->second;
    auto g = gbps.find({a, b});
    if (g != gbps.end())
      l.gbps = g->second;
    return l;
  };
  SimNetwork net;
  net.p2p = [=](int a, int b, uint64_t bytes) {
    return Costs::linkNs(link(a, b), bytes);
  };
  net.coll = [=](const SimGroup &g, Op op, uint64_t bytes) {
    size_t n = g.members.size();
    if (n < 2)
      return 0.0;
    // Ring algorithm: the slowest ring hop paces every step.
    double step = 0;
    for (size_t i = 0; i < n; ++i)
      step = std::max(step, Costs::linkNs(link(g.members[i],
                                               g.members[(i + 1) % n]),
                                          bytes / (double)n));
    Costs::Coll kind = op == Op::AllReduce ? Costs::Coll::AllReduce
                                           : Costs::Coll::AllGather;
    return Costs::ringSteps(kind, int(n)) * step;
  };
  return net;
}
