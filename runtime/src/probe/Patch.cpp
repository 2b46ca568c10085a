//===- Patch.cpp - activation patching over the plan's forward ------------===//
#include "mapp/rt/Patch.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Generate.h"
#include "mapp/rt/RegularFile.h"

#include <cctype>
#include <sstream>

using namespace mapp::rt;

namespace {

std::string readText(const std::string &path, const char *what) {
  std::string s, why;
  bool notRegular = false;
  if (!readRegularFile(path, s, why, &notRegular))
    fail("--patch: ", openFailure(std::string(what) + " ", path, why,
                                  notRegular, "cannot read"));
  // An editor's final newline is not part of the prompt.
  if (!s.empty() && s.back() == '\n')
    s.pop_back();
  return s;
}

int64_t number(const std::string &k, const std::string &v) {
  try {
    size_t n;
    long long x = std::stoll(v, &n);
    if (n == v.size())
      return x;
  } catch (const std::exception &) {
  }
  fail("--patch: ", k, " must be an integer, got '", v, "'");
}

/// The value a PyTorch forward hook on module `prefix` sees: the last
/// forward output named `prefix` or under `prefix.`.
int siteValue(const Program &p, const std::string &prefix) {
  int found = -1;
  for (const Block &b : p.blocks) {
    if (b.kind != BlockKind::Forward)
      continue;
    for (const Instr &in : b.instrs)
      for (int o : in.outputs) {
        const std::string &n = p.values[o].name;
        if (n == prefix || n.rfind(prefix + ".", 0) == 0)
          found = o;
      }
  }
  if (found < 0)
    fail("--patch: no forward value is named '", prefix, "' or lies under it");
  return found;
}

/// Block `layer`'s path in the plan's value names: "layers.3" for the
/// importers' models, the model's own ("transformer.h.3") for a generic
/// export. The instructions the compiler marked with the layer share it: the
/// shortest prefix of the first one's name ending in the index that starts
/// all of their names. "layers.N" when none is marked.
std::string blockPath(const Program &p, int64_t layer) {
  std::vector<const std::string *> names;
  for (const Block &b : p.blocks)
    if (b.kind == BlockKind::Forward)
      for (const Instr &in : b.instrs)
        if (in.layer == layer && !in.name.empty())
          names.push_back(&in.name);
  const std::string index = std::to_string(layer);
  if (!names.empty()) {
    const std::string &n = *names.front();
    for (size_t at = n.find('.'); at != std::string::npos;
         at = n.find('.', at + 1)) {
      size_t end = at + 1 + index.size();
      if (n.compare(at + 1, index.size(), index) != 0 ||
          (end < n.size() && n[end] != '.'))
        continue;
      std::string path = n.substr(0, end);
      bool all = true;
      for (const std::string *m : names)
        all &= *m == path || m->rfind(path + ".", 0) == 0;
      if (all)
        return path;
    }
  }
  return "layers." + index;
}

} // namespace

PatchOptions mapp::rt::parsePatchSpec(const std::string &spec) {
  PatchOptions o;
  std::stringstream ss(spec);
  std::string item;
  bool into = false, from = false;
  while (std::getline(ss, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      fail("--patch: '", item, "' is not KEY=VALUE");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "into")
      o.into = readText(v, "prompt A"), into = true;
    else if (k == "from")
      o.from = readText(v, "prompt B"), from = true;
    else if (k == "site")
      o.site = v;
    else if (k == "layer")
      o.layer = number(k, v);
    else if (k == "pos")
      o.pos = number(k, v);
    else if (k == "target")
      o.target = v;
    else
      fail("--patch: unknown key '", k,
           "' (expected into, from, site, layer, pos, target)");
  }
  if (!into || !from || o.site.empty() || o.layer < 0 || o.pos < 0 ||
      o.target.empty())
    fail("--patch needs into=FILE, from=FILE, site=NAME, layer=L >= 0, "
         "pos=P >= 0 and target=TOKEN");
  // Site names are dotted identifiers: nothing else reaches a lookup.
  for (char c : o.site)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_'))
      fail("--patch: site '", o.site, "' is not a dotted name");
  return o;
}

