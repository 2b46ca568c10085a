"""Summarizes a Chrome trace written by mapp-scan for FileCheck."""
import json
import sys

t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = {}
for e in ev:
    if e["ph"] == "M" and e["name"] == "process_name":
        names[e["pid"]] = e["args"]["name"]
print("processes %d: %s" % (len(names), ", ".join(names[p] for p in sorted(names))))
steps = sorted({e["args"]["step"] for e in ev
                if e["ph"] == "X" and "step" in e["args"]})
print("steps", steps)
assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
starts = {e["id"] for e in ev if e["ph"] == "s"}
ends = {e["id"] for e in ev if e["ph"] == "f"}
print("flows balanced" if starts == ends and starts else "flows UNBALANCED")
print("counters", "yes" if any(e["ph"] == "C" for e in ev) else "no")
