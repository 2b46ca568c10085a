//===- ProbeSpec.h - the probe spec of --mapp-insert-probes -----*- C++ -*-===//
//
// Parsing and validation of the user's spec, independent of the IR, so that
// every error names the spec file, line and column of the offending entry.
// Format: docs/megascope.md; JSON, or YAML with the same schema (by the
// file's extension, .yaml or .yml).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRANSFORMS_SCOPE_PROBESPEC_H
#define MAPP_TRANSFORMS_SCOPE_PROBESPEC_H

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>

#include <optional>
#include <string>
#include <vector>

namespace mapp::scope {

/// "file:line:col" of an entry, for messages.
struct SpecPos {
  std::string file;
  unsigned line = 1, col = 1;
  std::string str() const {
    return file + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
};

/// A token selector item: one position (`single`) or a half-open range
/// [begin, end); negative positions count from the end (-1 = last token) and
/// an end <= 0 is relative to the end too ("-4:0" = the last four).
struct TokenRange {
  int64_t begin, end;
  bool single;
};

struct ProbeEntry {
  SpecPos pos;
  std::string name;                   // glob over value names
  llvm::SmallVector<std::string> reduce;
  int64_t every = 1;
  std::optional<std::vector<TokenRange>> tokens; // none = all positions
  int64_t bins = 32;
  double lo = -8, hi = 8;
  int64_t k = 10;
  int64_t sketchDim = 16;
  int64_t seed = 0;
  double eps = 1e-6;
  int64_t rawCap = 4096;
};

struct PerturbEntry {
  SpecPos pos;
  std::string name;
  std::string kind;   // gaussian | uniform | offset | mask | bitflip | int8 | fp8
  std::string target; // compute | storage | system
  double magnitude = 0, p = 0;
  int64_t seed = 0;
  bool enabled = true;
  std::optional<int64_t> switchId;
  std::vector<int64_t> channels, heads;
};

struct ProbeSpec {
  std::string path;
  std::vector<ProbeEntry> probes;
  std::vector<PerturbEntry> perturbations;
};

/// Reads and validates `path` (YAML when it ends in .yaml or .yml, else
/// JSON). Errors read "FILE:LINE:COL: what is wrong".
llvm::Expected<ProbeSpec> loadProbeSpec(const std::string &path);
/// The same from JSON text (for tests and for inline specs).
llvm::Expected<ProbeSpec> parseProbeSpec(llvm::StringRef text,
                                         const std::string &path);
/// The same from YAML text.
llvm::Expected<ProbeSpec> parseProbeSpecYaml(llvm::StringRef text,
                                             const std::string &path);

/// Where each entry of the "probes"/"perturbations" lists starts, by (list,
/// index): what the YAML reader knows and the JSON tree does not keep.
using EntryPositions = std::map<std::pair<std::string, size_t>, SpecPos>;
/// A YAML spec as the JSON tree the validator reads, with its entries'
/// positions; "FILE:LINE:COL: not valid YAML: …" for malformed text.
llvm::Expected<llvm::json::Value> yamlSpecToJson(llvm::StringRef text,
                                                 const std::string &path,
                                                 EntryPositions &positions);

/// Reductions the runtime implements.
bool isKnownReduction(llvm::StringRef r);

} // namespace mapp::scope

#endif
