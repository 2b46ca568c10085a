//===- mapp-kernel-check.cpp - run one CPU kernel on given tensors --------===//
//
// Test-only driver for test/python/test_kernels.py:
//   mapp-kernel-check case.json
// case.json: {"kernel": "linear", "attrs": {...}, "inputs": "in.safetensors",
//             "outputs": [{"dtype": "f32", "shape": [2, 3]}],
//             "out": "out.safetensors", "step": 0, "grad_norm": null,
//             "max_grad_norm": 0, "threads": 2}
// Inputs are tensors in0..inN-1 (initK: initial contents of output K); the
// result file holds out0..outM-1 and, for in-place kernels, the updated inputs
// as in0..inN-1. JSON attrs map to plan attrs by type: int -> Int, float ->
// Float, bool -> Int 0/1 (unit), string -> Str, int list -> Ints, float list ->
// Floats.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iostream>

using namespace mapp::rt;
using json = nlohmann::json;

static Attrs attrsFromJson(const json &j) {
  Attrs attrs;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json &v = it.value();
    if (v.is_boolean())
      attrs.setInt(it.key(), v.get<bool>() ? 1 : 0);
    else if (v.is_number_integer())
      attrs.setInt(it.key(), v.get<int64_t>());
    else if (v.is_number())
      attrs.setFloat(it.key(), v.get<double>());
    else if (v.is_string())
      attrs.setStr(it.key(), v.get<std::string>());
    else if (v.is_array()) {
      bool allInt = true;
      for (const json &e : v)
        allInt &= e.is_number_integer();
      AttrValue a;
      if (allInt) {
        a.kind = AttrValue::Ints;
        a.ints = v.get<std::vector<int64_t>>();
      } else {
        a.kind = AttrValue::Floats;
        a.floats = v.get<std::vector<double>>();
      }
      attrs.set(it.key(), a);
    } else
      fail("attr '", it.key(), "': unsupported JSON type");
  }
  return attrs;
}

static int run(const std::string &casePath) {
  std::ifstream f(casePath);
  if (!f)
    fail("cannot open case '", casePath, "'");
  json c = json::parse(f);
  std::string kernel = c.at("kernel").get<std::string>();
  const KernelSpec *spec = findKernelSpec(kernel);
  if (!spec)
    fail("unknown kernel '", kernel, "'");
  Attrs attrs = attrsFromJson(c.value("attrs", json::object()));
  Safetensors in = readSafetensors(c.at("inputs").get<std::string>());

  // Storage: one buffer per operand, inputs copied from the file.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<Tensor> ins, outs;
  std::vector<TensorType> inTypes, outTypes;
  for (size_t i = 0; in.tensors.count("in" + std::to_string(i)); ++i) {
    const StTensor &t = in.tensors.at("in" + std::to_string(i));
    storage.push_back(t.data);
    storage.back().resize(std::max<size_t>(t.data.size(), 8));
    inTypes.push_back({t.dtype, t.shape});
  }
  for (const json &o : c.value("outputs", json::array())) {
    TensorType tt;
    if (!parseDType(o.at("dtype").get<std::string>(), tt.dtype))
      fail("bad output dtype");
    tt.shape = o.at("shape").get<Shape>();
    outTypes.push_back(tt);
    // Garbage (NaN bytes) so a kernel that skips an element is caught,
    // unless the case gives initial contents (read-modify-write outputs).
    std::string init = "init" + std::to_string(outTypes.size() - 1);
    storage.emplace_back(std::max<int64_t>(tt.numel() * dtypeSize(tt.dtype), 8),
                         0xFF);
    if (in.tensors.count(init)) {
      const StTensor &t = in.tensors.at(init);
      if (t.data.size() !=
          static_cast<size_t>(tt.numel() * dtypeSize(tt.dtype)))
        fail(init, " does not match output ", outTypes.size() - 1);
      std::memcpy(storage.back().data(), t.data.data(), t.data.size());
    }
  }
  checkKernelCall(*spec, attrs, inTypes, outTypes);
  for (size_t i = 0; i < inTypes.size(); ++i)
    ins.push_back({storage[i].data(), inTypes[i]});
  for (size_t i = 0; i < outTypes.size(); ++i)
    outs.push_back({storage[inTypes.size() + i].data(), outTypes[i]});

  std::unique_ptr<Backend> backend = createCpuBackend(c.value("threads", 2));
  std::unique_ptr<Communicator> comm = createLocalComm();
  KernelFn fn = backend->lookup(kernel);
  if (!fn)
    fail("the cpu backend has no kernel '", kernel, "'");
  KernelContext ctx;
  ctx.step = c.value("step", 0);
  if (c.contains("grad_norm") && c["grad_norm"].is_number())
    ctx.gradNorm = c["grad_norm"].get<double>();
  ctx.maxGradNorm = c.value("max_grad_norm", 0.0);
  ctx.pool = &backend->pool();
  ctx.comm = comm.get();
  KernelArgs args{attrs,
                  ins.data(),
                  static_cast<int>(ins.size()),
                  outs.data(),
                  static_cast<int>(outs.size()),
                  ctx};
  fn(args);

  Safetensors result;
  auto save = [&](const std::string &name, const Tensor &t) {
    StTensor st;
    st.dtype = t.type.dtype;
    st.shape = t.shape();
    st.data.resize(t.numel() * dtypeSize(t.type.dtype));
    if (!st.data.empty())
      std::memcpy(st.data.data(), t.data, st.data.size());
    result.tensors[name] = std::move(st);
  };
  for (size_t i = 0; i < outs.size(); ++i)
    save("out" + std::to_string(i), outs[i]);
  // In-place kernels, and the fp8 GEMMs (their amaxes go into the meta).
  if (spec->inPlace || kernel.rfind("fp8_", 0) == 0)
    for (size_t i = 0; i < ins.size(); ++i)
      save("in" + std::to_string(i), ins[i]);
  writeSafetensors(c.at("out").get<std::string>(), result);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    std::cerr << "usage: mapp-kernel-check case.json\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception &e) {
    std::cerr << "mapp-kernel-check: " << e.what() << "\n";
    return 1;
  }
}
