#!/usr/bin/env python3
"""The build's layering rules, checked from the sources (docs/design.md, "Layers").

  scripts/check_layers.py [ROOT]     prints one line per violation, exit 1 if any

Rules:
  1. Nothing under runtime/ includes a header of scan/, tools/ or MLIR/LLVM:
     the runtime is the bottom of the build (with its trace-format library),
     scan/ and the tools are built over it, never the other way round.
  2. No CMake file under runtime/ puts a directory of scan/ or tools/ on an
     include path (which would let rule 1 be broken by a bare file name).
  3. Each CMake target and each CTest name is defined once in the tree.
  4. Inside runtime/, includes go downward only: each folder of runtime/src
     and each header of runtime/include/mapp is in one layer of
     RUNTIME_LAYERS (bottom first; docs/design.md, "Layers", is the
     contract), and a file includes only headers of its own or lower layers.
     A runtime header or source folder with no layer is reported too, so a
     new one gets its place in the order when it is added, and so is a
     source that implements a mapp/rt/ header (same base name) from a
     folder other than the header's layer.
  5. Sizes one reader can hold: no tool main (a source under tools/ that
     defines main) over 250 lines, no source file over 800 lines, except
     the files in OVERSIZE_LEFT, each with the reason it is not split yet
     (an entry that fits again is reported, so the list only shrinks).

test/python/test_layers.py runs this on the repository (clean) and on small
trees with injected violations (each one reported, by file and line).
"""
import os
import re
import sys

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
# Commands that define a target; the name is their first argument.
TARGET_COMMANDS = ("add_library", "add_executable", "add_custom_target",
                   "add_mlir_library", "add_mlir_dialect_library",
                   "add_llvm_executable", "add_public_tablegen_target",
                   "add_lit_testsuite")
FORBIDDEN_PREFIXES = ("mapp/scan/", "mlir/", "llvm/", "llvm-c/")
SKIP_DIRS = {".git", "node_modules", "__pycache__"}

# Rule 4's layer order, bottom first: (layer, headers of mapp/rt/ in it).
# A layer is also the folder runtime/src/<layer>/ (its sources and private
# headers) and, where one exists, runtime/include/mapp/<layer>/.
RUNTIME_LAYERS = [
    ("support", ["Error.h", "RegularFile.h", "AtomicFile.h", "ThreadPool.h",
                 "FaultSpec.h"]),
    ("trace", []),
    ("cost", []),
    ("kernel", ["DType.h", "Tensor.h", "Attrs.h", "Kernels.h", "KernelVocab.h",
                "KernelVocab.def", "FusedProgram.h", "FusedDevice.h",
                "FusedCodegen.h", "FusedDeviceText.inc", "Probe.h", "ProbeReduce.h"]),
    ("data", ["Weights.h", "Tokenizer.h", "Dataset.h", "Safetensors.h"]),
    ("plan", ["Plan.h", "PlanLimits.h", "Shard.h", "plan_generated.h"]),
    ("comm", ["Comm.h", "Coordinator.h", "Faults.h", "Launcher.h", "Rendezvous.h"]),
    ("sched", ["Scheduler.h", "TaskPool.h"]),
    ("backend", ["Backend.h", "BackendConfig.h", "Fp8.h", "MoeRouting.h"]),
    ("exec", ["Executor.h", "ExpertTally.h", "Fbd.h", "MemoryReport.h",
              "Metrics.h", "StepGraph.h"]),
    ("ckpt", ["Checkpoint.h", "HfNames.h"]),
    ("elastic", ["Elastic.h", "Launch.h"]),
    ("probe", ["ControlFiles.h", "RequestGate.h", "ProbeControl.h",
               "ProbeStore.h", "ProbeStoreReader.h", "ProbeSession.h",
               "Generate.h", "KvDecoder.h", "Patch.h"]),
    # Above exec only for LiveMonitor.cpp, the runtime's attachment of the
    # monitor (it reads the Executor); the rest of MappMonitor is over trace.
    ("monitor", ["LiveMonitor.h"]),
    ("run", ["Run.h", "RunFlags.h", "Calibrate.h"]),
]

MAX_TOOL_MAIN_LINES = 250
MAX_SOURCE_LINES = 800
SIZE_CHECKED_EXT = (".h", ".hpp", ".cpp", ".cc", ".c", ".cu", ".cuh", ".inc",
                    ".py", ".td")
