//===- Search.cpp - price layouts and search them -------------------------===//

#include "mapp/cost/Search.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

using namespace mapp::cost;
using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

double ModelDims::denseLayerParams() const {
  double h = hidden, kv = double(kvHeads) * headDim();
  double attn = h * (h + 2 * kv) + h * h;       // qkv, proj
  double norms = llama ? 2 * h : 4 * h;         // weights (+ biases)
  double biases = llama ? 0 : (h + 2 * kv) + h; // qkv, proj
  if (experts > 0)
    return attn + norms + biases + h * experts; // + the router
  double mlp = llama ? 3 * h * ffn : 2 * h * ffn + ffn + h;
  return attn + norms + biases + mlp;
}

double ModelDims::layerParams() const {
  double p = denseLayerParams();
  if (experts > 0)
    p += experts * (llama ? 3.0 : 2.0) * hidden * moeFfn;
  return p;
}

double ModelDims::embeddingParams() const {
  double e = double(vocab) * hidden + (llama ? 0 : double(seq) * hidden);
  if (!tiedEmbeddings)
    e += double(vocab) * hidden;
  return e + 2.0 * hidden; // final norm
}

double ModelDims::totalParams() const {
  return layers * layerParams() + embeddingParams();
}

namespace {

/// The matrix products of one layer's forward per rank, at their shapes
/// (a dense layer's split over tp, a MoE block's whole on every tp rank):
/// a gemm_rates profile prices each at its smallest dimension's rate.
/// Experts over ep: each member runs experts / ep of them on ep times the
/// rows each.
std::vector<GemmShape> layerGemms(const ModelDims &m, const Layout &l,
                                  double tokens) {
  const double h = m.hidden, t = l.tp, n = tokens;
  const double kv = double(m.kvHeads) * m.headDim();
  // GPT's attention input is one qkv product; the LLaMA family's q, k
  // and v are three (k and v at the key/value heads' width).
  std::vector<GemmShape> g = {{n, h, h / t}};
  if (m.llama) {
    g.push_back({n, h / t, h});
    g.push_back({n, kv / t, h, 2});
  } else {
    g.push_back({n, (h + 2 * kv) / t, h});
  }
  const double mlpMats = m.llama ? 3 : 2; // gate and up in, down out
  if (m.experts > 0) {
    // The MoE block is whole on every tp rank (the compiler splits
    // attention over tp, not the router or the experts).
    g.push_back({n, double(m.experts), h}); // the router
    double rows = n * m.topk * l.ep / m.experts;
    double perRank = double(m.experts) / l.ep;
    g.push_back({rows, m.moeFfn, h, (mlpMats - 1) * perRank});
    g.push_back({rows, h, m.moeFfn, perRank});
  } else {
    g.push_back({n, m.ffn / t, h, mlpMats - 1});
    g.push_back({n, h, m.ffn / t});
  }
  return g;
}

/// Forward FLOPs of one layer for `tokens` tokens of sequence `seq`:
/// its matrix products (layerGemms' on one rank) and attention's batched
/// products.
struct LayerFlops {
  double gemm = 0, attention = 0;
};
LayerFlops layerForwardFlops(const ModelDims &m, double tokens) {
  LayerFlops f;
  for (const GemmShape &g : layerGemms(m, Layout{}, tokens))
    f.gemm += g.flops();
  f.attention = 4 * tokens * m.seq * m.hidden; // scores and values, full square
  return f;
}

} // namespace

double ModelDims::trainFlopsPerSequence() const {
  LayerFlops f = layerForwardFlops(*this, seq);
  double head = 2.0 * seq * hidden * vocab;
  return 3 * (layers * (f.gemm + f.attention) + head);
}

