//===- ProbeSpec.cpp - parse and validate probes.json ---------------------===//
#include "ProbeSpec.h"
#include "mapp/Support/Nesting.h"
#include "mapp/rt/RegularFile.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace mapp::scope;
namespace json = llvm::json;

bool mapp::scope::isKnownReduction(llvm::StringRef r) {
  return llvm::StringSwitch<bool>(r)
      .Cases("max", "min", "mean", "std", "absmax", "sparsity", true)
      .Cases("hist", "topk", "sketch", "raw", "attn", true)
      .Case("lens", true)
      .Default(false);
}

namespace {

/// llvm::json keeps no positions, so JSON entries are located by finding
/// their name literal in the text, scanning forward from the previous entry
/// (the entries are visited in file order); YAML entries by the positions
/// its reader recorded.
class Locator {
public:
  Locator(llvm::StringRef text, std::string file) : text(text), file(file) {}
  Locator(const EntryPositions &recorded, std::string file)
      : file(file), recorded(&recorded) {}
  SpecPos find(llvm::StringRef section, size_t index, llvm::StringRef name) {
    if (recorded) {
      auto it = recorded->find({section.str(), index});
      return it == recorded->end() ? SpecPos{file, 1, 1} : it->second;
    }
    std::string lit = "\"" + name.str() + "\"";
    size_t at = text.find(lit, cursor);
    if (at == llvm::StringRef::npos)
      at = cursor;
    else
      cursor = at + lit.size();
    SpecPos p{file, 1, 1};
    for (size_t i = 0; i < at && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++p.line;
        p.col = 1;
      } else {
        ++p.col;
      }
    }
    return p;
  }

private:
  llvm::StringRef text;
  std::string file;
  size_t cursor = 0;
  const EntryPositions *recorded = nullptr;
};

llvm::Error err(const SpecPos &p, const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 p.str() + ": " + msg.str());
}

/// Reads keys of an entry object, complaining about unknown ones.
class Fields {
public:
  Fields(const json::Object &o, const SpecPos &pos, const char *what)
      : o(o), pos(pos), what(what) {}

  llvm::Error checkKeys(std::initializer_list<llvm::StringRef> allowed) {
    for (const auto &kv : o) {
      llvm::StringRef k = kv.first;
      if (!llvm::is_contained(allowed, k)) {
        std::string list;
        for (llvm::StringRef a : allowed)
          list += (list.empty() ? "" : ", ") + a.str();
        return err(pos, llvm::Twine("unknown key '") + k + "' in " + what +
                            " (allowed: " + list + ")");
      }
    }
    return llvm::Error::success();
  }
  llvm::Error str(llvm::StringRef k, std::string &out, bool required) {
    const json::Value *v = o.get(k);
    if (!v)
      return required ? err(pos, llvm::Twine(what) + " needs \"" + k + "\"")
                      : llvm::Error::success();
    auto s = v->getAsString();
    if (!s)
      return err(pos, llvm::Twine("\"") + k + "\" must be a string");
    out = s->str();
    return llvm::Error::success();
  }
  llvm::Error integer(llvm::StringRef k, int64_t &out, int64_t lo) {
    const json::Value *v = o.get(k);
    if (!v)
      return llvm::Error::success();
    auto i = v->getAsInteger();
    if (!i || *i < lo)
      return err(pos, llvm::Twine("\"") + k + "\" must be an integer >= " +
                          llvm::Twine(lo));
    out = *i;
    return llvm::Error::success();
  }
  llvm::Error number(llvm::StringRef k, double &out) {
    const json::Value *v = o.get(k);
    if (!v)
      return llvm::Error::success();
    auto d = v->getAsNumber();
    if (!d)
      return err(pos, llvm::Twine("\"") + k + "\" must be a number");
    out = *d;
    return llvm::Error::success();
  }
  llvm::Error ints(llvm::StringRef k, std::vector<int64_t> &out) {
    const json::Value *v = o.get(k);
    if (!v)
      return llvm::Error::success();
    const json::Array *a = v->getAsArray();
    if (!a)
      return err(pos, llvm::Twine("\"") + k + "\" must be a list of integers");
    for (const json::Value &e : *a) {
      auto i = e.getAsInteger();
      if (!i || *i < 0)
        return err(pos, llvm::Twine("\"") + k +
                            "\" must be a list of integers >= 0");
      out.push_back(*i);
    }
    return llvm::Error::success();
  }

  const json::Object &o;
  SpecPos pos;
  const char *what;
};

