//===- mapp-probe-check.cpp - probe/perturb conformance tool --------------===//
//
// Test-only: reads one JSON request on stdin, runs the runtime's own
// reduction or perturbation code on it and prints the result as JSON, so
// pytest can compare every reduction with numpy/torch on the same tensor.
//
//   {"op": "reduce", "attrs": {...}, "shape": [...], "x": [...]}
//   {"op": "attn", "attrs": {...}, "shape": [B,T,H], "q": [...], "k": [...]}
//   {"op": "perturb", "attrs": {...}, "shape": [...], "x": [...],
//    "step": 0, "microbatch": 0, "enabled": true, "magnitude": 0.5}
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeReduce.h"

#include <nlohmann/json.hpp>

#include <iostream>

using namespace mapp::rt;
using json = nlohmann::json;

static Attrs toAttrs(const json &j) {
  Attrs a;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json &v = it.value();
    if (v.is_boolean())
      a.setInt(it.key(), v.get<bool>());
    else if (v.is_number_integer())
      a.setInt(it.key(), v.get<int64_t>());
    else if (v.is_number())
      a.setFloat(it.key(), v.get<double>());
    else if (v.is_string())
      a.setStr(it.key(), v.get<std::string>());
    else if (v.is_array())
      a.setInts(it.key(), v.get<std::vector<int64_t>>());
  }
  return a;
}

static json sampleJson(const ProbeSample &s) {
  json j = {{"reduction", s.reduction}, {"shape", s.shape}};
  j["value"] = std::isnan(s.value) ? json(nullptr) : json(s.value);
  j["data"] = s.data;
  j["index"] = s.index;
  return j;
}

int main() {
  try {
    json req = json::parse(std::cin);
    Attrs a = toAttrs(req.value("attrs", json::object()));
    Shape shape = req["shape"].get<Shape>();
    std::string op = req["op"];
    std::vector<TensorType> in = {{DType::F32, shape}};
    json out;
    if (op == "reduce") {
      checkProbeAttrs(a, in);
      std::vector<float> x = req["x"].get<std::vector<float>>();
      std::vector<float> sel = selectTokens(a, x.data(), shape);
      bool toks = !a.getInts("tokens").empty() && shape.size() >= 2;
      int64_t inner = toks || shape.size() >= 3
                          ? numel(shape) / (shape[0] * shape[1])
                          : (shape.empty() ? 1 : shape.back());
      out = json::array();
      for (const ProbeSample &s : reduceValues(a, sel, inner))
        out.push_back(sampleJson(s));
    } else if (op == "attn") {
      in.push_back(in[0]);
      checkProbeAttrs(a, in);
      std::vector<float> q = req["q"], k = req["k"];
      out = sampleJson(attentionProbs(a, q.data(), k.data(), shape));
    } else if (op == "perturb") {
      checkPerturbAttrs(a, in);
      std::vector<float> x = req["x"].get<std::vector<float>>(), y(x.size());
      SwitchState s{req.value("enabled", true), req.value("magnitude", 0.0)};
      applyPerturbation(a, s, req.value("step", 0), req.value("microbatch", 0),
                        x.data(), y.data(), x.size(),
                        shape.empty() ? 1 : shape.back());
      out = y;
    } else {
      fail("unknown op '", op, "'");
    }
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception &e) {
    std::cerr << "mapp-probe-check: " << e.what() << "\n";
    return 1;
  }
}