bool mapp::cost::parseModelDims(const std::string &text,
                                const std::string &name, ModelDims &out,
                                std::string *error) {
  auto fail = [&](const std::string &key, const std::string &msg) {
    if (error)
      *error = name + ": key '" + key + "': " + msg;
    return false;
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception &e) {
    if (error)
      *error = name + ": invalid JSON: " + e.what();
    return false;
  }
  if (!j.is_object()) {
    if (error)
      *error = name + ": expected a JSON object";
    return false;
  }
  out = ModelDims();
  out.name = name;
  std::map<std::string, int64_t *> ints = {
      {"num_layers", &out.layers},
      {"hidden_size", &out.hidden},
      {"num_attention_heads", &out.heads},
      {"num_query_groups", &out.kvHeads},
      {"ffn_hidden_size", &out.ffn},
      {"vocab_size", &out.vocab},
      {"seq_length", &out.seq},
      {"num_moe_experts", &out.experts},
      {"moe_router_topk", &out.topk},
      {"moe_ffn_hidden_size", &out.moeFfn}};
  // Keys of a GPT config that do not change the cost.
  static const std::set<std::string> ignored = {
      "_comment", "micro_batch_size", "dtype", "layernorm_epsilon",
      "gelu_approximate", "rotary_base", "hidden_dropout", "attention_dropout",
      "make_vocab_size_divisible_by", "seed", "moe_aux_loss_coeff",
      "moe_z_loss_coeff", "moe_capacity_factor", "moe_layer_freq"};
  for (auto &[k, v] : j.items()) {
    if (ignored.count(k))
      continue;
    if (k == "variant") {
      if (!v.is_string() || (v != "gpt" && v != "llama"))
        return fail(k, "expected \"gpt\" or \"llama\"");
      out.llama = v == "llama";
    } else if (k == "tie_embeddings") {
      if (!v.is_boolean())
        return fail(k, "expected true or false");
      out.tiedEmbeddings = v.get<bool>();
    } else if (auto it = ints.find(k); it != ints.end()) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return fail(k, "expected an integer >= 0, got " + v.dump());
      *it->second = v.get<int64_t>();
    } else
      return fail(k, "unknown key");
  }
  for (const char *k : {"num_layers", "hidden_size", "num_attention_heads",
                        "vocab_size", "seq_length"})
    if (*ints[k] <= 0)
      return fail(k, "missing or 0");
  if (out.hidden % out.heads)
    return fail("hidden_size", "not a multiple of num_attention_heads");
  if (out.kvHeads == 0)
    out.kvHeads = out.heads;
  if (out.ffn == 0)
    out.ffn = 4 * out.hidden;
  if (out.experts > 0 && out.moeFfn == 0)
    out.moeFfn = out.ffn;
  return true;
}

const char *mapp::cost::recomputeName(Recompute r) {
  return r == Recompute::None ? "none"
         : r == Recompute::Selective ? "selective"
                                     : "full";
}

std::string Layout::pipelineOptions() const {
  std::ostringstream os;
  os << "tp=" << tp << " pp=" << pp << " dp=" << dp;
  if (ep > 1)
    os << " ep=" << ep;
  if (chunks > 1)
    os << " chunks=" << chunks;
  os << " microbatches=" << microbatches << " schedule=" << schedule;
  if (recompute != Recompute::None)
    os << " recompute=" << recomputeName(recompute);
  if (zero1)
    os << " zero1=true";
  return os.str();
}

std::string Layout::brief() const {
  std::ostringstream os;
  os << "tp" << tp << " pp" << pp << " dp" << dp;
  if (ep > 1)
    os << " ep" << ep;
  if (chunks > 1)
    os << " v" << chunks;
  os << " mbs" << microBatch << "x" << microbatches << " " << schedule;
  if (recompute != Recompute::None)
    os << " rc=" << recomputeName(recompute);
  if (zero1)
    os << " zero1";
  if (compute != DType::F32)
    os << " " << dtypeName(compute);
  if (storage != DType::F32)
    os << " store=" << dtypeName(storage);
  return os.str();
}

//===----------------------------------------------------------------------===//
// Validity and pricing
//===----------------------------------------------------------------------===//

