"""auto-parallel-agree-rates.test: the search and mapp-sim within 10% of each
other under the rates profile, and both at least 1.3x the flat profile's."""
import json
import sys

search, flat, sim_dp_flat = (json.load(open(f)) for f in sys.argv[1:4])
pred = {r["layout"].split(" mbs")[0]: r["step_ms"] for r in search["top"]}
base = {r["layout"].split(" mbs")[0]: r["step_ms"] for r in flat["top"]}
sims = {}
for item in sys.argv[4:]:
    layout, path = item.split("=")
    sims[layout] = sim = json.load(open(path))[0]["step_us"] / 1e3
    print(f"{layout} search {pred[layout]:.3f} sim {sim:.3f} ms, flat search {base[layout]:.3f}")
    if abs(pred[layout] - sim) > 0.1 * pred[layout]:
        sys.exit(f"{layout}: the search and mapp-sim disagree")
    if pred[layout] < 1.3 * base[layout]:
        sys.exit(f"{layout}: the rates table did not act on the search")
ratio = sims["tp1 pp1 dp2"] / (sim_dp_flat[0]["step_us"] / 1e3)
print(f"sim dp over flat {ratio:.2f}x")
if ratio < 1.3:
    sys.exit("the rates table did not act on mapp-sim")
