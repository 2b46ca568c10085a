"""Every verifier diagnostic of the mapp dialect is exercised by a test.

Extracts each emitOpError(...) / emitError(...) call in
lib/Dialect/Mapp/IR/*.cpp with the string literals of its message, and checks
that some `expected-error {{...}}` in test/**/*.mlir contains a distinctive
part of it (the message's longest literal piece, first 24 characters). When
the call sits in `FooOp::<method>` the expected-error must also target that
op (`'mapp.foo' op` in the text, or `mapp.foo` on the line it points at), so
the same message emitted by two ops needs a test for each. Calls in shared
helpers may be covered through any op.

Failing lists the uncovered calls with file:line and the message pieces.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IR_DIR = os.path.join(ROOT, "lib", "Dialect", "Mapp", "IR")
TD_DIR = os.path.join(ROOT, "include", "mapp", "Dialect", "Mapp", "IR")
TEST_DIR = os.path.join(ROOT, "test")
KEY_LEN = 24

# Checks no input can reach, keyed by (function, key), with the reason. Keep
# this short: prefer a test, or removing dead code.
UNREACHABLE = {
    ("ScheduleOp::verify", "is not an array"):
        "the ODS constraint on `tables` (TypedArrayAttrBase<ArrayAttr>) "
        "rejects a non-array entry before verify() runs",
}

CALL_RE = re.compile(r"\b(emitOpError|emitError)\s*\(")
# A member function definition at the start of a line: `... FooOp::bar(`.
DEF_RE = re.compile(r"^[A-Za-z_][\w:<>,\s\*&]*?\b(\w+)::(\w+)\s*\(", re.M)
FREE_DEF_RE = re.compile(r"^(?:static\s+)?[A-Za-z_][\w:<>\*&]*\s+\**(\w+)\s*\(", re.M)


def op_mnemonics():
    """C++ class name (e.g. LinearOp) -> op mnemonic (linear), from the .td."""
    out = {}
    for name in os.listdir(TD_DIR):
        if not name.endswith(".td"):
            continue
        with open(os.path.join(TD_DIR, name), encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r'^def\s+Mapp_(\w+)\s*:\s*\w+<\s*"([\w.]+)"', text, re.M):
            if m.group(1).endswith("Op"):
                out[m.group(1)] = m.group(2)
    return out


def unescape(s):
    return (s.replace(r"\"", '"').replace(r"\\", "\\").replace(r"\n", "\n")
            .replace(r"\t", "\t"))


def statement_pieces(text, start):
    """Literal pieces of the statement that starts at `start`: adjacent
    string literals are joined, code between literals splits pieces."""
    pieces, cur, depth, i = [], None, 0, start
    while i < len(text):
        c = text[i]
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            lit = unescape(text[i + 1:j])
            cur = lit if cur is None else cur + lit
            i = j + 1
            continue
        if c == "'":
            j = i + 1
            while text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if not c.isspace() and cur is not None:
            pieces.append(cur)
            cur = None
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                break
        elif c == ";" and depth == 0:
            break
        i += 1
    if cur is not None:
        pieces.append(cur)
    return pieces


def enclosing_function(text, pos):
    """(class, method) of the member function containing pos, or (None,
    name) for a free function."""
    best, best_pos = (None, None), -1
    for m in DEF_RE.finditer(text, 0, pos):
        if m.start() > best_pos:
            best, best_pos = (m.group(1), m.group(2)), m.start()
    for m in FREE_DEF_RE.finditer(text, 0, pos):
        if m.start() > best_pos and m.group(1) not in ("if", "for", "while", "return", "switch"):
            best, best_pos = (None, m.group(1)), m.start()
    return best


def key_of(pieces):
    cands = [p.strip(" \t\n:,\"'()[]") for p in pieces]
    cands = [c for c in cands if c]
    if not cands:
        return None
    key = max(cands, key=len)[:KEY_LEN]
    # "..., got <value>": a test may stop before the connector word.
    key = re.sub(r"[,:]?\s*\b(got|for|of|than)$", "", key).rstrip(" ,:")
    return key


def verifier_sites():
    mnemonics = op_mnemonics()
    sites = []
    for name in sorted(os.listdir(IR_DIR)):
        if not name.endswith(".cpp"):
            continue
        path = os.path.join(IR_DIR, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in CALL_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            stmt_start = text.rfind("\n", 0, m.start()) + 1
            pieces = statement_pieces(text, stmt_start)
            cls, fn = enclosing_function(text, m.start())
            op = mnemonics.get(cls) if cls else None
            sites.append({
                "where": f"lib/Dialect/Mapp/IR/{name}:{line}",
                "function": f"{cls}::{fn}" if cls else fn,
                "op": op,
                "pieces": pieces,
                "key": key_of(pieces),
            })
    return sites


EXPECT_RE = re.compile(r"expected-error(?:-re)?\s*(@[+-]?\w+)?\s*\{\{(.*?)\}\}")


def expected_errors():
    out = []
    for dirpath, _, files in os.walk(TEST_DIR):
        for name in files:
            if not name.endswith(".mlir"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            for i, l in enumerate(lines):
                for m in EXPECT_RE.finditer(l):
                    loc, msg = m.group(1), m.group(2)
                    target = i
                    if loc in ("@below", "@above"):
                        step = 1 if loc == "@below" else -1
                        target = i + step
                        while 0 <= target < len(lines) and lines[target].lstrip().startswith("//"):
                            target += step
                    elif loc and re.fullmatch(r"@[+-]\d+", loc):
                        target = i + int(loc[1:])
                    op = None
                    mo = re.search(r"'mapp\.(\w+)' op", msg)
                    if mo:
                        op = mo.group(1)
                    elif 0 <= target < len(lines):
                        mt = re.search(r"\bmapp\.(\w+)", lines[target].split("//")[0])
                        if mt:
                            op = mt.group(1)
                    out.append({"file": os.path.relpath(path, ROOT), "line": i + 1,
                                "msg": msg, "op": op})
    return out


def covered(site, expects):
    if (site["function"], site["key"]) in UNREACHABLE:
        return True
    for e in expects:
        if site["key"] not in e["msg"]:
            continue
        if site["op"] is None or e["op"] == site["op"]:
            return True
    return False


def test_sites_found():
    sites = verifier_sites()
    # Guard against the extractor silently finding nothing.
    assert len(sites) >= 50, len(sites)
    assert all(s["key"] for s in sites), [s for s in sites if not s["key"]]


def test_every_verifier_message_is_tested():
    expects = expected_errors()
    missing = [s for s in verifier_sites() if not covered(s, expects)]
    report = "\n".join(
        f"  {s['where']} ({s['function']}, op {s['op'] or 'any'}): "
        f"{s['key']!r} from {s['pieces']}" for s in missing)
    assert not missing, (f"{len(missing)} verifier diagnostics have no "
                         f"expected-error test:\n{report}")


def test_unreachable_list_is_current():
    keys = {(s["function"], s["key"]) for s in verifier_sites()}
    stale = [k for k in UNREACHABLE if k not in keys]
    assert not stale, f"UNREACHABLE names sites that no longer exist: {stale}"


if __name__ == "__main__":
    exps = expected_errors()
    for s in verifier_sites():
        print("ok " if covered(s, exps) else "-- ", s["where"], s["function"],
              s["op"], repr(s["key"]))
