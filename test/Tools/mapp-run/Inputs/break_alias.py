"""Moves the output of the first aliased reshape (attr `alias`) whose input
is not at offset 0 to offset 0 of the same space, so its storage is no
longer its input's: python3 break_alias.py IN.json OUT.json (flatc's JSON
of a plan). Prints the moved value's index."""
import json
import sys

src, dst = sys.argv[1], sys.argv[2]
plan = json.load(open(src))
prog = plan["programs"][0]
values = prog["values"]
for block in prog["blocks"]:
    for instr in block.get("instrs", []):
        attrs = {a["key"]: a for a in instr.get("attrs", [])}
        if instr["kernel"] == "reshape" and attrs.get("alias", {}).get("i"):
            x, y = instr["inputs"][0], instr["outputs"][0]
            if values[x]["offset"] != 0:
                values[y]["offset"] = 0
                json.dump(plan, open(dst, "w"))
                print(y)
                sys.exit(0)
sys.exit("no aliased reshape with a nonzero input offset")
