#!/usr/bin/env python3
"""bench/autopar: the auto-parallel search against measurement on CPU ranks.

  bench/autopar/run.py [--comm local,mpi] [--models gpt-a,gpt-b,moe-a]
                       [--steps 5] [--inject-gbps G] [--bin build/bin] [--out DIR]

1. Calibrates a profile (the cost model's rates) from probe runs of a
   calibration model of its own (bench/autopar/calib.json): two single-rank
   runs (micro-batch 2 and 16, one thread) scale the GEMM/streaming rate and
   the per-instruction overhead so that the model predicts both exactly; a
   dp=8 run per communicator fits its latency (MPI: busy_wait, its waiting
   processes poll); `shared_cores` = the machine's cores. The probes run
   before every layout, all through the bench, and the fastest sample of
   each counts (the load of a shared machine changes by the minute):
   DIR/profile-{local,mpi}.json. The layouts never enter the calibration.
2. For each model and communicator: asks `mapp-opt --mapp-auto-parallel`
   (search-only, report=) for every feasible layout of 8 ranks, global batch
   16, in the bench's space (1f1b, no recomputation, micro-batch 1 or 2, one
   chunk, no ZeRO-1; the MoE: micro-batch 2, ep 1/2/4), compiles and runs each with mapp-run
   (8 local rank-threads, or 8 MPI processes), the fastest step_ms of
   steps 2..N over --rounds runs (other processes on a shared machine only
   add time), and prints predicted vs measured side by side, the chosen layout
   (the search's first) against the best measured.
3. --inject-gbps G: the same on local ranks with every point-to-point link
   slowed to G Gb/s (mapp-run --inject link-bandwidth on all pairs; only
   pipeline sends are point-to-point), the profile's links.p2p saying so.

Prints the tables and writes DIR/results.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD, BATCH = 8, 16
SPACE = "schedules=1f1b recompute=none micro-batches=1,2 chunks=1 zero1=false"


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def import_model(args, cfg, mbs, out):
    sh([f"{args.bin}/mapp-translate", "--import-gpt-config", cfg,
        "--micro-batch-size", str(mbs), "-o", out])


def search(args, mlir, profile, work, extra=""):
    rep = os.path.join(work, "report.json")
    opts = (f"world={WORLD} global-batch={BATCH} top=1000 search-only=true "
            f"{SPACE} profile={profile} report={rep} {extra}")
    sh([f"{args.bin}/mapp-opt", mlir, f"--mapp-auto-parallel={opts}", "-o", os.devnull])
    return json.load(open(rep))


def compile_plan(args, cfg, row, work, name="p.mplan"):
    mlir = os.path.join(work, "m.mlir")
    import_model(args, cfg, row["micro_batch"], mlir)
    plan = os.path.join(work, name)
    p1 = subprocess.Popen([f"{args.bin}/mapp-opt", mlir,
                           f"--mapp-train-pipeline={row['options']}", "-mapp-plan-memory"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    sh([f"{args.bin}/mapp-translate", "--mapp-to-plan", "-o", plan], stdin=p1.stdout)
    p1.wait()
    return plan


def run_plan(args, plan, comm, work, inject=()):
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    base = [f"{args.bin}/mapp-run", plan, "--data", f"{ROOT}/data/gpt/news-1k.jsonl",
            "--tokenizer", "bytes", "--steps", str(args.steps), "--quiet",
            "--metrics", metrics]
    for spec in inject:
        base += ["--inject", spec]
    if comm == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(WORLD)] + \
            base + ["--comm=mpi"]
    else:
        cmd = base
    sh(cmd, timeout=300)
    steps = [json.loads(l)["step_ms"] for l in open(metrics)]
    # The machine is shared: other processes only ever add time, so the
    # fastest step after the first is the layout's (as in calibration).
    return min(steps[1:])


class Probes:
    """The calibration runs, sampled between the layouts' runs all through
    the bench (the machine's load changes by the minute; the fastest of
    many samples is the machine's rate): two single-rank runs of
    bench/autopar/calib.json (micro-batch 2 and 16, one thread) for the
    rates and the per-op overhead, a dp=8 run per communicator for its
    latency. The layouts themselves never enter the calibration."""

    BASE = {"device": "cpu", "gemm_tflops": {"f32": 0.05}, "mem_gbps": 8,
            "op_overhead_us": 6, "shared_cores": os.cpu_count() or 2,
            "links": {"intra": {"gbps": 40, "latency_us": 10},
                      "inter": {"gbps": 40, "latency_us": 10}}}

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.cfg = f"{ROOT}/bench/autopar/calib.json"
        self.best = {}
        self.plans = {}
        for mbs in (2, 16):
            row = {"micro_batch": mbs, "options": "microbatches=1"}
            self.plans[f"mbs{mbs}"] = compile_plan(args, self.cfg, row, work,
                                                   f"cal{mbs}.mplan")
        row = {"micro_batch": 2, "options": f"tp=1 pp=1 dp={WORLD} microbatches=1 schedule=1f1b"}
        self.plans["dp8"] = compile_plan(args, self.cfg, row, work, "caldp.mplan")

    def keep(self, key, ms):
        self.best[key] = min(ms, self.best.get(key, float("inf")))

    def sample(self, comm):
        for mbs in (2, 16):
            metrics = os.path.join(self.work, "cal.jsonl")
            sh([f"{self.args.bin}/mapp-run", self.plans[f"mbs{mbs}"], "--data",
                f"{ROOT}/data/gpt/news-1k.jsonl", "--tokenizer", "bytes", "--steps", "6",
                "--threads", "1", "--quiet", "--metrics", metrics])
            steps = [json.loads(l)["step_ms"] for l in open(metrics)]
            self.keep(f"mbs{mbs}", min(steps[2:]))
        self.keep(f"dp8_{comm}", run_plan(self.args, self.plans["dp8"], comm, self.work))
        print(f"  probes: {json.dumps(self.best)}", file=sys.stderr, flush=True)

    def predict(self, prof, world, batch, mbs, dp_only=False):
        f = os.path.join(self.work, "p.json")
        json.dump(prof, open(f, "w"))
        r = os.path.join(self.work, "r.json")
        mlir = os.path.join(self.work, f"calm{mbs}.mlir")
        import_model(self.args, self.cfg, mbs, mlir)
        sh([f"{self.args.bin}/mapp-opt", mlir,
            f"--mapp-auto-parallel=world={world} global-batch={batch} micro-batches={mbs} "
            f"schedules=1f1b recompute=none zero1=false chunks=1 top=1000 search-only=true "
            f"profile={f} report={r}", "-o", os.devnull])
        rows = json.load(open(r))["top"]
        if dp_only:
            rows = [x for x in rows if x["dp"] == world]
        return rows[0]["step_ms"]

    def profile(self, comm):
        base = self.BASE
        meas = [self.best["mbs2"], self.best["mbs16"]]
        a, b = [], []  # ms at the base rates without overhead; ms per us of overhead
        for mbs in (2, 16):
            p = json.loads(json.dumps(base))
            p.pop("shared_cores")
            p["op_overhead_us"] = 0
            p["peak_tflops"] = p["gemm_tflops"]["f32"]
            a.append(self.predict(p, 1, mbs, mbs))
            p["op_overhead_us"] = 1
            p["gemm_tflops"]["f32"] *= 1e6
            p["mem_gbps"] *= 1e6
            p["peak_tflops"] = p["gemm_tflops"]["f32"]
            b.append(self.predict(p, 1, mbs, mbs))
        # meas_i = a_i / k + b_i * o  (k: rate scale, o: us per op)
        det = a[0] * b[1] - a[1] * b[0]
        inv_k = (meas[0] * b[1] - meas[1] * b[0]) / det
        o = (a[0] * meas[1] - a[1] * meas[0]) / det
        if inv_k <= 0 or o < 0:  # keep the default shape, fit one scale
            inv_k = sum(meas) / (sum(a) + 6 * sum(b))
            o = 6 * inv_k
        prof = json.loads(json.dumps(base))
        prof["gemm_tflops"]["f32"] = base["gemm_tflops"]["f32"] / inv_k
        prof["mem_gbps"] = base["mem_gbps"] / inv_k
        prof["op_overhead_us"] = o
        prof["peak_tflops"] = prof["gemm_tflops"]["f32"]  # MFU's denominator
        prof["busy_wait"] = comm == "mpi"  # MPI's waiting processes poll
        # The communicator's latency: what makes the dp=8 run's prediction
        # exact (on few cores, waking 8 ranks, not bytes, is the cost).
        lat = []
        for l in (0.0, 1000.0):
            p = json.loads(json.dumps(prof))
            for c in ("intra", "inter"):
                p["links"][c]["latency_us"] = l
            lat.append(self.predict(p, WORLD, 2 * WORLD, 2, dp_only=True))
        dp_ms = self.best[f"dp8_{comm}"]
        slope = (lat[1] - lat[0]) / 1000.0
        latency = max(0.0, (dp_ms - lat[0]) / slope) if slope > 0 else 10.0
        for c in ("intra", "inter"):
            prof["links"][c]["latency_us"] = latency
        prof["measured"] = {"model": "bench/autopar/calib.json",
                            "fastest_step_ms": {k: v for k, v in self.best.items()}}
        return prof

def inject_specs(gbps):
    return [f"link-bandwidth:src={a},dst={b},gbps={gbps}"
            for a in range(WORLD) for b in range(WORLD) if a != b] if gbps else []


def measure(args, cfg, comm, work, probes, inject_gbps=0, reuse=None):
    """Every feasible layout of the space, run; a probe sample before each."""
    mlir = os.path.join(work, "search.mlir")
    import_model(args, cfg, 1, mlir)
    f = os.path.join(work, "base.json")
    json.dump(Probes.BASE, open(f, "w"))
    out = {}
    extra = "micro-batches=2" if "moe" in os.path.basename(cfg) else ""
    for i, row in enumerate(search(args, mlir, f, work, extra)["top"][:args.max_layouts or None]):
        key = row["layout"]
        if reuse is not None and row["pp"] == 1 and key in reuse:
            out[key] = reuse[key]  # no point-to-point link: the fault cannot act
            continue
        if i % args.probe_every == 0:
            probes.sample(comm)
        plan = compile_plan(args, cfg, row, work)
        out[key] = min(run_plan(args, plan, comm, work, inject_specs(inject_gbps))
                       for _ in range(args.rounds))
        print(f"  {os.path.basename(cfg)[:-5]:6} {comm:5} inject {inject_gbps:g} "
              f"{key:36} measured {out[key]:8.2f} ms", file=sys.stderr, flush=True)
    return out


def table(args, cfg, comm, profile, work, measured, inject_gbps=0):
    mlir = os.path.join(work, "search.mlir")
    import_model(args, cfg, 1, mlir)
    extra = "micro-batches=2" if "moe" in os.path.basename(cfg) else ""
    rep = search(args, mlir, profile, work, extra)
    rows = [{"layout": r["layout"], "predicted_ms": r["step_ms"],
             "measured_ms": measured[r["layout"]]} for r in rep["top"]
            if r["layout"] in measured]
    chosen = rows[0]
    best = min(rows, key=lambda r: r["measured_ms"])
    within = sum(1 for r in rows
                 if abs(r["predicted_ms"] - r["measured_ms"]) <= 0.2 * r["measured_ms"])
    return {"model": os.path.basename(cfg)[:-5], "comm": comm, "inject_gbps": inject_gbps,
            "rows": rows, "chosen": chosen["layout"], "chosen_ms": chosen["measured_ms"],
            "best": best["layout"], "best_ms": best["measured_ms"],
            "chosen_over_best": chosen["measured_ms"] / best["measured_ms"] - 1,
            "within_20pct": within, "layouts": len(rows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--comm", default="local,mpi")
    ap.add_argument("--models", default="gpt-a,gpt-b,moe-a")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of each layout; the fastest counts")
    ap.add_argument("--inject-gbps", type=float, default=0)
    ap.add_argument("--bin", default=f"{ROOT}/build/bin")
    ap.add_argument("--out")
    ap.add_argument("--probe-every", type=int, default=2,
                    help="calibration probes before every Nth layout")
    ap.add_argument("--max-layouts", type=int, default=0, help="smoke tests: the first N")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="autopar-")
    out = args.out or work
    os.makedirs(out, exist_ok=True)
    probes = Probes(args, work)
    comms = args.comm.split(",")
    runs = []  # (cfg, comm, inject, measured)
    for model in args.models.split(","):
        cfg = f"{ROOT}/bench/autopar/{model}.json"
        for comm in comms:
            runs.append((cfg, comm, 0, measure(args, cfg, comm, work, probes)))
        if args.inject_gbps and "local" in comms:
            local = next(m for c, k, g, m in runs if c == cfg and k == "local" and not g)
            runs.append((cfg, "local", args.inject_gbps,
                         measure(args, cfg, "local", work, probes, args.inject_gbps, local)))
    pfiles = {}
    for comm in comms:
        prof = probes.profile(comm)
        pfiles[comm] = os.path.join(out, f"profile-{comm}.json")
        json.dump(prof, open(pfiles[comm], "w"), indent=1)
        print(f"profile {comm}: {json.dumps(prof)}", file=sys.stderr)
        if args.inject_gbps and comm == "local":
            slow = json.loads(json.dumps(prof))
            slow["links"]["p2p"] = {"gbps": args.inject_gbps,
                                    "latency_us": prof["links"]["intra"]["latency_us"]}
            pfiles["local-slow"] = os.path.join(out, "profile-local-slow-p2p.json")
            json.dump(slow, open(pfiles["local-slow"], "w"), indent=1)
    results = []
    for cfg, comm, gbps, measured in runs:
        results.append(table(args, cfg, comm, pfiles["local-slow" if gbps else comm],
                             work, measured, gbps))
        for r in results[-1]["rows"]:
            print(f"  {results[-1]['model']:6} {comm:5} {gbps:g} {r['layout']:36} predicted "
                  f"{r['predicted_ms']:8.2f} measured {r['measured_ms']:8.2f} ms")
    json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
    print(f"{'model':7} {'comm':5} {'inject':>7} {'layouts':>7} {'chosen (search #1)':36} "
          f"{'ms':>7} {'best measured':36} {'ms':>7} {'chosen/best':>11} {'pred within 20%':>15}")
    for r in results:
        inj = f"{r['inject_gbps']:g}G" if r["inject_gbps"] else "-"
        print(f"{r['model']:7} {r['comm']:5} {inj:>7} {r['layouts']:>7} {r['chosen']:36} "
              f"{r['chosen_ms']:7.2f} {r['best']:36} {r['best_ms']:7.2f} "
              f"{100 * r['chosen_over_best']:+10.1f}% {r['within_20pct']:>7}/{r['layouts']}")


if __name__ == "__main__":
    main()