namespace {

bool chunked(const std::string &s) {
  return s == "interleaved" || s == "dfc" || s == "bfc" || s == "adaptive";
}

/// Microbatches whose arena slot stage 0 (the worst stage) holds at once:
/// the memory planner gives each in-flight microbatch one slot (its stash
/// and its working set), counted from the schedule tables
/// (lib/Transforms/DPP/Schedules.cpp); these are their closed forms.
double slotsInFlight(const Layout &l) {
  int p = l.pp, v = l.chunks, m = l.microbatches;
  if (l.schedule == "gpipe" || l.schedule == "bfc")
    return m;
  if (v == 1)
    return std::min(m, p); // 1f1b, zb-h1
  // Interleaved (group p): Megatron's warm-up of stage 0, 2(p-1) + (v-1)p
  // chunk-forwards, plus the one in flight, over v chunks a microbatch.
  return std::min<double>(m, std::ceil((2.0 * (p - 1) + (v - 1) * p + 1) / v));
}

} // namespace

bool mapp::cost::validLayout(const ModelDims &m, const Layout &l, int world,
                             int globalBatch, const Cluster &c,
                             bool tpInsideNode, std::string *why) {
  auto no = [&](const std::string &s) {
    if (why)
      *why = s;
    return false;
  };
  if (l.tp * l.pp * l.dp != world)
    return no("tp x pp x dp is not the world size");
  if (l.microBatch * l.microbatches * l.dp != globalBatch)
    return no("micro-batch x microbatches x dp is not the global batch");
  if (m.heads % l.tp || m.hidden % l.tp || m.ffn % l.tp)
    return no("tp does not divide the heads, hidden or ffn size");
  if (m.kvHeads % l.tp && l.tp % m.kvHeads)
    return no("tp neither divides nor is a multiple of the key/value heads");
  if (m.vocab % l.tp)
    return no("tp does not divide the vocabulary");
  if (tpInsideNode && l.tp > c.devicesPerNode)
    return no("tp spans nodes");
  if (l.pp * l.chunks > m.layers)
    return no("more pipeline stages than layers");
  if (l.ep > 1 && (m.experts == 0 || l.dp % l.ep || m.experts % l.ep))
    return no("ep must divide dp and the experts");
  if (l.ep > 1 && l.zero1)
    return no("zero1 with ep > 1 is not supported");
  if (l.zero1 && l.dp == 1)
    return no("zero1 needs dp > 1");
  bool chunk = chunked(l.schedule);
  if (!chunk && l.chunks != 1)
    return no("schedule runs one chunk per stage");
  if (chunk && l.chunks == 1)
    return no("one chunk is plain 1f1b");
  if (l.pp == 1 && l.schedule != "1f1b")
    return no("one stage has no schedule to choose");
  if (chunk && (l.microbatches < l.pp ||
                (l.schedule != "bfc" && l.microbatches % l.pp)))
    return no("interleaved schedules need microbatches a multiple of pp");
  return true;
}

