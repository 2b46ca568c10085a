//===- SimConfig.cpp - mapp-sim's job model: config, faults, programs -----===//

#include "mapp/cost/CostModel.h"
#include "mapp/scan/Sim.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

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
  size_t colon = s.find(':');
  if (colon == std::string::npos)
    return fail("expected KIND:key=value,...");
  std::string kind = s.substr(0, colon);
  std::map<std::string, double> kv;
  std::stringstream ss(s.substr(colon + 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return fail("'" + item + "' is not key=value");
    try {
      size_t used = 0;
      std::string v = item.substr(eq + 1);
      kv[item.substr(0, eq)] = std::stod(v, &used);
      if (used != v.size() || !std::isfinite(kv[item.substr(0, eq)]))
        throw std::invalid_argument(v);
    } catch (const std::exception &) {
      return fail("'" + item + "' needs a finite numeric value");
    }
  }
  auto need = [&](const char *k, double &out) {
    auto it = kv.find(k);
    if (it == kv.end())
      return false;
    out = it->second;
    kv.erase(it);
    return true;
  };
  auto rankOk = [&](double v) { return v >= 0 && v < world && v == (int)v; };
  double a, b, v;
  f.text = s;
  if (kind == "slow-compute") {
    if (!need("rank", a) || !need("factor", v))
      return fail("slow-compute needs rank=R,factor=F");
    if (!rankOk(a))
      return fail("rank outside world size " + std::to_string(world));
    if (v <= 0)
      return fail("factor must be positive");
    f.kind = Fault::SlowCompute;
    f.rank = a;
  } else if (kind == "link-delay" || kind == "link-bandwidth") {
    bool delay = kind == "link-delay";
    if (!need("src", a) || !need("dst", b) || !need(delay ? "us" : "gbps", v))
      return fail(kind + (delay ? " needs src=A,dst=B,us=U"
                                : " needs src=A,dst=B,gbps=G"));
    if (!rankOk(a) || !rankOk(b) || a == b)
      return fail("src and dst must be distinct ranks below " +
                  std::to_string(world));
    if (delay ? v < 0 : v <= 0)
      return fail(delay ? "us must be >= 0" : "gbps must be positive");
    f.kind = delay ? Fault::LinkDelay : Fault::LinkBandwidth;
    f.src = a;
    f.dst = b;
  } else {
    return fail("unknown kind '" + kind +
                "' (slow-compute, link-delay, link-bandwidth)");
  }
  f.value = v;
  if (!kv.empty())
    return fail("unknown key '" + kv.begin()->first + "'");
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

namespace {
struct Builder {
  const SimConfig &c;
  SimJob &job;
  int R;
  std::map<std::string, int> groupIds;
  std::vector<std::map<int, int64_t>> seqs; // per rank: group -> next seq
  Phase phase = Phase::None; // of the ops base() makes (the task's pass)
  std::map<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>, int32_t>
      peerBytesIds;

  int rankOf(int t, int d, int p) const { return t + c.tp * (d + c.dp * p); }

  int group(const std::string &kind, std::vector<int> members) {
    std::sort(members.begin(), members.end());
    std::string key = kind;
    for (int m : members)
      key += "," + std::to_string(m);
    auto it = groupIds.find(key);
    if (it != groupIds.end())
      return it->second;
    job.groups.push_back({kind, members});
    return groupIds[key] = job.groups.size() - 1;
  }

  SimOp base(const char *name, Cat cat, int step, int mb, int layer,
             int chunk) {
    SimOp op;
    op.name = name;
    op.cat = cat;
    op.step = step;
    op.mb = mb;
    op.layer = layer;
    op.chunk = chunk;
    op.phase = phase;
    return op;
  }

  void compute(int r, SimOp op, double ns) {
    takePostGap(r, op);
    op.kind = SimOp::Compute;
    size_t idx = job.programs[r].size();
    double j = 1 + c.jitter * hashNormal(c.seed, r, idx);
    op.durNs = ns * std::max(0.2, j);
    for (const Fault &f : c.faults)
      if (f.kind == Fault::SlowCompute && f.rank == r)
        op.durNs *= f.value;
    job.programs[r].push_back(op);
  }

  void coll(int r, SimOp op, int g, uint64_t bytes) {
    op.kind = SimOp::Coll;
    op.cat = Cat::Comm;
    op.op = Op::AllReduce;
    op.group = g;
    op.bytes = bytes;
    op.seq = seqs[r][g]++;
    op.exitSkewNs = c.exitSkewUs * 1e3 *
                    hashUniform(c.seed ^ 0x5eed, r, job.programs[r].size());
    job.programs[r].push_back(op);
  }

  // A variable all_to_all over the ep group (ep_dispatch / ep_combine).
  void allToAll(int r, SimOp op, int g, const SimPeerBytes &counts) {
    uint64_t busiest = 0; // the member that moves the most paces it
    for (size_t m = 0; m < counts.send.size(); ++m)
      busiest = std::max(busiest, std::max(counts.send[m], counts.recv[m]));
    coll(r, op, g, busiest * counts.send.size());
    SimOp &o = job.programs[r].back();
    o.op = Op::AllToAll;
    auto key = std::make_pair(counts.send, counts.recv);
    auto it = peerBytesIds.find(key);
    if (it == peerBytesIds.end()) {
      it = peerBytesIds.emplace(key, (int32_t)job.peerBytes.size()).first;
      job.peerBytes.push_back(counts);
    }
    o.peerBytes = it->second;
  }

  // Share of all routed rows that member j's experts get.
  double memberShare(int j) const {
    int per = c.moeExperts / c.ep;
    double s = 0;
    for (int e = j * per; e < (j + 1) * per; ++e)
      s += c.moeExpertLoad[e];
    return s;
  }

  // The experts of one layer on rank r: dispatch, the experts' compute
  // (proportional to the rows they got), combine. The backward runs the
  // same exchanges around the experts' backward: the combine's gradient
  // moves what the dispatch did, the dispatch's gradient what the combine
  // did (named as the runtime names them, after the forward op).
  void experts(int r, int step, int mb, int l, int chunk, bool fwd) {
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    double factor = fwd ? 1.0 : c.backwardFactor;
    const char *work = fwd ? "fwd.experts" : "bwd.experts";
    if (c.ep == 1) {
      compute(r, base(work, Cat::Compute, step, mb, l, chunk),
              factor * c.moeExpertUs * 1e3 * tokenShare());
      return;
    }
    std::vector<int> members;
    for (int k = 0; k < c.ep; ++k)
      members.push_back(rankOf(t, d - d % c.ep + k, s));
    int g = group("ep", members);
    int me = d % c.ep, n = c.ep;
    SimPeerBytes dispatch, combine;
    for (int j = 0; j < n; ++j) {
      uint64_t toJ = (uint64_t)std::llround(c.moeDispatchBytes * memberShare(j));
      uint64_t fromJ =
          (uint64_t)std::llround(c.moeDispatchBytes * memberShare(me));
      dispatch.send.push_back(toJ);
      dispatch.recv.push_back(fromJ);
      combine.send.push_back(fromJ);
      combine.recv.push_back(toJ);
    }
    allToAll(r, base(fwd ? "fwd.ep_dispatch" : "bwd.ep_combine", Cat::Comm,
                     step, mb, l, chunk),
             g, dispatch);
    compute(r, base(work, Cat::Compute, step, mb, l, chunk),
            factor * c.moeExpertUs * 1e3 * n * memberShare(me));
    allToAll(r, base(fwd ? "fwd.ep_combine" : "bwd.ep_dispatch", Cat::Comm,
                     step, mb, l, chunk),
             g, combine);
  }

  void p2p(int r, SimOp op, bool send, int peer, int64_t tag) {
    op.kind = send ? SimOp::Send : SimOp::Recv;
    op.cat = Cat::Comm;
    op.op = send ? Op::Send : Op::Recv;
    op.peer = peer;
    op.tag = tag;
    op.bytes = scaled(c.activationBytes);
    job.programs[r].push_back(op);
  }

  //===--- Context parallelism (docs/mapp-sim.md) --------------------------===//

  // Ring messages' tags, the runtime kernel's (backend/cpu/ContextParallel).
  static constexpr int64_t kRingTag = 32001, kRingGradTag = 32002,
                           kRingDkvTag = 32003;

  bool attentionModeled() const { return c.attentionForwardNs() > 0; }
  /// A rank's share of the position-local work: its S/cp tokens.
  double tokenShare() const { return attentionModeled() ? 1.0 / c.cp : 1.0; }
  uint64_t scaled(uint64_t bytes) const {
    return uint64_t(std::llround(bytes * tokenShare()));
  }

  SimOp named(const std::string &name, Cat cat, int step, int mb, int layer,
              int chunk) {
    SimOp op = base("", cat, step, mb, layer, chunk);
    op.name = name;
    return op;
  }

  // A ring transfer: sends are non-blocking (posted before the block's
  // compute, so the transfer overlaps it); receives wait for the bytes.
  void ringMsg(int r, SimOp op, bool send, int peer, int64_t tag,
               uint64_t bytes, int g) {
    takePostGap(r, op);
    if (send) // the op after it starts a nanosecond later (takePostGap)
      postGap.insert(r);
    op.kind = send ? SimOp::Send : SimOp::Recv;
    op.cat = Cat::Comm;
    op.op = send ? Op::Send : Op::Recv;
    op.peer = peer;
    op.tag = tag;
    op.bytes = bytes;
    op.async = send;
    op.group = g; // classifies the transfer as cp in the exposure truth
    job.programs[r].push_back(op);
  }

  // A non-blocking send takes no time; the op after it starts 1 ns later,
  // so that in the trace the send does not lie inside that op (the
  // exposure's regions: mapp/monitor/Exposure.h would take an event that
  // begins with a zero-length one as a region around it).
  std::set<int> postGap;
  void takePostGap(int r, SimOp &op) {
    if (postGap.erase(r))
      op.gapNs += 1;
  }

  void cpAllToAll(int r, SimOp op, int g, uint64_t bytes) {
    coll(r, op, g, bytes);
    job.programs[r].back().op = Op::AllToAll;
  }

  // One layer's causal attention core on rank r, forward or backward.
  // `pre` names a recomputation ("recompute.").
  void attentionCore(int r, int step, int mb, int l, int chunk, bool fwd,
                     const std::string &pre) {
    double core = c.attentionForwardNs();
    if (!fwd)
      core *= c.attentionBackwardFactor > 0 ? c.attentionBackwardFactor
                                            : c.backwardFactor;
    std::string dir = pre + (fwd ? "fwd" : "bwd");
    auto op = [&](const char *what, Cat cat) {
      return named(dir + what, cat, step, mb, l, chunk);
    };
    if (c.cp == 1) {
      compute(r, op(".attn.core", Cat::Compute), core);
      return;
    }
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    int n = c.cp, me = d % n;
    std::vector<int> members;
    for (int k = 0; k < n; ++k)
      members.push_back(rankOf(t, d - me + k, s));
    int g = group("cp", members);
    if (c.cpComm == "a2a") {
      // Ulysses: sequence-sharded q, k, v become head-sharded over all S
      // rows (each member the same work: 1/cp of the heads); the output
      // goes back. The backward exchanges dout in and dq, dk, dv out.
      uint64_t q = c.headsShareBytes(c.heads / c.tp),
               kv = c.headsShareBytes(c.kvHeads / c.tp);
      std::vector<uint64_t> in = fwd ? std::vector<uint64_t>{q, kv, kv}
                                     : std::vector<uint64_t>{q};
      std::vector<uint64_t> out = fwd ? std::vector<uint64_t>{q}
                                      : std::vector<uint64_t>{q, kv, kv};
      for (uint64_t b : in)
        cpAllToAll(r, op(".cp_a2a", Cat::Comm), g, b);
      compute(r, op(".attn.core", Cat::Compute), core / n);
      for (uint64_t b : out)
        cpAllToAll(r, op(".cp_a2a", Cat::Comm), g, b);
      return;
    }
    // Ring: at step k the rank holds member (me - k)'s K/V block and does
    // its causal pairs against it; the next block travels meanwhile.
    int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
    uint64_t block = c.kvBlockBytes();
    for (int k = 0; k < n; ++k) {
      int src = (me - k + n) % n;
      bool more = k < n - 1;
      if (more)
        ringMsg(r, op(".cp_ring", Cat::Comm), true, next,
                fwd ? kRingTag : kRingGradTag, block, g);
      compute(r, op(".attn.core", Cat::Compute),
              core * c.causalPairShare(me, src));
      if (!fwd) {
        // dK/dV of the block: the partial sum of the members before this
        // one comes in, this member's part is added, the sum goes on.
        if (k > 0)
          ringMsg(r, op(".cp_ring.grad", Cat::Comm), false, prev, kRingDkvTag,
                  block, g);
        ringMsg(r, op(".cp_ring.grad", Cat::Comm), true, next, kRingDkvTag,
                block, g);
      }
      if (more)
        ringMsg(r, op(".cp_ring", Cat::Comm), false, prev,
                fwd ? kRingTag : kRingGradTag, block, g);
    }
    if (!fwd) // the rank's own block's full dK/dV comes home
      ringMsg(r, op(".cp_ring.grad", Cat::Comm), false, prev, kRingDkvTag,
              block, g);
  }

  // One layer's forward on rank r (again, under full recomputation, at the
  // start of its backward).
  void layerForward(int r, int step, int mb, int l, int chunk, int tpg,
                    bool recompute) {
    std::string pre = recompute ? "recompute." : "";
    double lf = c.layerForwardNs() * tokenShare();
    uint64_t tpBytes = scaled(c.tpAllreduceBytes);
    compute(r, named(pre + "fwd.attn", Cat::Compute, step, mb, l, chunk),
            0.4 * lf);
    if (attentionModeled())
      attentionCore(r, step, mb, l, chunk, true, pre);
    if (tpg >= 0)
      coll(r, named(pre + "fwd.attn.allreduce", Cat::Comm, step, mb, l, chunk),
           tpg, tpBytes);
    compute(r, named(pre + "fwd.mlp", Cat::Compute, step, mb, l, chunk),
            0.6 * lf);
    if (c.moeExperts > 0)
      experts(r, step, mb, l, chunk, true);
    if (tpg >= 0)
      coll(r, named(pre + "fwd.mlp.allreduce", Cat::Comm, step, mb, l, chunk),
           tpg, tpBytes);
  }

  // One forward or backward task of (chunk, mb) on rank r.
  void task(int r, int step, int chunk, int mb, bool fwd) {
    phase = fwd ? Phase::Forward : Phase::Backward;
    taskOps(r, step, chunk, mb, fwd);
    phase = Phase::None;
  }

  void taskOps(int r, int step, int chunk, int mb, bool fwd) {
    int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
    int V = c.pp * c.chunks, vs = chunk * c.pp + s;
    const int l0 = c.firstLayer(vs), l1 = c.firstLayer(vs + 1);
    int prev = rankOf(t, d, (s + c.pp - 1) % c.pp);
    int next = rankOf(t, d, (s + 1) % c.pp);
    int64_t M = c.microbatches;
    int tpg = c.tp > 1 ? group("tp", tpMembers(d, s)) : -1;
    double lf = c.layerForwardNs() * tokenShare();
    if (fwd) {
      if (vs == 0) {
        if (c.dataUs > 0)
          compute(r, base("data.load", Cat::Data, step, mb, -1, chunk),
                  c.dataUs * 1e3 * tokenShare());
        if (c.embeddingUs > 0)
          compute(r, base("fwd.embedding", Cat::Compute, step, mb, -1, chunk),
                  c.embeddingUs * 1e3 * tokenShare());
      } else {
        p2p(r, base("recv.fwd", Cat::Comm, step, mb, -1, chunk), false, prev,
            (2 * vs) * M + mb);
      }
      for (int l = l0; l < l1; ++l)
        layerForward(r, step, mb, l, chunk, tpg, false);
      if (vs == V - 1) {
        if (c.lossUs > 0)
          compute(r, base("fwd.loss", Cat::Compute, step, mb, -1, chunk),
                  c.lossUs * 1e3 * tokenShare());
      } else {
        p2p(r, base("send.fwd", Cat::Comm, step, mb, -1, chunk), true, next,
            (2 * (vs + 1)) * M + mb);
      }
      return;
    }
    if (vs != V - 1)
      p2p(r, base("recv.bwd", Cat::Comm, step, mb, -1, chunk), false, next,
          (2 * vs + 1) * M + mb);
    double bf = c.backwardFactor * lf;
    uint64_t tpBytes = scaled(c.tpAllreduceBytes);
    for (int l = l1 - 1; l >= l0; --l) {
      if (c.recomputeFull)
        layerForward(r, step, mb, l, chunk, tpg, true);
      if (c.moeExperts > 0)
        experts(r, step, mb, l, chunk, false);
      compute(r, base("bwd.mlp", Cat::Compute, step, mb, l, chunk), 0.6 * bf);
      if (tpg >= 0)
        coll(r, base("bwd.mlp.allreduce", Cat::Comm, step, mb, l, chunk), tpg,
             tpBytes);
      if (attentionModeled())
        attentionCore(r, step, mb, l, chunk, false, "");
      compute(r, base("bwd.attn", Cat::Compute, step, mb, l, chunk), 0.4 * bf);
      if (tpg >= 0)
        coll(r, base("bwd.attn.allreduce", Cat::Comm, step, mb, l, chunk), tpg,
             tpBytes);
      if (c.overlapGradReduce && c.dp > 1 && mb == M - 1)
        gradBucket(r, step, chunk, l, l1 - l0);
    }
    if (vs != 0)
      p2p(r, base("send.bwd", Cat::Comm, step, mb, -1, chunk), true, prev,
          (2 * (vs - 1) + 1) * M + mb);
    else if (c.embeddingUs > 0)
      compute(r, base("bwd.embedding", Cat::Compute, step, mb, -1, chunk),
              c.embeddingUs * 1e3 * tokenShare());
  }

  // Overlapped gradient reduction: the layer's gradients are complete after
  // the last microbatch's backward of it; the rank's communication stream
  // (program R + r) all-reduces them over its DP peers' streams while the
  // compute stream goes on.
  void gradBucket(int r, int step, int chunk, int layer, int layersPerChunk) {
    int t = r % c.tp, s = r / (c.tp * c.dp);
    std::vector<int> m;
    for (int dd = 0; dd < c.dp; ++dd)
      m.push_back(R + rankOf(t, dd, s));
    streamSignal(r, R + r, step);
    SimOp op = base("grad.allreduce", Cat::Comm, step, -1, layer, chunk);
    op.phase = Phase::None;
    coll(R + r, op, group("dp", m),
         c.dpAllreduceBytes / (c.chunks * layersPerChunk));
  }

  // Program `to` waits here until `from` reaches this point.
  void streamSignal(int from, int to, int step) {
    SimOp s = base("stream.signal", Cat::Comm, step, -1, -1, -1);
    s.kind = SimOp::Send;
    s.op = Op::Send;
    s.peer = to;
    s.tag = 0;
    s.streamSync = true;
    job.programs[from].push_back(s);
    s.kind = SimOp::Recv;
    s.op = Op::Recv;
    s.peer = from;
    job.programs[to].push_back(s);
  }

  std::vector<int> tpMembers(int d, int s) const {
    std::vector<int> m;
    for (int t = 0; t < c.tp; ++t)
      m.push_back(rankOf(t, d, s));
    return m;
  }

  // The (forward?, chunk, mb) task order of pipeline stage s.
  std::vector<std::tuple<bool, int, int>> order(int s) const {
    std::vector<std::tuple<bool, int, int>> o;
    int M = c.microbatches, v = c.chunks, p = c.pp;
    if (c.schedule == "gpipe") {
      for (int ch = 0; ch < v; ++ch)
        for (int m = 0; m < M; ++m)
          o.push_back({true, ch, m});
      for (int ch = v - 1; ch >= 0; --ch)
        for (int m = 0; m < M; ++m)
          o.push_back({false, ch, m});
      return o;
    }
    if (c.schedule == "1f1b") {
      int warm = std::min(p - s - 1, M);
      for (int m = 0; m < warm; ++m)
        o.push_back({true, 0, m});
      for (int m = 0; m < M - warm; ++m) {
        o.push_back({true, 0, m + warm});
        o.push_back({false, 0, m});
      }
      for (int m = M - warm; m < M; ++m)
        o.push_back({false, 0, m});
      return o;
    }
    // Megatron's interleaved 1F1B.
    int total = M * v;
    int warm = std::min((p - s - 1) * 2 + (v - 1) * p, total);
    auto chunkOf = [&](int k, bool fwd) {
      int ch = (k % (p * v)) / p;
      return fwd ? ch : v - 1 - ch;
    };
    auto mbOf = [&](int k) { return (k / (p * v)) * p + k % p; };
    for (int k = 0; k < warm; ++k)
      o.push_back({true, chunkOf(k, true), mbOf(k)});
    for (int k = 0; k < total - warm; ++k) {
      o.push_back({true, chunkOf(k + warm, true), mbOf(k + warm)});
      o.push_back({false, chunkOf(k, false), mbOf(k)});
    }
    for (int k = total - warm; k < total; ++k)
      o.push_back({false, chunkOf(k, false), mbOf(k)});
    return o;
  }
};
} // namespace

bool mapp::scan::buildSimJob(const SimConfig &c, SimJob &job,
                             std::string *error) {
  int R = c.tp * c.pp * c.dp;
  job = SimJob();
  job.world = R;
  job.tp = c.tp;
  job.pp = c.pp;
  job.dp = c.dp;
  // With overlapped gradient reduction each rank has a communication
  // stream: program R + r.
  int programs = c.overlapGradReduce && c.dp > 1 ? 2 * R : R;
  job.programs.assign(programs, {});
  for (int r = 0; R + r < programs; ++r) {
    job.streamOwner.push_back(r);
    job.streamName.push_back("comm");
  }
  Builder b{c, job, R, {}, std::vector<std::map<int, int64_t>>(programs)};
  for (int step = 0; step < c.steps; ++step)
    for (int r = 0; r < R; ++r) {
      int t = r % c.tp, d = (r / c.tp) % c.dp, s = r / (c.tp * c.dp);
      for (auto [fwd, ch, mb] : b.order(s))
        b.task(r, step, ch, mb, fwd);
      if (c.dp > 1 && c.overlapGradReduce) {
        b.streamSignal(R + r, r, step); // the update waits for the buckets
      } else if (c.dp > 1) {
        std::vector<int> m;
        for (int dd = 0; dd < c.dp; ++dd)
          m.push_back(b.rankOf(t, dd, s));
        int g = b.group("dp", m);
        for (int ch = 0; ch < c.chunks; ++ch)
          b.coll(r, b.base("grad.allreduce", Cat::Comm, step, -1, -1, ch), g,
                 c.dpAllreduceBytes / c.chunks);
      }
      if (c.gradNormAllreduce && c.tp * c.pp > 1) {
        std::vector<int> m;
        for (int ss = 0; ss < c.pp; ++ss)
          for (int tt = 0; tt < c.tp; ++tt)
            m.push_back(b.rankOf(tt, d, ss));
        b.coll(r, b.base("grad-norm.allreduce", Cat::Comm, step, -1, -1, -1),
               b.group("mp", m), 8);
      }
      if (c.optimizerUs > 0)
        b.compute(r, b.base("optimizer.step", Cat::Optimizer, step, -1, -1, -1),
                  c.optimizerUs * 1e3);
    }
  // Memory: what a stage stashes per microbatch in flight (its layers'
  // activations over the rank's S/cp tokens) at the schedule's worst point.
  if (c.persistentBytes || c.layerStashBytes || c.workingBytes) {
    double share = b.tokenShare();
    for (int r = 0; r < R; ++r) {
      int s = r / (c.tp * c.dp);
      double inFlight = 0, peak = 0;
      for (auto [fwd, ch, mb] : b.order(s)) {
        int vs = ch * c.pp + s;
        int layers = c.firstLayer(vs + 1) - c.firstLayer(vs);
        inFlight += (fwd ? 1 : -1) * double(layers) * c.layerStashBytes;
        peak = std::max(peak, inFlight);
      }
      job.peakBytes.push_back(
          c.persistentBytes +
          uint64_t(std::llround((peak + c.workingBytes) * share)));
    }
  }
  (void)error;
  return true;
}
