//===- ProbeSpecYaml.cpp - probes.yaml into the JSON spec's tree ----------===//
//
// A YAML spec is read with LLVM's YAML parser into the llvm::json tree the
// JSON reader builds, so one validator (ProbeSpec.cpp) serves both and the
// messages are the same. YAML scalars carry no type, so they are typed the
// way a YAML 1.2 core-schema reader would: quoted scalars are strings; plain
// ones are null (`null`, `~`, empty), booleans (`true`, `false`), integers,
// floats, or else strings. Entries are located by their `name` value (the
// JSON reader points at the name literal too).
//
//===----------------------------------------------------------------------===//
#include "ProbeSpec.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/YAMLParser.h"

using namespace mapp::scope;
namespace json = llvm::json;
namespace yaml = llvm::yaml;

namespace {

class Converter {
public:
  Converter(llvm::StringRef text, const std::string &path,
            EntryPositions &positions)
      : text(text), path(path), positions(positions) {
    // The parser reports through the SourceMgr; keep the first message with
    // its position for our own "FILE:LINE:COL: not valid YAML: …" line.
    sm.setDiagHandler(
        [](const llvm::SMDiagnostic &d, void *self) {
          auto *c = static_cast<Converter *>(self);
          if (c->firstError.empty())
            c->firstError = c->at(d.getLoc()).str() +
                            ": not valid YAML: " + d.getMessage().str();
        },
        this);
  }

  llvm::Expected<json::Value> run() {
    yaml::Stream stream(llvm::MemoryBufferRef(text, path), sm);
    std::optional<json::Value> root;
    for (yaml::Document &doc : stream) {
      if (root)
        return fail(doc.getRoot(), "the spec must be one YAML document");
      yaml::Node *n = doc.getRoot();
      std::optional<json::Value> v;
      if (n && firstError.empty())
        v = convert(n, 0, "", std::nullopt);
      if (!firstError.empty())
        break;
      root = v ? std::move(*v) : json::Value(nullptr);
    }
    if (!firstError.empty())
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     firstError);
    if (!root)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     path + ": not valid YAML: empty document");
    return std::move(*root);
  }

private:
  SpecPos at(llvm::SMLoc loc) {
    SpecPos p{path, 1, 1};
    if (loc.isValid()) {
      auto [line, col] = sm.getLineAndColumn(loc);
      p.line = line;
      p.col = col;
    }
    return p;
  }

  json::Value fail(yaml::Node *n, const llvm::Twine &msg) {
    if (firstError.empty())
      firstError = at(n ? n->getSourceRange().Start : llvm::SMLoc()).str() +
                   ": not valid YAML: " + msg.str();
    return nullptr;
  }

  json::Value scalar(yaml::ScalarNode *s) {
    llvm::SmallString<64> storage;
    llvm::StringRef v = s->getValue(storage);
    llvm::StringRef raw = s->getRawValue();
    if (raw.starts_with("'") || raw.starts_with("\""))
      return v.str();
    if (v == "null" || v == "~" || v.empty())
      return nullptr;
    if (v == "true" || v == "false")
      return v == "true";
    int64_t i;
    if (!v.getAsInteger(10, i))
      return i;
    double d;
    if (!v.getAsDouble(d))
      return d;
    return v.str();
  }

  /// Items of the top-level "probes"/"perturbations" lists are entries:
  /// their positions go to `positions` (the `name` value, else the item).
  using Entry = std::optional<std::pair<std::string, size_t>>;

  json::Value convert(yaml::Node *n, unsigned depth, llvm::StringRef section,
                      const Entry &entry) {
    if (entry)
      positions[*entry] = at(n->getSourceRange().Start);
    if (auto *s = llvm::dyn_cast<yaml::ScalarNode>(n))
      return scalar(s);
    if (auto *b = llvm::dyn_cast<yaml::BlockScalarNode>(n))
      return b->getValue().str();
    if (llvm::isa<yaml::NullNode>(n))
      return nullptr;
    if (auto *seq = llvm::dyn_cast<yaml::SequenceNode>(n)) {
      json::Array a;
      size_t index = 0;
      for (yaml::Node &item : *seq) {
        Entry e;
        if (!section.empty())
          e = std::make_pair(section.str(), index++);
        a.push_back(convert(&item, depth + 1, "", e));
        if (!firstError.empty())
          return nullptr;
      }
      return a;
    }
    if (auto *map = llvm::dyn_cast<yaml::MappingNode>(n)) {
      json::Object o;
      for (yaml::KeyValueNode &kv : *map) {
        auto *key = llvm::dyn_cast_or_null<yaml::ScalarNode>(kv.getKey());
        if (!key)
          return fail(kv.getKey(), "keys must be plain strings");
        llvm::SmallString<32> storage;
        std::string k = key->getValue(storage).str();
        if (o.get(k))
          return fail(key, "duplicate key '" + k + "'");
        yaml::Node *value = kv.getValue();
        if (!value || !firstError.empty())
          return nullptr; // the parser reported why
        if (entry && k == "name")
          positions[*entry] = at(value->getSourceRange().Start);
        o[k] = convert(value, depth + 1, depth == 0 ? llvm::StringRef(k) : "",
                       std::nullopt);
        if (!firstError.empty())
          return nullptr;
      }
      return o;
    }
    return fail(n, "anchors, aliases and tags are not part of the spec format");
  }

  llvm::StringRef text;
  std::string path;
  EntryPositions &positions;
  llvm::SourceMgr sm;
  std::string firstError;
};

} // namespace

llvm::Expected<json::Value>
mapp::scope::yamlSpecToJson(llvm::StringRef text, const std::string &path,
                            EntryPositions &positions) {
  return Converter(text, path, positions).run();
}