Prediction mapp::cost::predict(const ModelDims &m, const Layout &l,
                               const Cluster &c, const Profile &p) {
  Costs costs(p);
  Prediction out;
  const double t = l.tp, tokens = double(l.microBatch) * m.seq;
  const double e = l.compute == DType::F32 ? 4 : 2; // bytes an element
  const double h = m.hidden, n = tokens;
  const bool tpIntra = l.tp <= c.devicesPerNode;
  // A stage's layers: the partition gives the first stages the extra ones.
  const int stages = l.pp * l.chunks;
  const double layersPerStage = std::ceil(double(m.layers) / stages) * l.chunks;

  // --- Compute of one layer, one microbatch (per rank) ------------------
  LayerFlops lf = layerForwardFlops(m, tokens);
  double attn = lf.attention / t;
  double gemmNs = costs.gemmNs(layerGemms(m, l, tokens), l.compute);
  // Experts over ep: balanced routing gives each member the same rows in
  // all, so the per-rank FLOPs do not change with ep.
  // Streamed bytes: norms and residuals (replicated over tp), the tp-split
  // activations, attention's score rows (where they leave the chip), the
  // MLP's activation.
  double width = m.experts > 0 ? double(m.topk) * m.moeFfn : double(m.ffn);
  // The MLP's share of a tp rank: a dense MLP's 1/tp, a MoE block whole.
  // Over ep, the experts' elementwise ops run on the whole capacity buffer
  // (room for every member routing all its rows here: ep times the routed
  // rows; the grouped products multiply only the routed ones).
  const double mlpT = m.experts > 0 ? 1.0 / l.ep : t;
  double scoreBytes =
      p.attentionScoresInMemory ? e * 4 * n * m.seq * m.heads / t : 0;
  double fwdBytes = e * (10 * n * h + 6 * n * h / t + 3 * n * width / mlpT) +
                    scoreBytes;
  double fwdOps = m.layerForwardOps;
  // The MLP's activation function (its gradient costs as much) beyond
  // its bytes, which fwdBytes holds (in, out; the gradient reads two).
  double actElems = n * width / mlpT;
  double actNs = costs.activationNs(actElems, 2 * e * actElems);
  double fwdNs =
      gemmNs + actNs + costs.bulkNs(0, attn, fwdBytes, fwdOps, l.compute);
  double bwdNs = 2 * gemmNs + actNs +
                 costs.bulkNs(0, 2 * attn, 2 * fwdBytes, 2 * fwdOps, l.compute);
  if (l.recompute == Recompute::Full)
    bwdNs += fwdNs;
  else if (l.recompute == Recompute::Selective)
    bwdNs += costs.bulkNs(0, attn, scoreBytes, fwdOps * 0.25, l.compute);
  // Tensor parallelism: 2 all-reduces of [n, h] forward, 2 backward (a
  // MoE layer: attention's only). Each is an instruction too, beside a
  // copy_to_group (the identity whose gradient is one of them): 8
  // instructions per layer, fwd+bwd (a MoE layer: 4).
  const double tpBlocks = m.experts > 0 ? 1 : 2;
  double tpNs = 2 * tpBlocks *
                    costs.collectiveNs(Costs::Coll::AllReduce, e * n * h,
                                       l.tp, tpIntra) +
                (l.tp > 1 ? costs.bulkNs(0, 0, 0, 4 * tpBlocks, l.compute) : 0);
  // Experts over ep: dispatch and combine, forward and backward.
  double epNs = 0;
  if (m.experts > 0 && l.ep > 1) {
    bool epIntra = l.tp * l.ep <= c.devicesPerNode;
    epNs = 4 * costs.collectiveNs(Costs::Coll::AllToAll,
                                  e * n * m.topk * h * l.ep, l.ep,
                                  epIntra);
  }
  double layerNs = fwdNs + bwdNs + tpNs + epNs;
  // Embedding (first stage) and the head with the loss (last stage).
  double headGemmNs = costs.gemmNs({{n, m.vocab / t, h}}, l.compute);
  double headNs =
      3 * headGemmNs +
      costs.bulkNs(0, 0, e * (8 * n * m.vocab / t + 4 * n * h), 12,
                   l.compute) +
      costs.bulkNs(0, 0, e * (8 * n * m.vocab / t + 4 * n * h), 20,
                   l.compute) +
      2 * costs.collectiveNs(Costs::Coll::AllReduce, e * n * h, l.tp, tpIntra);
  double embedNs = costs.bulkNs(0, 0, 6 * e * n * h, 6, l.compute);

  // --- The pipeline ------------------------------------------------------
  // Per microbatch per stage (all its chunks); stages differ only in the
  // embedding and the head, the partition evens the layers.
  std::vector<double> stageNs(l.pp, layersPerStage * layerNs);
  if (l.pp > 1 && m.layers % stages) // the last stages get fewer layers
    stageNs.back() = (m.layers - (stages - l.chunks) * std::ceil(double(m.layers) / stages)) *
                     layerNs;
  stageNs.front() += embedNs;
  stageNs.back() += headNs;
  double share = costs.shareFactor(l.tp * l.pp * l.dp);
  double sum = 0, worst = 0;
  for (double s : stageNs) {
    sum += s;
    worst = std::max(worst, s);
  }
  const double mb = l.microbatches, v = l.chunks;
  // One microbatch's message between stages, each hop forward and back.
  double hopNs = l.pp > 1 ? costs.p2pNs(e * n * h, c.devicesPerNode >= l.tp * l.pp)
                          : 0;
  if (l.pp > 1 && p.haveP2p)
    hopNs = p.p2p.latencyUs * 1e3 + e * n * h * 8 / p.p2p.gbps;
  double fill = (sum - worst) / v; // the pipeline's ramp (bubble)
  if (l.schedule == "zb-h1") {
    // Zero bubble H1: the weight gradients fill the cool-down, the bubble
    // shrinks to (p-1)(F + Bi - W) ~ (p-1) F.
    double fShare = (fwdNs) / std::max(layerNs, 1.0);
    fill *= std::min(1.0, fShare + 0.5 * (tpNs + epNs) / std::max(layerNs, 1.0));
  }
  double pipeNs = mb * worst + fill;
  double p2pNs = l.pp > 1 ? 2 * (mb * v + l.pp - 1) * hopNs : 0;
  double computeNs = pipeNs * share;
  // With cores shared, the busy ranks run faster during others' bubbles
  // (unless the waiting ones poll): the step is at least the machine's
  // total work over its cores.
  if (share > 1 && !p.busyWait) {
    double totalWork = sum * mb * l.tp * l.dp / p.sharedCores;
    computeNs = std::max(pipeNs, totalWork);
  }

  // --- Data parallelism and the optimizer ----------------------------------
  double stageParams = layersPerStage * m.layerParams() / t;
  if (m.experts > 0) // the experts whole on every tp rank, split over ep
    stageParams = layersPerStage *
                  (m.denseLayerParams() / t +
                   (m.layerParams() - m.denseLayerParams()) / l.ep);
  double embedParams = (double(m.vocab) * h / t + (m.llama ? 0 : m.seq * h));
  double firstParams = stageParams + embedParams;
  double lastParams = stageParams + (l.pp > 1 || !m.tiedEmbeddings
                                         ? double(m.vocab) * h / t : 0);
  double maxParams = std::max(firstParams, lastParams);
  bool dpIntra = l.tp * l.dp <= c.devicesPerNode;
  double gradBytes = 4 * maxParams;
  double dpNs = l.zero1 ? costs.collectiveNs(Costs::Coll::ReduceScatter,
                                             gradBytes, l.dp, dpIntra) +
                              costs.collectiveNs(Costs::Coll::AllGather,
                                                 gradBytes, l.dp, dpIntra)
                        : costs.collectiveNs(Costs::Coll::AllReduce, gradBytes,
                                             l.dp, dpIntra);
  // AdamW streams parameter, gradient and two moments in and out.
  double optNs = costs.bulkNs(0, 0, 28 * maxParams / (l.zero1 ? l.dp : 1),
                              8, DType::F32) * share;

  out.computeMs = computeNs * 1e-6;
  out.exposedCommMs = (p2pNs + dpNs) * 1e-6 +
                      (tpNs + epNs) * layersPerStage * mb * 1e-6;
  double stepNs = computeNs + p2pNs * share + dpNs + optNs;
  out.stepMs = stepNs * 1e-6;
  out.tokensPerS = double(l.microBatch) * mb * l.dp * m.seq / (stepNs * 1e-9);
  out.bubbleFraction = l.pp > 1 ? fill / std::max(pipeNs, 1.0) : 0;
  out.mfu = m.trainFlopsPerSequence() * l.microBatch * mb * l.dp /
            (stepNs * 1e-9) / (p.peakTflops * 1e12 * l.tp * l.pp * l.dp);

  // --- Memory of the worst stage (bytes) --------------------------------
  double stateBytesPerParam =
      4 /*param*/ + 4 /*grad*/ + 8.0 / (l.zero1 ? l.dp : 1) /*AdamW*/;
  out.paramStateBytes = maxParams * stateBytesPerParam;
  double se = l.storage == DType::F32 ? 4 : (p.bf16Storage ? 2 : 4);
  // Saved per layer and microbatch: norms' inputs and outputs and the
  // residual stream (replicated), q/k/v, attention output, the MLP's two
  // wide tensors (tp-split).
  double savedElems;
  if (l.recompute == Recompute::Full)
    savedElems = n * h;
  else if (l.recompute == Recompute::Selective)
    savedElems = 6 * n * h + 4 * n * h / t + 2 * n * width / mlpT;
  else
    savedElems = 6 * n * h + 5 * n * h / t + 2 * n * width / mlpT +
                 n * m.heads / t;
  double stash = savedElems * se * layersPerStage;
  // A slot also holds the working set of the widest op sequence: a layer's
  // score rows and MLP activations, or the head's logits and gradient.
  double layerWork = se * (2 * n * m.seq * m.heads / t + 4 * n * width / mlpT +
                           8 * n * h);
  double headWork = 4 * 3 * n * m.vocab / t;
  double slots = slotsInFlight(l);
  out.activationBytes = stash * slots;
  out.workspaceBytes = std::max(layerWork, headWork) * slots;
  // Beside the plan: a low-precision backend's bf16 shadow of each weight
  // and the bf16 copy of the logits' gradient for the head's GEMMs
  // (measured on an H100: the device peak is the planner's plus these and
  // the reserve, within 0.05 GiB; full recomputation needed up to 0.8 GiB
  // less).
  double lowPrecision = l.compute == DType::F32 ? 0 : 2;
  out.outsidePlanBytes = lowPrecision * (maxParams + n * double(m.vocab) / t) +
                         p.runtimeReserveGiB * 1073741824.0;
  out.peakBytes = out.paramStateBytes + out.activationBytes +
                  out.workspaceBytes + out.outsidePlanBytes;
  return out;
}

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0)
      d.push_back(i);
  return d;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

