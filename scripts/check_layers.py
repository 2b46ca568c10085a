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
            + duplicate_definitions(root))


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