# Rule 5's exceptions: path -> why it is not split yet.
OVERSIZE_LEFT = {}
MAIN_RE = re.compile(r"^\s*int\s+main\s*\(", re.M)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def _walk(root, sub):
    base = os.path.join(root, sub)
    for d, dirs, files in os.walk(base):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
        for f in sorted(files):
            yield os.path.join(d, f)


def _rel(root, path):
    return os.path.relpath(path, root)


def _inside(path, top):
    path, top = os.path.realpath(path), os.path.realpath(top)
    return path == top or path.startswith(top + os.sep)


def _upper_header_names(root):
    """Header file names that exist only in scan/ or tools/ (not runtime/)."""
    names = {}
    for sub in ("scan", "tools"):
        for p in _walk(root, sub):
            if p.endswith((".h", ".hpp", ".cuh")):
                names.setdefault(os.path.basename(p), _rel(root, p))
    for p in _walk(root, "runtime"):
        names.pop(os.path.basename(p), None)
    return names


def include_violations(root):
    out = []
    runtime = os.path.join(root, "runtime")
    upper = (os.path.join(root, "scan"), os.path.join(root, "tools"))
    upper_names = _upper_header_names(root)
    for path in _walk(root, "runtime"):
        if not path.endswith(SOURCE_EXT):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                where = f"{_rel(root, path)}:{n}"
                if name.startswith(FORBIDDEN_PREFIXES):
                    out.append(f"{where}: includes '{name}' (runtime/ may not "
                               "include scan/, tools/ or MLIR/LLVM headers)")
                    continue
                if kind != '"':
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(path), name))
                if os.path.exists(target):
                    if any(_inside(target, u) for u in upper) or not _inside(target, runtime):
                        out.append(f"{where}: includes '{name}', which is "
                                   f"{_rel(root, target)} outside runtime/")
                    continue
                base = os.path.basename(name)
                if base in upper_names:
                    out.append(f"{where}: includes '{name}', a header of "
                               f"{upper_names[base]} (outside runtime/)")
    return out


def _layer_rank(layers):
    return {name: i for i, (name, _) in enumerate(layers)}


def _rt_header_layers(layers):
    return {h: name for name, headers in layers for h in headers}


def _file_layer(root, path, layers):
    """(layer, None) of a file of runtime/src or runtime/include/mapp, or
    (None, why it has none); (None, None) for files outside both."""
    rel = _rel(os.path.join(root, "runtime"), path).replace(os.sep, "/")
    parts = rel.split("/")
    rank = _layer_rank(layers)
    if parts[0] == "src":
        if len(parts) < 3:
            return None, "is not in a layer folder of runtime/src"
        if parts[1] not in rank:
            return None, (f"runtime/src/{parts[1]}/ has no layer "
                          "(scripts/check_layers.py RUNTIME_LAYERS)")
        return parts[1], None
    if parts[0] == "include" and len(parts) >= 4 and parts[1] == "mapp":
        if parts[2] == "rt":
            layer = _rt_header_layers(layers).get(parts[-1])
            if layer is None:
                return None, (f"mapp/rt/{parts[-1]} has no layer "
                              "(scripts/check_layers.py RUNTIME_LAYERS)")
            return layer, None
        if parts[2] not in rank:
            return None, (f"runtime/include/mapp/{parts[2]}/ has no layer "
                          "(scripts/check_layers.py RUNTIME_LAYERS)")
        return parts[2], None
    return None, None


def _resolve_runtime_include(root, path, name):
    """The file of runtime/ that `#include "name"` in `path` names (its own
    directory first, then the runtime's include paths), or None."""
    rt = os.path.join(root, "runtime")
    for base in (os.path.dirname(path), os.path.join(rt, "src"),
                 os.path.join(rt, "include")):
        t = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(t) and _inside(t, rt):
            return t
    if name.startswith("mapp/rt/"):  # generated: plan_generated.h
        return os.path.join(rt, "include", name)
    return None