/// "tokens": "all" | "last" | [int | "a:b", ...]
llvm::Error parseTokens(const json::Value &v, const SpecPos &pos,
                        std::optional<std::vector<TokenRange>> &out) {
  auto bad = [&] {
    return err(pos, "\"tokens\" must be \"all\", \"last\" or a list of "
                    "positions and \"begin:end\" ranges");
  };
  if (auto s = v.getAsString()) {
    if (*s == "all")
      return llvm::Error::success();
    if (*s == "last") {
      out = std::vector<TokenRange>{{-1, -1, true}};
      return llvm::Error::success();
    }
    return bad();
  }
  const json::Array *a = v.getAsArray();
  if (!a || a->empty())
    return bad();
  out.emplace();
  for (const json::Value &e : *a) {
    if (auto i = e.getAsInteger()) {
      out->push_back({*i, *i, true});
      continue;
    }
    auto s = e.getAsString();
    if (!s)
      return bad();
    auto [l, r] = s->split(':');
    int64_t b, en;
    if (l.getAsInteger(10, b) || r.getAsInteger(10, en))
      return bad();
    out->push_back({b, en, false});
  }
  return llvm::Error::success();
}

llvm::Error parseProbe(const json::Value &v, Locator &loc, size_t index,
                       ProbeEntry &p) {
  const json::Object *o = v.getAsObject();
  if (!o)
    return err(loc.find("probes", index, ""), "each probe must be an object");
  const json::Value *nameV = o->get("name");
  auto name = nameV ? nameV->getAsString() : std::nullopt;
  p.pos = loc.find("probes", index, name ? *name : "");
  Fields f(*o, p.pos, "probe");
  if (auto e = f.checkKeys({"name", "reduce", "every", "tokens", "bins",
                            "range", "k", "dim", "seed", "eps", "cap"}))
    return e;
  if (auto e = f.str("name", p.name, true))
    return e;
  const json::Value *red = o->get("reduce");
  const json::Array *ra = red ? red->getAsArray() : nullptr;
  if (!ra || ra->empty())
    return err(p.pos, "probe '" + p.name +
                          "' needs \"reduce\": a non-empty list of reductions");
  for (const json::Value &r : *ra) {
    auto s = r.getAsString();
    if (!s || !isKnownReduction(*s))
      return err(p.pos,
                 "probe '" + p.name + "': unknown reduction " +
                     (s ? "'" + s->str() + "'" : std::string("(not a string)")) +
                     " (expected max, min, mean, std, absmax, sparsity, hist, "
                     "topk, sketch, raw, attn or lens)");
    if (!llvm::is_contained(p.reduce, *s))
      p.reduce.push_back(s->str());
  }
  if (auto e = f.integer("every", p.every, 1))
    return e;
  if (const json::Value *t = o->get("tokens"))
    if (auto e = parseTokens(*t, p.pos, p.tokens))
      return e;
  if (auto e = f.integer("bins", p.bins, 1))
    return e;
  if (const json::Value *r = o->get("range")) {
    const json::Array *a = r->getAsArray();
    if (!a || a->size() != 2 || !(*a)[0].getAsNumber() ||
        !(*a)[1].getAsNumber() ||
        !(*(*a)[0].getAsNumber() < *(*a)[1].getAsNumber()))
      return err(p.pos, "\"range\" must be [lo, hi] with lo < hi");
    p.lo = *(*a)[0].getAsNumber();
    p.hi = *(*a)[1].getAsNumber();
  }
  if (auto e = f.integer("k", p.k, 1))
    return e;
  if (auto e = f.integer("dim", p.sketchDim, 1))
    return e;
  if (auto e = f.integer("seed", p.seed, 0))
    return e;
  if (auto e = f.number("eps", p.eps))
    return e;
  return f.integer("cap", p.rawCap, 1);
}

llvm::Error parsePerturb(const json::Value &v, Locator &loc, size_t index,
                         PerturbEntry &p) {
  const json::Object *o = v.getAsObject();
  if (!o)
    return err(loc.find("perturbations", index, ""),
               "each perturbation must be an object");
  const json::Value *nameV = o->get("name");
  auto name = nameV ? nameV->getAsString() : std::nullopt;
  p.pos = loc.find("perturbations", index, name ? *name : "");
  Fields f(*o, p.pos, "perturbation");
  if (auto e = f.checkKeys({"name", "kind", "target", "magnitude", "p", "seed",
                            "enabled", "switch", "channels", "heads"}))
    return e;
  if (auto e = f.str("name", p.name, true))
    return e;
  if (auto e = f.str("kind", p.kind, true))
    return e;
  bool known = llvm::StringSwitch<bool>(p.kind)
                   .Cases("gaussian", "uniform", "offset", "mask", true)
                   .Cases("bitflip", "int8", "fp8", true)
                   .Default(false);
  if (!known)
    return err(p.pos, "perturbation '" + p.name + "': unknown kind '" +
                          p.kind +
                          "' (expected gaussian, uniform, offset, mask, "
                          "bitflip, int8 or fp8)");
  p.target = "compute";
  if (auto e = f.str("target", p.target, false))
    return e;
  if (p.target != "compute" && p.target != "storage" && p.target != "system")
    return err(p.pos, "perturbation '" + p.name +
                          "': target must be compute, storage or system");
  if (auto e = f.number("magnitude", p.magnitude))
    return e;
  if (auto e = f.number("p", p.p))
    return e;
  if (p.p < 0 || p.p > 1)
    return err(p.pos, "\"p\" must be in [0, 1]");
  if (auto e = f.integer("seed", p.seed, 0))
    return e;
  if (const json::Value *en = o->get("enabled")) {
    auto b = en->getAsBoolean();
    if (!b)
      return err(p.pos, "\"enabled\" must be true or false");
    p.enabled = *b;
  }
  if (o->get("switch")) {
    int64_t s = 0;
    if (auto e = f.integer("switch", s, 0))
      return e;
    p.switchId = s;
  }
  if (auto e = f.ints("channels", p.channels))
    return e;
  if (auto e = f.ints("heads", p.heads))
    return e;
  if (p.kind == "mask" && p.channels.empty() && p.heads.empty())
    return err(p.pos, "a 'mask' perturbation needs \"channels\" or \"heads\"");
  return llvm::Error::success();
}

