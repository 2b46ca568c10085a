//===- Generate.cpp - sampling loop over the plan's forward or KV cache --===//
#include "mapp/rt/Generate.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/KvDecoder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>

using namespace mapp::rt;
using json = nlohmann::json;

int mapp::rt::logitsValueIndex(const Program &p, int vocab) {
  // "logits" names the final logits where something follows the LM head
  // (Gemma 2's soft-capping): it wins over "lm_head".
  int found = -1;
  bool named = false;
  for (size_t v = 0; v < p.values.size(); ++v) {
    const Value &val = p.values[v];
    if (val.kind != ValueKind::Temp || val.type.rank() != 3 ||
        val.type.dim(2) != vocab)
      continue;
    if (val.name == "logits" || (val.name == "lm_head" && !named)) {
      found = static_cast<int>(v);
      named = val.name == "logits";
    }
  }
  if (found < 0)
    fail("generation: the plan has no logits value (a [B,T,", vocab,
         "] value named lm_head or logits)");
  return found;
}

int mapp::rt::findLogitsValue(const Program &p, int vocab) {
  int found = logitsValueIndex(p, vocab);
  // The memory plan may reuse the logits' bytes once nothing reads them;
  // generation reads them after the forward, so nothing later may write
  // over them.
  const Value &lv = p.values[found];
  bool written = false;
  for (const Block &b : p.blocks) {
    if (b.kind != BlockKind::Forward)
      continue;
    for (const Instr &in : b.instrs)
      for (int o : in.outputs) {
        if (o == found) {
          written = true;
          continue;
        }
        const Value &w = p.values[o];
        if (written && inArena(w.kind) && w.offset < lv.offset + lv.bytes &&
            lv.offset < w.offset + w.bytes)
          fail("generation: '", in.name.empty() ? in.kernel : in.name,
               "' overwrites the logits after they are computed; compile "
               "the plan so the forward keeps them (autodiff saves them)");
      }
  }
  if (!written)
    fail("generation: no forward instruction computes the logits");
  return found;
}

std::vector<GeneratedToken> mapp::rt::generate(Executor &exec,
                                               const Tokenizer &tok,
                                               const GenerateOptions &o,
                                               ProbeSession *session,
                                               std::ostream *out) {
  const Plan &plan = exec.plan();
  const Program &p = exec.program();
  if (plan.worldSize != 1)
    fail("generation runs single-rank plans only (this one has world_size ",
         plan.worldSize, ")");
  int V = plan.vocabSize, T = plan.seqLength, B = plan.microBatchSize;
  std::vector<int32_t> ctx = tok.encode(o.prompt);
  if (ctx.empty())
    ctx.push_back(tok.eot());
  for (int32_t id : ctx)
    if (id < 0 || id >= V)
      fail("generation: prompt token ", id, " outside the vocabulary ", V);
  if (o.maxNewTokens < 1)
    fail("generation: --max-new-tokens must be >= 1, got ", o.maxNewTokens);
  // The CUDA backend has no cached_attention kernel yet: it generates by
  // re-running the full forward, as --no-kv-cache does.
  bool kvCache = o.kvCache && exec.backend().lookup("cached_attention");
  if (o.kvCache && !kvCache)
    std::cerr << "mapp-run: the " << exec.backend().name()
              << " backend has no KV-cache kernel; generating with the full "
                 "forward per token\n";
  // The last new token is never fed back, so N new tokens need
  // prompt + N − 1 positions.
  int64_t need = static_cast<int64_t>(ctx.size()) + o.maxNewTokens - 1;
  if (kvCache && need > T)
    fail("generation: the prompt (", ctx.size(), " tokens) and ",
         o.maxNewTokens, " new tokens need ", need,
         " positions, the plan's seq_length is ", T,
         " (fewer --max-new-tokens, or --no-kv-cache to slide a window)");
  std::unique_ptr<KvDecoder> decoder;
  int logits = -1;
  if (kvCache)
    decoder = std::make_unique<KvDecoder>(exec);
  else
    logits = findLogitsValue(p, V);
  if (session) {
    session->setGenerating(true);
    session->recordVocabulary(tok);
  }
  uint64_t rngState = o.seed;
  auto nextUniform = [&] {
    rngState += 0x9E3779B97F4A7C15ULL;
    return static_cast<double>(splitmix64(rngState - 0x9E3779B97F4A7C15ULL) >>
                               11) *
           (1.0 / 9007199254740992.0);
  };
  std::vector<GeneratedToken> result;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T, 0),
      targets(static_cast<size_t>(B) * T, 0);
  std::vector<float> logitRow(V);
  for (int64_t g = 0; g < o.maxNewTokens; ++g) {
    // Keep the last T tokens (only the full forward can get there).
    size_t start = ctx.size() > static_cast<size_t>(T) ? ctx.size() - T : 0;
    int len = static_cast<int>(ctx.size() - start);
    if (session) {
      session->beginStep(g);
      session->recordContext(g, true, ctx.data() + start, len);
    }
    if (decoder) {
      logitRow = g == 0 ? decoder->prefill(ctx, g)
                        : decoder->decode(ctx.back(), ctx.size() - 1, g);
    } else {
      // Every batch row holds the same context.
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
          tokens[b * T + t] = t < len ? ctx[start + t] : 0;
      exec.runForward(tokens.data(), targets.data(), g);
      // Backend-neutral: device backends copy (and widen bf16) to the host.
      logitRow =
          exec.readFloats(logits, 0, static_cast<int64_t>(len - 1) * V, V);
    }
    const float *row = logitRow.data();
    // Model distribution (temperature 1) for the record; sampling
    // distribution with temperature and top-k for the choice.
    double m = *std::max_element(row, row + V);
    std::vector<double> prob(V);
    double z = 0;
    for (int v = 0; v < V; ++v)
      z += (prob[v] = std::exp(row[v] - m));
    for (double &q : prob)
      q /= z;
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t c) { return row[a] > row[c]; });
    int32_t next = order[0];
    if (!o.greedy && o.temperature > 0) {
      int64_t k = o.topK > 0 ? std::min<int64_t>(o.topK, V) : V;
      std::vector<double> w(k);
      double wz = 0;
      for (int64_t i = 0; i < k; ++i)
        wz += (w[i] = std::exp((row[order[i]] - m) / o.temperature));
      double u = nextUniform() * wz;
      next = order[k - 1];
      for (int64_t i = 0; i < k; ++i) {
        if (u < w[i]) {
          next = order[i];
          break;
        }
        u -= w[i];
      }
    }
    GeneratedToken gt;
    gt.position = g;
    gt.token = next;
    gt.prob = prob[next];
    json topk = json::array();
    for (int64_t i = 0; i < std::min<int64_t>(o.recordTopK, V); ++i) {
      gt.topk.push_back({order[i], prob[order[i]]});
      topk.push_back({{"id", order[i]},
                      {"text", tok.decode({order[i]})},
                      {"p", prob[order[i]]}});
    }
    std::string text = tok.decode({next});
    auto dump = [](const json &j) {
      return j.dump(-1, ' ', false, json::error_handler_t::replace);
    };
    if (session)
      session->recordToken(g, next, text, gt.prob, dump(topk));
    if (out) {
      json j = {{"position", g},  {"token", next},
                {"text", text},   {"prob", gt.prob},
                {"topk", topk},   {"context", std::vector<int32_t>(
                                      ctx.begin() + start, ctx.end())},
                {"logits", std::vector<float>(row, row + V)}};
      *out << dump(j) << "\n";
    }
    result.push_back(gt);
    ctx.push_back(next);
  }
  if (session)
    session->setGenerating(false);
  return result;
}