/// A size in the largest unit that shows it (a cap of 1 MiB read "0.00
/// GiB" in the no-fit error).
std::string readableBytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024 * 0.995)
    return gib(bytes);
  char buf[32];
  if (bytes >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

/// The knob that would lower the smallest layout's memory most.
std::string memoryKnob(const ModelDims &m, const Ranked &r) {
  const Prediction &p = r.pred;
  const Layout &l = r.layout;
  if (p.activationBytes >= p.paramStateBytes) {
    if (l.recompute != Recompute::Full)
      return "activations dominate: allow recompute=full";
    return "activations dominate: a smaller global batch or sequence";
  }
  if (!l.zero1 && l.dp > 1 && m.experts == 0)
    return "parameter and optimizer state dominate: allow zero1";
  return "parameter and optimizer state dominate: more devices (a larger "
         "world for more tp/pp) or a larger mem-cap-gib";
}

} // namespace

bool mapp::cost::search(const SearchRequest &req, SearchResult &out,
                        std::string *error) {
  auto t0 = std::chrono::steady_clock::now();
  out = SearchResult();
  const ModelDims &m = req.model;
  const SearchSpace &sp = req.space;
  auto fail = [&](const std::string &s) {
    if (error)
      *error = s;
    return false;
  };
  if (req.world < 1)
    return fail("world must be >= 1");
  if (req.globalBatch < 1)
    return fail("global-batch must be >= 1");
  double cap = req.memCapBytes > 0
                   ? req.memCapBytes
                   : req.profile.memoryGiB * 1024.0 * 1024 * 1024;
  std::vector<DType> computes = sp.computes, storages = sp.storages;
  if (computes.empty())
    computes.push_back(req.profile.gemmTflopsBf16 > 0 ? DType::BF16
                                                      : DType::F32);
  if (storages.empty()) {
    storages.push_back(DType::F32);
    if (req.profile.bf16Storage)
      storages.push_back(DType::BF16);
  }
  std::map<std::string, size_t> rejected;
  std::vector<Ranked> all;
  bool anyFactorization = false;
  out.smallest.pred.peakBytes = INFINITY;
  std::vector<int> dpChoices = divisors(req.world);
  for (int tp : divisors(req.world)) {
    if (sp.maxTp && tp > sp.maxTp)
      continue;
    for (int pp : divisors(req.world / tp)) {
      if (sp.maxPp && pp > sp.maxPp)
        continue;
      int dp = req.world / tp / pp;
      Layout base;
      base.tp = tp;
      base.pp = pp;
      base.dp = dp;
      std::string why;
      // The layout's degrees alone (micro-batch 1, 1f1b) decide most
      // rejections: count them once per factorization.
      Layout probe = base;
      probe.microbatches = 0;
      if (req.globalBatch % dp) {
        ++rejected["dp does not divide the global batch"];
        continue;
      }
      probe.microbatches = req.globalBatch / dp;
      if (!validLayout(m, probe, req.world, req.globalBatch, req.cluster,
                       sp.tpInsideNode, &why)) {
        ++rejected[why];
        continue;
      }
      anyFactorization = true;
      int perReplica = req.globalBatch / dp;
      std::vector<int> mbsChoices = sp.microBatches;
      if (mbsChoices.empty())
        for (int d : divisors(perReplica))
          if (d <= 16)
            mbsChoices.push_back(d);
      std::vector<int> eps{1};
      if (m.experts > 0)
        for (int e : divisors(dp))
          if (e > 1 && m.experts % e == 0)
            eps.push_back(e);
      for (int mbs : mbsChoices) {
        if (perReplica % mbs)
          continue;
        for (int ep : eps)
          for (const std::string &sched : sp.schedules)
            for (int v : sp.chunks)
              for (Recompute rc : sp.recomputes)
                for (int z = 0; z <= (sp.zero1 ? 1 : 0); ++z)
                  for (DType cd : computes)
                    for (DType sd : storages) {
                      Layout l = base;
                      l.ep = ep;
                      l.microBatch = mbs;
                      l.microbatches = perReplica / mbs;
                      l.schedule = sched;
                      l.chunks = v;
                      l.recompute = rc;
                      l.zero1 = z;
                      l.compute = cd;
                      l.storage = sd;
                      if (!validLayout(m, l, req.world, req.globalBatch,
                                       req.cluster, sp.tpInsideNode, &why)) {
                        ++rejected[why];
                        continue;
                      }
                      if (!sp.allowUnevenStages && m.layers % (pp * v)) {
                        ++rejected["layers not a multiple of pp x chunks"];
                        continue;
                      }
                      Ranked r{l, predict(m, l, req.cluster, req.profile)};
                      ++out.considered;
                      // Physics: no layout beats the device's peak.
                      if (r.pred.mfu > 1.0)
                        return fail("cost model error: layout " + l.brief() +
                                    " predicts " +
                                    std::to_string(r.pred.mfu * 100) +
                                    "% of the " + req.profile.deviceKind +
                                    "'s peak (" +
                                    std::to_string(req.profile.peakTflops) +
                                    " TFLOP/s): impossible");
                      if (r.pred.peakBytes < out.smallest.pred.peakBytes)
                        out.smallest = r;
                      if (r.pred.peakBytes > cap * (1 + req.capSlack)) {
                        ++out.overCap;
                        continue;
                      }
                      r.overCapPredicted = r.pred.peakBytes > cap;
                      all.push_back(r);
                    }
      }
    }
  }
  for (auto &[k, n] : rejected)
    out.rejected.push_back({k, n});
  out.feasible = std::count_if(all.begin(), all.end(), [](const Ranked &r) {
    return !r.overCapPredicted;
  });
  out.searchSeconds = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
  if (!anyFactorization) {
    std::string reasons;
    for (auto &[k, n] : out.rejected)
      reasons += "; " + k + " (" + std::to_string(n) + ")";
    return fail("world=" + std::to_string(req.world) + " has no valid "
                "factorization tp x pp x dp for this model and global-batch=" +
                std::to_string(req.globalBatch) + reasons);
  }
  if (all.empty())
    return fail("no layout fits mem-cap " + readableBytes(cap) +
                " per device: the smallest needs " +
                readableBytes(out.smallest.pred.peakBytes) + " (" +
                out.smallest.layout.brief() + ": parameters and optimizer " +
                readableBytes(out.smallest.pred.paramStateBytes) +
                ", activations " +
                readableBytes(out.smallest.pred.activationBytes) +
                ", workspace " +
                readableBytes(out.smallest.pred.workspaceBytes) +
                ", beside the plan " +
                readableBytes(out.smallest.pred.outsidePlanBytes) + "); " +
                memoryKnob(m, out.smallest));
  // Best first; ties (schedules the model prices alike) keep the order
  // of the space, simplest first.
  std::stable_sort(all.begin(), all.end(), [](const Ranked &a, const Ranked &b) {
    return a.pred.stepMs < b.pred.stepMs;
  });
  size_t k = std::min<size_t>(std::max(req.top, 1), all.size());
  out.top.assign(all.begin(), all.begin() + k);
  return true;
}

