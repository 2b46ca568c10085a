"""Checks a plan compiled with bf16 activation storage against the same
module's fp32 plan (both as flatc JSON): which values are stored bf16, their
sizes, and that the arena shrinks. Prints the arena sizes."""
import json
import math
import sys

f32, bf16 = (json.load(open(p)) for p in sys.argv[1:3])
(pf,), (pb,) = f32["programs"], bf16["programs"]
vals = pb["values"]
assert [v["name"] for v in vals] == [v["name"] for v in pf["values"]]
contrib = {i for b in pb["blocks"] for ins in b.get("instrs", [])
           if ins["kernel"] == "grad_accumulate" for i in ins["inputs"]}
aliases = [(ins["inputs"][0], ins["outputs"][0]) for b in pb["blocks"]
           for ins in b.get("instrs", []) if ins["kernel"] == "reshape" and
           any(a["key"] == "alias" for a in ins.get("attrs", []))]
stored = 0
for i, v in enumerate(vals):
    numel = math.prod(v.get("shape", []))
    eligible = (v["kind"] == "Temp" and v["dtype"] == "f32" and
                len(v.get("shape", [])) >= 2 and i not in contrib)
    if v["storage_bf16"]:
        stored += 1
        assert eligible, (i, v["name"])
        assert v["bytes"] == 2 * numel, (i, v)
    else:
        assert pf["values"][i]["bytes"] == v["bytes"], (i, v)
    # Whatever is not stored bf16 although eligible must share an alias
    # chain with a value that is not eligible.
    if eligible and not v["storage_bf16"]:
        assert any(i in pair for pair in aliases), (i, v["name"])
for x, y in aliases:
    assert vals[x]["storage_bf16"] == vals[y]["storage_bf16"], (x, y)
    assert vals[x]["offset"] == vals[y]["offset"]
assert stored > 0 and contrib and not any(vals[i]["storage_bf16"] for i in contrib)
ratio = pb["arena_bytes"] / pf["arena_bytes"]
print(f"values stored bf16: {stored}; arena {pf['arena_bytes']} -> "
      f"{pb['arena_bytes']} B ({ratio:.3f}x)")
assert ratio < 0.6, ratio