/// The schema checks shared by both formats.
llvm::Expected<ProbeSpec> validate(const json::Value &root, Locator &loc,
                                   const std::string &path) {
  ProbeSpec spec;
  spec.path = path;
  const json::Object *o = root.getAsObject();
  SpecPos top{path, 1, 1};
  if (!o)
    return err(top, "the spec must be an object with \"probes\" and/or "
                    "\"perturbations\"");
  for (const auto &kv : *o)
    if (kv.first != "probes" && kv.first != "perturbations")
      return err(top, "unknown top-level key '" + kv.first.str() +
                          "' (allowed: probes, perturbations)");
  if (const json::Value *p = o->get("probes")) {
    const json::Array *a = p->getAsArray();
    if (!a)
      return err(top, "\"probes\" must be a list");
    for (size_t i = 0; i < a->size(); ++i) {
      spec.probes.emplace_back();
      if (auto er = parseProbe((*a)[i], loc, i, spec.probes.back()))
        return std::move(er);
    }
  }
  if (const json::Value *p = o->get("perturbations")) {
    const json::Array *a = p->getAsArray();
    if (!a)
      return err(top, "\"perturbations\" must be a list");
    for (size_t i = 0; i < a->size(); ++i) {
      spec.perturbations.emplace_back();
      if (auto er = parsePerturb((*a)[i], loc, i, spec.perturbations.back()))
        return std::move(er);
    }
  }
  if (spec.probes.empty() && spec.perturbations.empty())
    return err(top, "the spec has no probes and no perturbations");
  return spec;
}

} // namespace

llvm::Expected<ProbeSpec> mapp::scope::parseProbeSpec(llvm::StringRef text,
                                                      const std::string &path) {
  llvm::Expected<json::Value> root = json::parse(text);
  if (!root)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        path + ": not valid JSON: " + llvm::toString(root.takeError()));
  Locator loc(text, path);
  return validate(*root, loc, path);
}

llvm::Expected<ProbeSpec>
mapp::scope::parseProbeSpecYaml(llvm::StringRef text, const std::string &path) {
  EntryPositions positions;
  llvm::Expected<json::Value> root = yamlSpecToJson(text, path, positions);
  if (!root)
    return root.takeError();
  Locator loc(positions, path);
  return validate(*root, loc, path);
}

llvm::Expected<ProbeSpec> mapp::scope::loadProbeSpec(const std::string &path) {
  // A FIFO would block the read: regular files only.
  bool notRegular = false;
  std::string why = rt::whyNotRegularFile(path, &notRegular);
  if (notRegular)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        rt::openFailure("probe spec ", path, why, true));
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return llvm::createStringError(buf.getError(),
                                   "cannot read probe spec '" + path +
                                       "': " + buf.getError().message());
  // Both parsers recurse once per level of nesting.
  if (std::optional<size_t> at = findNestingBeyond((*buf)->getBuffer())) {
    llvm::StringRef before = (*buf)->getBuffer().take_front(*at);
    size_t lineStart = before.rfind('\n');
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        path + ":" + std::to_string(1 + before.count('\n')) + ":" +
            std::to_string(
                *at - (lineStart == llvm::StringRef::npos ? 0 : lineStart + 1) +
                1) +
            ": " + nestingMessage());
  }
  llvm::StringRef ext = llvm::StringRef(path).rsplit('.').second;
  if (ext.equals_insensitive("yaml") || ext.equals_insensitive("yml"))
    return parseProbeSpecYaml((*buf)->getBuffer(), path);
  return parseProbeSpec((*buf)->getBuffer(), path);
}