PatchResult mapp::rt::runPatch(Executor &exec, const Tokenizer &tok,
                               const PatchOptions &o) {
  const Plan &plan = exec.plan();
  const Program &p = exec.program();
  if (plan.worldSize != 1)
    fail("--patch runs single-rank plans only (this one has world_size ",
         plan.worldSize, ")");
  int V = plan.vocabSize, T = plan.seqLength, B = plan.microBatchSize;
  std::vector<int32_t> a = tok.encode(o.into), b = tok.encode(o.from),
                       t = tok.encode(o.target);
  if (t.size() != 1)
    fail("--patch: target '", o.target, "' is ", t.size(),
         " tokens, not one");
  for (const auto *ids : {&a, &b})
    for (int32_t id : *ids)
      if (id < 0 || id >= V)
        fail("--patch: token ", id, " outside the vocabulary ", V);
  if (a.empty() || b.empty() || static_cast<int64_t>(a.size()) > T ||
      static_cast<int64_t>(b.size()) > T)
    fail("--patch: prompts must be 1..", T, " tokens (A has ", a.size(),
         ", B has ", b.size(), ")");
  if (o.pos >= static_cast<int64_t>(std::min(a.size(), b.size())))
    fail("--patch: pos ", o.pos, " is outside prompt A (", a.size(),
         " tokens) or B (", b.size(), ")");
  std::string prefix = blockPath(p, o.layer);
  if (o.site != "resid")
    prefix += "." + o.site;
  int v = siteValue(p, prefix);
  const TensorType &ty = p.values[v].type;
  if (ty.dtype != DType::F32 || ty.rank() != 3 || ty.dim(0) != B ||
      ty.dim(1) != T)
    fail("--patch: '", p.values[v].name, "' is not a [", B, ",", T,
         ",H] f32 activation");
  int64_t H = ty.dim(2);
  int logits = findLogitsValue(p, V);

  PatchResult r;
  r.value = p.values[v].name;
  r.target = t[0];
  r.lastA = static_cast<int64_t>(a.size()) - 1;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T),
      targets(tokens.size(), 0);
  auto forward = [&](const std::vector<int32_t> &ids, int64_t last) {
    for (int row = 0; row < B; ++row)
      for (int i = 0; i < T; ++i)
        tokens[row * T + i] = i < static_cast<int>(ids.size()) ? ids[i] : 0;
    exec.runForward(tokens.data(), targets.data(), 0);
    return exec.readFloats(logits, 0, last * V + r.target, 1)[0];
  };
  // B: keep the site's row at pos as it is produced (its bytes may be
  // reused later in the forward).
  std::vector<float> row;
  exec.setInstrHook([&](Executor &e, const Instr &in) {
    for (int out : in.outputs)
      if (out == v)
        row = e.readFloats(v, 0, o.pos * H, H);
  });
  try {
    r.sourceLogit = forward(b, static_cast<int64_t>(b.size()) - 1);
    exec.setInstrHook(nullptr);
    r.cleanLogit = forward(a, r.lastA);
    if (row.size() != static_cast<size_t>(H))
      fail("--patch: '", r.value, "' was not computed by the forward");
    exec.setInstrHook([&](Executor &e, const Instr &in) {
      for (int out : in.outputs)
        if (out == v)
          for (int bi = 0; bi < B; ++bi)
            e.writeFloats(v, 0, (bi * T + o.pos) * H, row.data(), H);
    });
    r.patchedLogit = forward(a, r.lastA);
  } catch (...) {
    exec.setInstrHook(nullptr);
    throw;
  }
  exec.setInstrHook(nullptr);
  return r;
}