def runtime_layer_violations(root, layers=None):
    layers = RUNTIME_LAYERS if layers is None else layers
    rank = _layer_rank(layers)
    headers = _rt_header_layers(layers)
    out, unplaced = [], set()
    rt = os.path.join(root, "runtime")
    for sub in ("src", "include"):
        for path in _walk(rt, sub):
            if not path.endswith(SOURCE_EXT + (".def",)):
                continue
            layer, why = _file_layer(root, path, layers)
            if layer is None:
                if why and why not in unplaced:
                    unplaced.add(why)
                    out.append(f"{_rel(root, path)}: {why}")
                continue
            if sub == "src" and path.endswith((".cpp", ".cu")):
                stem = os.path.splitext(os.path.basename(path))[0]
                home = headers.get(stem + ".h")
                if home is not None and home != layer:
                    out.append(f"{_rel(root, path)}: implements mapp/rt/"
                               f"{stem}.h of layer '{home}' from layer "
                               f"'{layer}'")
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if not m or m.group(1) != '"':
                        continue
                    target = _resolve_runtime_include(root, path, m.group(2))
                    if target is None:
                        continue
                    to, why = _file_layer(root, target, layers)
                    where = f"{_rel(root, path)}:{n}"
                    if to is None:
                        if why and why not in unplaced:
                            unplaced.add(why)
                            out.append(f"{where}: includes '{m.group(2)}', "
                                       f"which {why}")
                        continue
                    if rank[to] > rank[layer]:
                        out.append(f"{where}: layer '{layer}' includes "
                                   f"'{m.group(2)}' of the higher layer '{to}'")
    return out


def size_violations(root, oversize_left=None):
    left = OVERSIZE_LEFT if oversize_left is None else oversize_left
    out = []
    for path in _walk(root, ""):
        if not path.endswith(SIZE_CHECKED_EXT):
            continue
        rel = _rel(root, path).replace(os.sep, "/")
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        is_main = rel.startswith("tools/") and MAIN_RE.search(text)
        limit = MAX_TOOL_MAIN_LINES if is_main else MAX_SOURCE_LINES
        what = "tool main" if is_main else "source file"
        if rel in left:
            if lines <= limit:
                out.append(f"{rel}: {lines} lines now fits the {what} limit "
                           f"of {limit}; remove it from OVERSIZE_LEFT")
            continue
        if lines > limit:
            out.append(f"{rel}: {what} of {lines} lines (at most {limit}: "
                       "split it along its seams)")
    return out


def _cmake_commands(text, names):
    """(command, argument text, line) for each call of one of `names`."""
    pat = re.compile(r"^[ \t]*(" + "|".join(names) + r")\s*\(", re.M)
    for m in pat.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "#":  # a comment runs to the end of its line
                j = text.find("\n", i)
                i = len(text) if j < 0 else j
                continue
            i += 1
        yield m.group(1), text[m.end():i - 1], text.count("\n", 0, m.start()) + 1


def _cmake_files(root):
    for sub in ("",):
        for p in _walk(root, sub):
            b = os.path.basename(p)
            if b == "CMakeLists.txt" or b.endswith(".cmake"):
                yield p


def _strip_comments(text):
    return "\n".join(l.split("#", 1)[0] if not l.lstrip().startswith("#") else ""
                     for l in text.split("\n"))


def cmake_include_violations(root):
    out = []
    for p in _walk(root, "runtime"):
        if os.path.basename(p) != "CMakeLists.txt" and not p.endswith(".cmake"):
            continue
        text = _strip_comments(open(p, encoding="utf-8").read())
        for cmd, args, line in _cmake_commands(
                text, ("include_directories", "target_include_directories")):
            for arg in args.split():
                a = arg.strip('"')
                if re.search(r"(^|[/}])(scan|tools)(/|$)", a):
                    out.append(f"{_rel(root, p)}:{line}: {cmd} adds '{a}' "
                               "(a directory outside runtime/)")
    return out


def duplicate_definitions(root):
    targets, tests = {}, {}
    for p in _cmake_files(root):
        text = _strip_comments(open(p, encoding="utf-8").read())
        rel = _rel(root, p)
        for cmd, args, line in _cmake_commands(text, TARGET_COMMANDS):
            words = args.split()
            if words and "${" not in words[0]:
                targets.setdefault(words[0].strip('"'), []).append(f"{rel}:{line}")
        for cmd, args, line in _cmake_commands(text, ("add_test",)):
            words = args.split()
            if len(words) >= 2 and words[0] == "NAME" and "${" not in words[1]:
                tests.setdefault(words[1], []).append(f"{rel}:{line}")
    out = []
    for kind, table in (("target", targets), ("test", tests)):
        for name, places in sorted(table.items()):
            if len(places) > 1:
                out.append(f"{kind} '{name}' defined {len(places)} times: "
                           + ", ".join(places))
    return out


def check(root):
    return (include_violations(root) + cmake_include_violations(root)
            + duplicate_definitions(root) + runtime_layer_violations(root)
            + size_violations(root))


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "runtime")):
        print(f"check_layers: '{root}' has no runtime/ directory", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s)", file=sys.stderr)
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