bool mapp::cost::checkThroughputClaim(const ModelDims &m, double samplesPerS,
                                      int world, const Profile &p,
                                      std::string *error) {
  double need = m.trainFlopsPerSequence() * samplesPerS / world / 1e12;
  if (need <= p.peakTflops)
    return true;
  if (error) {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%.4g samples/s of this model (%.4g TFLOP per sample) on %d "
                  "%s devices needs %.0f TFLOP/s per device against a peak of "
                  "%.0f: impossible",
                  samplesPerS, m.trainFlopsPerSequence() / 1e12, world,
                  p.deviceKind.c_str(), need, p.peakTflops);
    *error = buf;
  }
  return false;
}

std::string mapp::cost::formatRanking(const SearchRequest &req,
                                      const SearchResult &r) {
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "auto-parallel: world %d, global batch %d, cap %s, profile "
                "%s; %zu layouts priced, %zu fit, %zu over the cap, %.3f s\n",
                req.world, req.globalBatch,
                gib(req.memCapBytes > 0 ? req.memCapBytes
                                        : req.profile.memoryGiB * 1073741824.0)
                    .c_str(),
                req.profile.source.c_str(), r.considered, r.feasible,
                r.overCap, r.searchSeconds);
  os << buf;
  std::snprintf(buf, sizeof buf, "%-4s %-52s %10s %11s %9s %7s %9s %6s\n",
                "rank", "layout", "step_ms", "tokens/s", "peak_GiB", "bubble",
                "comm_ms", "mfu");
  os << buf;
  bool anyOver = false;
  for (size_t i = 0; i < r.top.size(); ++i) {
    const Prediction &p = r.top[i].pred;
    anyOver |= r.top[i].overCapPredicted;
    std::snprintf(buf, sizeof buf,
                  "%-4zu %-52s %10.3f %11.0f %9.3f %7.3f %9.3f %5.1f%%%s\n",
                  i + 1, r.top[i].layout.brief().c_str(), p.stepMs,
                  p.tokensPerS, p.peakBytes / 1073741824.0, p.bubbleFraction,
                  p.exposedCommMs, p.mfu * 100,
                  r.top[i].overCapPredicted ? " *" : "");
    os << buf;
  }
  if (anyOver)
    os << "auto-parallel: * predicted over the cap by at most "
       << int(req.capSlack * 100 + 0.5)
       << "%: the memory planner decides whether it fits\n";
  if (r.overCap)
    os << "auto-parallel: rejected " << r.overCap
       << " over the memory cap (smallest " << gib(r.smallest.pred.peakBytes)
       << ": " << r.smallest.layout.brief() << ")\n";
  for (auto &[why, n] : r.rejected)
    os << "auto-parallel: rejected " << n << ": " << why << "\n";
  return os.str();
}
