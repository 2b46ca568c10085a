#!/usr/bin/python3
"""MegaScan scenario suite on real multi-rank runs (CPU runtime).

Each scenario trains the hand-built parallel MLP (mapp-make-test-plan, trace
regions on) with 8-16 ranks under `mapp-run --comm=local` or one MPI process
per rank (`mpirun --oversubscribe`), injects zero, one or two faults
(`--inject slow-compute:...`, `link-delay:...`, `link-bandwidth:...` between
pipeline neighbours), traces every step (`--trace-dir`), runs
`mapp-scan DIR --report r.json` and compares the findings with the injected
truth. Prints one line per run and a precision/recall table per fault kind
and overall.

  /usr/bin/python3 bench/scan/scenarios.py [--quick] [--only NAME,...]
      [--keep DIR] [--json OUT] [--repeat N] [--extra comm:layout:kind,...]

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, $MAPP_SCAN, else $MAPP_BIN or
build/bin. test/python/test_scan_comm_parity.py runs its layouts over
both communicators.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"


def tool(env, name):
    if os.environ.get(env):
        return os.environ[env]
    for d in (os.environ.get("MAPP_BIN"), REPO / "build" / "bin"):
        if d and (pathlib.Path(d) / name).exists():
            return str(pathlib.Path(d) / name)
    return None


MAPP_RUN = tool("MAPP_RUN", "mapp-run")
MAKE_PLAN = tool("MAPP_MAKE_TEST_PLAN", "mapp-make-test-plan")
MAPP_SCAN = tool("MAPP_SCAN", "mapp-scan")
MAPP_OPT = tool("MAPP_OPT", "mapp-opt")
MAPP_TRANSLATE = tool("MAPP_TRANSLATE", "mapp-translate")
MPIRUN = shutil.which("mpirun")
# Where MPI puts the ranks: Open MPI's default, or $MAPP_MPI_PLACEMENT (e.g.
# "--bind-to core": one physical core each, on a host with enough of them).
MPI_PLACEMENT = os.environ.get("MAPP_MPI_PLACEMENT",
                               "--oversubscribe").split()


def mpi_usable():
    """mpirun is installed and mapp-run was built with --comm=mpi."""
    if not (MPIRUN and MAPP_RUN):
        return False
    r = subprocess.run([MAPP_RUN, "--help"], capture_output=True, text=True)
    return "built with communicators: local, mpi" in r.stdout

# Big enough that a rank's compute (GEMMs of 4x32 tokens x 64..128) is
# well above the timer and the trace marks, small enough that 16 ranks on
# 2 cores finish a step in well under 100 ms.
MODEL = ["vocab=256", "hidden=64", "ffn=128", "batch=4", "seq=32",
         "optimizer=adamw", "lr=0.01", "trace=1"]
MB_PER_DP = 4
STEPS = 12
SLOW_FACTOR = 3
LINK_US = 5000        # 5 ms per send: >> a 32 KiB copy (~10 us), ~ the step
LINK_GBPS = 0.05      # 32 KiB at 0.05 Gb/s = 5.2 ms per send


def rank_of(tp, dp, t, d, p):
    return t + tp * (d + dp * p)


def faults(kind, tp, pp, dp, factor=SLOW_FACTOR):
    """Injected truth for a scenario kind: list of (spec, truth-tuple)."""
    world = tp * pp * dp
    slow = world - 3 if world > 3 else world - 1  # a middle rank, not rank 0
    # A forward link between pipeline neighbours (stage pp-2 -> pp-1) on the
    # last tp/dp index, and for double faults keep it apart from the rank.
    a = rank_of(tp, dp, tp - 1, dp - 1, pp - 2)
    b = rank_of(tp, dp, tp - 1, dp - 1, pp - 1)
    out = []
    if kind in ("slow", "double", "double-bw"):
        out.append((f"slow-compute:rank={slow},factor={factor}",
                    ("slow-rank", slow)))
    if kind in ("delay", "double"):
        out.append((f"link-delay:src={a},dst={b},us={LINK_US}",
                    ("slow-link", (a, b))))
    if kind in ("bw", "double-bw"):
        out.append((f"link-bandwidth:src={a},dst={b},gbps={LINK_GBPS}",
                    ("slow-link", (a, b))))
    if kind == "links2":
        # Two slow links of different directions and pairs: the forward
        # link above and a backward one on the first tp/dp index (two
        # ranks have no third link to compare with: world >= 4).
        c = rank_of(tp, dp, 0, 0, pp - 1)
        e = rank_of(tp, dp, 0, 0, pp - 2)
        out.append((f"link-delay:src={a},dst={b},us={LINK_US}",
                    ("slow-link", (a, b))))
        out.append((f"link-delay:src={c},dst={e},us={LINK_US}",
                    ("slow-link", (c, e))))
    return out


# gpt8-pp2: a GPT of 8 layers (mapp-translate's config importer, the
# compiler's own pipeline partition: 4 layers a stage), as a user builds it;
# the others are the hand-built MLP.
LAYOUTS = {"gpt8-pp2": (1, 2, 1), "pp2": (1, 2, 1), "tp2pp2dp2": (2, 2, 2), "pp4dp2": (1, 4, 2), "pp2dp4": (1, 2, 4),
           "tp2pp4": (2, 4, 1), "tp2pp2dp4": (2, 2, 4), "pp2dp2": (1, 2, 2)}

# (comm, layout, kind): 24 runs; QUICK: the 4 of the pytest.
SCENARIOS = [
    ("local", "tp2pp2dp2", "clean"), ("local", "tp2pp2dp2", "slow"),
    ("local", "tp2pp2dp2", "delay"), ("local", "tp2pp2dp2", "double"),
    ("local", "pp4dp2", "clean"), ("local", "pp4dp2", "slow"),
    ("local", "pp4dp2", "bw"), ("local", "pp4dp2", "double-bw"),
    ("local", "pp2dp4", "slow"), ("local", "pp2dp4", "delay"),
    ("local", "tp2pp4", "slow"), ("local", "tp2pp4", "bw"),
    ("local", "tp2pp2dp4", "clean"), ("local", "tp2pp2dp4", "slow"),
    ("local", "tp2pp2dp4", "delay"), ("local", "tp2pp2dp4", "double"),
    ("mpi", "tp2pp2dp2", "clean"), ("mpi", "tp2pp2dp2", "slow"),
    ("mpi", "tp2pp2dp2", "bw"), ("mpi", "tp2pp2dp2", "double"),
    ("mpi", "pp4dp2", "slow"), ("mpi", "pp4dp2", "delay"),
    ("mpi", "tp2pp2dp4", "slow"), ("mpi", "tp2pp2dp4", "double-bw"),
]
# A fast subset (once test_scan_scenarios.py): a control, a slow
# rank and a slow link on 8 rank threads (5 repeats on the loaded 2-core
# dev box were exact, docs/benchmarks.md), and a slow rank among 4 MPI
# processes.
QUICK = [("local", "tp2pp2dp2", "clean"), ("local", "tp2pp2dp2", "slow"),
         ("local", "tp2pp2dp2", "delay"), ("mpi", "pp2dp2", "slow")]


def sh(args, timeout=300):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def make_gpt_plan(d, plan, pp):
    cfg = {"variant": "gpt", "num_layers": 8, "hidden_size": 64,
           "num_attention_heads": 4, "seq_length": 32, "vocab_size": 256,
           "micro_batch_size": 4, "tie_embeddings": True}
    (d / "gpt.json").write_text(json.dumps(cfg))
    sh([MAPP_TRANSLATE, "--import-gpt-config", d / "gpt.json",
        "-o", d / "m.mlir"])
    sh([MAPP_OPT, d / "m.mlir", "--mapp-train-pipeline="
        f"pp={pp} microbatches={MB_PER_DP} schedule=1f1b",
        "-o", d / "t.mlir"])
    sh([MAPP_TRANSLATE, "--mapp-to-plan", d / "t.mlir", "-o", plan])


def name_of(sc):
    return "-".join(sc)


def run_scenario(sc, work, factor=SLOW_FACTOR):
    comm, layout, kind = sc
    tp, pp, dp = LAYOUTS[layout]
    world = tp * pp * dp
    d = pathlib.Path(work) / name_of(sc)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    plan = d / "p.mplan"
    if layout.startswith("gpt"):
        make_gpt_plan(d, plan, pp)
    else:
        sh([MAKE_PLAN, plan, *MODEL, f"microbatches={MB_PER_DP}",
            f"tp={tp}", f"pp={pp}", f"dp={dp}"])
    fl = faults(kind, tp, pp, dp, factor)
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", STEPS,
            "--quiet", "--trace-dir", d / "tr", "--threads", 1]
    for spec, _ in fl:
        args += ["--inject", spec]
    t0 = time.time()
    if comm == "mpi":
        sh([MPIRUN, "--allow-run-as-root", *MPI_PLACEMENT, "-np", world,
            MAPP_RUN, *args, "--comm=mpi"])
    else:
        sh([MAPP_RUN, *args, "--comm=local"])
    t_run = time.time() - t0
    sh([MAPP_SCAN, d / "tr", "--report", d / "r.json", "-q"])
    rep = json.loads((d / "r.json").read_text())
    found = set()
    for f in rep["findings"]:
        if f["kind"] == "slow-rank":
            found.add(("slow-rank", f["rank"]))
        elif f["kind"] == "slow-link":
            found.add(("slow-link", (f["src"], f["dst"])))
    truth = {t for _, t in fl}
    return {"name": name_of(sc), "comm": comm, "layout": layout, "kind": kind,
            "world": world, "inject": [s for s, _ in fl],
            "truth": sorted(map(str, truth)), "found": sorted(map(str, found)),
            "tp": sorted(map(str, truth & found)),
            "fp": sorted(map(str, found - truth)),
            "fn": sorted(map(str, truth - found)),
            "by_kind": {k: {"tp": sum(1 for x in truth & found if x[0] == k),
                            "fp": sum(1 for x in found - truth if x[0] == k),
                            "fn": sum(1 for x in truth - found if x[0] == k)}
                        for k in ("slow-rank", "slow-link")},
            "step_ms": rep["step_time_ms"]["mean"], "run_s": round(t_run, 2),
            "compute_clock": rep["compute_clock"],
            # What a false or missed slow-rank finding is judged from.
            "ranks": [{k: round(x[k], 3) if isinstance(x[k], float) else x[k]
                       for k in ("rank", "compute_ratio",
                                 "kind_ratio_lower_quartile",
                                 "slower_op_fraction", "compared_ops")}
                      for x in rep["ranks"]]}


def table(results):
    rows = []
    tot = {"tp": 0, "fp": 0, "fn": 0}
    for k in ("slow-rank", "slow-link"):
        c = {x: sum(r["by_kind"][k][x] for r in results) for x in tot}
        for x in tot:
            tot[x] += c[x]
        rows.append((k, c))
    rows.append(("overall", tot))
    out = ["| fault kind | injected | found | TP | FP | FN | precision | recall |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k, c in rows:
        p = c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 1.0
        rc = c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 1.0
        out.append(f"| {k} | {c['tp'] + c['fn']} | {c['tp'] + c['fp']} | "
                   f"{c['tp']} | {c['fp']} | {c['fn']} | {p:.2f} | {rc:.2f} |")
    clean = [r for r in results if r["kind"] == "clean"]
    out.append("")
    out.append(f"runs {len(results)}, fault-free controls {len(clean)} "
               f"(with any finding: {sum(1 for r in clean if r['found'])}), "
               f"runs fully correct {sum(1 for r in results if not r['fp'] and not r['fn'])}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each selected scenario N times")
    ap.add_argument("--extra", default="",
                    help="also run these comm:layout:kind scenarios")
    a = ap.parse_args()
    if not (MAPP_RUN and MAKE_PLAN and MAPP_SCAN):
        sys.exit("scenarios.py: mapp-run / mapp-make-test-plan / mapp-scan not built")
    scs = QUICK if a.quick else SCENARIOS
    if a.only:
        want = set(a.only.split(","))
        scs = [s for s in scs if name_of(s) in want]
    if a.extra:
        scs += [tuple(x.split(":")) for x in a.extra.split(",")]
    scs = [s for s in scs for _ in range(a.repeat)]
    if not mpi_usable():
        scs = [s for s in scs if s[0] != "mpi"]
    work = a.keep or tempfile.mkdtemp(prefix="mapp-scen-")
    t0 = time.time()
    results = []
    for n, sc in enumerate(scs):
        r = run_scenario(sc, work, 5 if sc[0] == "mpi" else SLOW_FACTOR)
        results.append(r)
        ok = "ok " if not r["fp"] and not r["fn"] else "BAD"
        if ok == "BAD" and a.keep:  # the next repeat would overwrite it
            shutil.copytree(pathlib.Path(work) / r["name"],
                            pathlib.Path(work) / f"{r['name']}-bad{n}")
        print(f"{ok} {r['name']:28s} world {r['world']:2d} step {r['step_ms']:7.1f} ms "
              f"run {r['run_s']:5.1f} s  truth {r['truth']} found {r['found']}",
              flush=True)
    print()
    print(table(results))
    print(f"\ntotal {time.time() - t0:.0f} s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(results, indent=1))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
