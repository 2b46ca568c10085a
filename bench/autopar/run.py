#!/usr/bin/env python3
"""bench/autopar: the auto-parallel search against measurement on CPU ranks.

One run (a machine with mapp-opt, mapp-translate, mapp-run and mpirun):
  bench/autopar/run.py [--comm local,mpi] [--models gpt-a,gpt-b,moe-a]
                       [--steps 6] [--rounds 2] [--inject-gbps G]
                       [--bin build/bin] [--out DIR]
Or in three stages, when the measuring machine has only mapp-run:
  run.py --stage compile DIR [--models ...] [--bin DIR]    (mapp-opt, mapp-translate)
  run.py --stage measure DIR [--comm ...] [--models ...] [--inject-gbps G]
         [--steps N] [--rounds R] [--budget-s S] [--measured FILE] [--bin DIR]
                                                            (mapp-run, mpirun only)
  run.py --stage analyze DIR [--measured FILE[,FILE...]] [--bin DIR]  (mapp-opt)
         [--probe-load] [--fit-bandwidth] [--shm-collectives]

compile: imports each model, asks `mapp-opt --mapp-auto-parallel` (search-
  only, report=, the default CPU profile) for every feasible layout of 8
  ranks, global batch 16, in the bench's space (1f1b, no recomputation,
  micro-batch 1 or 2, one chunk, no ZeRO-1; the MoE: micro-batch 2, ep
  1/2/4), compiles each layout's plan and the calibration probes' plans
  (xz-compressed, DIR/plans/) and writes DIR/manifest.json. The list is the
  search's own and does not depend on the profile.
measure: runs the probes and every layout with mapp-run (8 local rank-
  threads, or 8 MPI processes; one thread a rank, as the probes and the
  model price them), and with --inject-gbps G the local ranks again with
  every point-to-point link slowed to G Gb/s (mapp-run --inject
  link-bandwidth on all pairs; only pipeline sends are point-to-point; pp = 1
  layouts reuse their fault-free time). Each round runs every (layout,
  communicator) pair once, the communicators alternating per layout, every
  other round in reverse order, probes every --probe-every runs, so the
  machine's drift hits all alike; a layout's time is the fastest step after
  the first over its rounds (other processes only add time). Rounds after
  the first start only while --budget-s allows a whole one. Writes the
  samples to --measured (default DIR/measured.json) after every run, so a
  cut-off call leaves what it measured.
analyze: calibrates the profile from the probes as below (shared_cores: the
  measuring machine's cores), runs the search with it, and prints predicted
  vs measured per layout, the chosen layout (the search's first) against
  the best measured, and issue 36's criteria with PASS/FAIL per row; writes
  DIR/profile-*.json, DIR/results.json and DIR/table.md (docs/benchmarks.md's
  table).

Calibration: two single-rank runs of a calibration model of its own
(bench/autopar/calib.json, micro-batch 2 and 16, one thread) scale the
GEMM/streaming rate and the per-instruction overhead so that the model
predicts both exactly (the rates' shape: the kernels' own, GEMMs by size,
the activation function and streaming, from the `mapp-run --calibrate` the
measure stage runs on the measuring host, or --rates-from; without either,
the default profile's); a dp=8 run per communicator fits its latency (MPI:
busy_wait, its waiting processes poll). The fastest sample of each probe
counts. The layouts never enter the calibration. Variants, from the same
measurements (their outputs tagged -load, -bw, -shm): --probe-load takes the
rates, and the kernels' shape, from runs of one copy a core at once;
--fit-bandwidth fits latency and bandwidth from the dp=8 probes of
calib.json and calib-wide.json; --shm-collectives prices the local
communicator's collectives as its barriers. Choose a variant by the tp2/pp2
probe checks analyze prints (calibration probes, never bench layouts), not
by which one passes the bench.
"""
import argparse
import hashlib
import json
try:
    import lzma
except ImportError:  # a Python built without it: the xz tool decompresses
    lzma = None
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measured import calibrate_kernels, criteria, load_measured, write_tables  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD, BATCH = 8, 16
SPACE = "schedules=1f1b recompute=none micro-batches=1,2 chunks=1 zero1=false"
DATA = "data/gpt/news-1k.jsonl"
CALIB = "bench/autopar/calib.json"
CALIB_WIDE = "bench/autopar/calib-wide.json"
BASE_PROFILE = {"device": "cpu", "gemm_tflops": {"f32": 0.05}, "mem_gbps": 8,
                "op_overhead_us": 6,
                "links": {"intra": {"gbps": 40, "latency_us": 10},
                          "inter": {"gbps": 40, "latency_us": 10}}}
# The probes: single-rank runs of the calibration model at two micro-batch
# sizes, and a dp=WORLD run of it per communicator; dp8w: the same dp run of
# a model with a 16x larger gradient (analyze --fit-bandwidth); tp2 and pp2:
# checks of the fitted profile on small tensor-parallel collectives and
# pipeline messages (analyze prints predicted against measured; never fitted).
DP_ROW = {"micro_batch": 2, "options": f"tp=1 pp=1 dp={WORLD} microbatches=1 schedule=1f1b"}
CHECK_ROWS = {"tp2": (2, 1, WORLD // 2, 1), "pp2": (1, 2, WORLD // 2, 2)}  # tp, pp, dp, microbatches
PROBE_LAYOUTS = {"dp8": (1, 1, WORLD, 1), **CHECK_ROWS}
PROBE_ROWS = {"mbs2": (CALIB, {"micro_batch": 2, "options": "microbatches=1"}),
              "mbs16": (CALIB, {"micro_batch": 16, "options": "microbatches=1"}),
              "dp8": (CALIB, DP_ROW), "dp8w": (CALIB_WIDE, DP_ROW),
              **{k: (CALIB, {"micro_batch": 2, "options":
                             f"tp={t} pp={pp} dp={dp} microbatches={m} schedule=1f1b"})
                 for k, (t, pp, dp, m) in CHECK_ROWS.items()}}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
    except subprocess.CalledProcessError as e:
        sys.exit(f"run.py: command failed ({e.returncode}): {' '.join(cmd)}\n{e.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        sys.exit(f"run.py: command timed out: {' '.join(cmd)}")


def tool(args, name):
    path = os.path.join(args.bin, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"run.py: {path}: not found or not executable (--bin)")
    return path


def extra_space(cfg):
    return "micro-batches=2" if "moe" in os.path.basename(cfg) else ""


# --------------------------------------------------------------------------
# compile (mapp-opt, mapp-translate)
# --------------------------------------------------------------------------

def import_model(args, cfg, mbs, out):
    sh([tool(args, "mapp-translate"), "--import-gpt-config", cfg,
        "--micro-batch-size", str(mbs), "-o", out])


def search(args, mlir, profile, work, extra=""):
    rep = os.path.join(work, "report.json")
    opts = (f"world={WORLD} global-batch={BATCH} top=1000 search-only=true "
            f"{SPACE} profile={profile} report={rep} {extra}")
    sh([tool(args, "mapp-opt"), mlir, f"--mapp-auto-parallel={opts}", "-o", os.devnull])
    return json.load(open(rep))


def search_model(args, cfg, profile, work):
    mlir = os.path.join(work, "search.mlir")
    import_model(args, cfg, 1, mlir)
    return search(args, mlir, profile, work, extra_space(cfg))


def compile_plan(args, cfg, row, work, out):
    """Compiles one layout's plan into OUT, xz-compressed (the plans are
    ~20x smaller so: the device call carries them)."""
    mlir = os.path.join(work, "m.mlir")
    import_model(args, cfg, row["micro_batch"], mlir)
    plan = os.path.join(work, "p.mplan")
    sh([tool(args, "mapp-opt"), mlir, f"--mapp-train-pipeline={row['options']}",
        "-mapp-plan-memory", "-o", os.path.join(work, "t.mlir")])
    sh([tool(args, "mapp-translate"), "--mapp-to-plan", os.path.join(work, "t.mlir"),
        "-o", plan])
    with open(plan, "rb") as f, lzma.open(out, "wb", preset=6) as g:
        shutil.copyfileobj(f, g)


def layout_file(key):
    return key.replace(" ", "_").replace("×", "x")


def stage_compile(args, d):
    work = tempfile.mkdtemp(prefix="autopar-compile-")
    os.makedirs(os.path.join(d, "plans"), exist_ok=True)
    base = os.path.join(work, "base.json")
    json.dump(BASE_PROFILE, open(base, "w"))
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    manifest = {"world": WORLD, "global_batch": BATCH, "space": SPACE,
                "commit": git, "data": DATA,
                "data_sha256": hashlib.sha256(open(f"{ROOT}/{DATA}", "rb").read()).hexdigest(),
                "probes": {}, "models": {}}
    for key, (cfg, row) in PROBE_ROWS.items():
        rel = f"plans/probe-{key}.mplan.xz"
        compile_plan(args, f"{ROOT}/{cfg}", row, work, os.path.join(d, rel))
        manifest["probes"][key] = rel
    for model in args.models.split(","):
        cfg = f"{ROOT}/bench/autopar/{model}.json"
        if not os.path.exists(cfg):
            sys.exit(f"run.py: {cfg}: no such model")
        os.makedirs(os.path.join(d, "plans", model), exist_ok=True)
        rows = search_model(args, cfg, base, work)["top"][:args.max_layouts or None]
        layouts = []
        for row in rows:
            rel = f"plans/{model}/{layout_file(row['layout'])}.mplan.xz"
            compile_plan(args, cfg, row, work, os.path.join(d, rel))
            layouts.append({"layout": row["layout"], "pp": row["pp"], "plan": rel,
                            "options": row["options"], "micro_batch": row["micro_batch"]})
            log(f"  compiled {model:6} {row['layout']}")
        manifest["models"][model] = {"config": f"bench/autopar/{model}.json",
                                     "layouts": layouts}
    json.dump(manifest, open(os.path.join(d, "manifest.json"), "w"), indent=1)
    shutil.rmtree(work)
    n = sum(len(m["layouts"]) for m in manifest["models"].values())
    size = sum(os.path.getsize(os.path.join(r, f))
               for r, _, fs in os.walk(d) for f in fs)
    print(f"compiled {n} layouts of {len(manifest['models'])} models and "
          f"{len(PROBE_ROWS)} probes into {d} ({size / 2**20:.1f} MiB)")


# --------------------------------------------------------------------------
# measure (mapp-run, mpirun)
# --------------------------------------------------------------------------

def inject_specs(gbps):
    return [f"link-bandwidth:src={a},dst={b},gbps={gbps}"
            for a in range(WORLD) for b in range(WORLD) if a != b] if gbps else []


class RunFailed(Exception):
    pass


class Runner:
    """mapp-run over 8 local rank-threads or 8 MPI processes, one thread a
    rank (the cost model prices a rank on one core, as the probes measure
    it; mapp-run's default would give each rank cores/ranks threads)."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.mapp_run = tool(args, "mapp-run")
        self.mpi_flags = None
        self.data = f"{ROOT}/{DATA}"

    def base(self, plan, metrics, steps):
        return [self.mapp_run, plan, "--data", self.data, "--tokenizer", "bytes",
                "--steps", str(steps), "--threads", "1", "--quiet", "--metrics", metrics]

    def mpi_preflight(self, plan):
        """The first mpirun flags that run PLAN's 8 processes: none, then the
        ones a container or a small host needs (no CMA single copy between
        processes; more processes than cores)."""
        tries = [[], ["--mca", "btl_vader_single_copy_mechanism", "none"],
                 ["--oversubscribe"],
                 ["--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]]
        for flags in tries:
            self.mpi_flags = flags
            try:
                self.run(plan, "mpi", 2)
                log(f"mpirun flags: {' '.join(flags) or '(none)'}")
                return
            except RunFailed as e:
                if "built without MPI" in str(e):
                    sys.exit(f"run.py: {self.mapp_run}: built without MPI; --comm mpi "
                             "needs a mapp-run configured with MAPP_ENABLE_MPI=ON")
                log(f"mpirun {' '.join(flags) or '(no flags)'}: {str(e)[-600:]}")
        sys.exit("run.py: mpirun fails with every flag set tried (see above)")

    def run(self, plan, comm, steps, inject=(), skip=1, copies=1):
        """The fastest step after the first SKIP (other processes only ever
        add time); with COPIES, that many single-rank runs at once (the
        rate of a core while the others are busy too), their median."""
        procs = []
        for i in range(copies):
            metrics = os.path.join(self.work, f"metrics{i}.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            cmd = self.base(plan, metrics, steps)
            for spec in inject:
                cmd += ["--inject", spec]
            if comm == "mpi":
                cmd = ["mpirun", "--allow-run-as-root"] + self.mpi_flags + \
                    ["-np", str(WORLD)] + cmd + ["--comm=mpi"]
            # Its own process group: a hung run (mpirun and its ranks) is
            # ended as a whole.
            procs.append((cmd, metrics, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)))
        fastest, failed = [], None
        deadline = time.monotonic() + self.args.run_timeout_s
        for cmd, metrics, proc in procs:
            try:
                _, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.end(proc)
                failed = failed or f"timed out after {self.args.run_timeout_s:.0f} s: {' '.join(cmd)}"
                continue
            if proc.returncode:
                failed = failed or f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}"
                continue
            steps_ms = [json.loads(l)["step_ms"] for l in list(open(metrics))[skip:]]
            if not steps_ms:
                failed = failed or f"no step after the first {skip}: {' '.join(cmd)}"
                continue
            fastest.append(min(steps_ms))
        if failed:
            raise RunFailed(failed)
        return sorted(fastest)[len(fastest) // 2]

    @staticmethod
    def end(proc):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


def host_info():
    name = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"node": platform.node(), "cpus": usable or os.cpu_count() or 1, "cpu": name,
            "cpu_count": os.cpu_count()}


def write_json(path, obj):
    tmp = path + ".tmp"
    json.dump(obj, open(tmp, "w"), indent=1)
    os.replace(tmp, path)


def stage_measure(args, d):
    start = time.monotonic()
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    if manifest["world"] != WORLD or manifest["global_batch"] != BATCH:
        sys.exit("run.py: the manifest was compiled for another world or batch")
    got = hashlib.sha256(open(f"{ROOT}/{DATA}", "rb").read()).hexdigest()
    if got != manifest["data_sha256"]:
        sys.exit(f"run.py: {DATA} differs from the one compiled against")
    work = tempfile.mkdtemp(prefix="autopar-measure-")
    runner = Runner(args, work)

    def plan(rel):  # the plans travel compressed
        out = os.path.join(work, rel.replace("/", "_")[:-3])
        if not os.path.exists(out):
            if lzma is None:
                with open(out, "wb") as g:
                    subprocess.run(["xz", "-dc", os.path.join(d, rel)], stdout=g, check=True)
            else:
                with lzma.open(os.path.join(d, rel)) as f, open(out, "wb") as g:
                    shutil.copyfileobj(f, g)
        return out

    comms = args.comm.split(",")
    for c in comms:
        if c not in ("local", "mpi"):
            sys.exit(f"run.py: --comm {c}: expected local or mpi")
    models = args.models.split(",")
    for m in models:
        if m not in manifest["models"]:
            sys.exit(f"run.py: --models {m}: not compiled into {d} "
                     f"(has {','.join(manifest['models'])})")
    try:  # a mapp-run that cannot start (a missing library) fails here, once
        runner.run(plan(manifest["probes"]["mbs2"]), "local", 2)
    except RunFailed as e:
        sys.exit(f"run.py: {runner.mapp_run} does not run here: {e}")
    # The host's kernel rates on one core, alone and with every rank's core
    # busy (analyze shapes the profile with them; the probes set its level).
    copies = min(WORLD, host_info()["cpus"])
    calibrate_profile, calibrate_loaded = calibrate_kernels(runner.mapp_run, work, copies)
    if "mpi" in comms:
        if not shutil.which("mpirun"):
            sys.exit("run.py: --comm mpi needs mpirun on PATH")
        runner.mpi_preflight(plan(manifest["probes"]["dp8"]))
    # One item per (layout, communicator, injection); the communicators
    # alternate per layout.
    items = []
    for m in models:
        for lay in manifest["models"][m]["layouts"]:
            for c in comms:
                items.append((m, lay, c, 0))
            if args.inject_gbps and "local" in comms and lay["pp"] > 1:
                items.append((m, lay, "local", args.inject_gbps))
    out = {"host": host_info(), "steps": args.steps, "rounds": 0,
           "inject_gbps": args.inject_gbps, "comms": comms, "models": models,
           "commit": manifest["commit"], "complete": False,
           "probes": {}, "layouts": {}, "calibrate_profile": calibrate_profile,
           "calibrate_profile_loaded": calibrate_loaded}

    def key(m, c, g):
        return f"{m}/{c}/{g:g}"

    # --resume: a call cut off in its first round goes on where it stopped
    # (its samples kept, its first round's measured runs not repeated).
    done = set()
    if args.resume:
        prev = json.load(open(args.resume))
        if prev["host"]["cpus"] != out["host"]["cpus"] or prev["steps"] != args.steps:
            sys.exit(f"run.py: --resume {args.resume}: measured on {prev['host']['cpus']} "
                     f"CPUs with {prev['steps']} steps, this call {out['host']['cpus']} "
                     f"and {args.steps}")
        out["probes"], out["layouts"] = prev["probes"], prev["layouts"]
        out["resumed_from"] = prev.get("wall_s", "cut off")
        done = {(m, lay["layout"], c, g) for m, lay, c, g in items
                if lay["layout"] in prev["layouts"].get(key(m, c, g), {})}
        log(f"resumed: {len(done)} of {len(items)} runs measured already")

    # The single-rank probes also as one copy per rank that a core serves
    # (analyze --probe-load: a core's rate while all ranks compute).

    out["failures"] = []

    def attempt(what, *a, **kw):
        """A run, once more if it fails; a second failure is recorded (the
        call goes on: one bad run must not cost the others)."""
        for tries in (1, 2):
            try:
                return runner.run(*a, **kw)
            except RunFailed as e:
                log(f"run failed ({what}, try {tries}): {e}")
        out["failures"].append(what)
        return None

    def keep_probe(key, ms):
        if ms is not None:
            out["probes"].setdefault(key, []).append(ms)

    def sample_probes(comm):
        for mbs in ("mbs2", "mbs16"):
            p = plan(manifest["probes"][mbs])
            keep_probe(mbs, attempt(f"probe {mbs}", p, "local", 6, skip=2))
            keep_probe(f"{mbs}_loaded", attempt(f"probe {mbs} x{copies}", p, "local", 6,
                                                skip=2, copies=copies))
        for dp in ("dp8", "dp8w", *CHECK_ROWS):
            if dp in manifest["probes"]:
                keep_probe(f"{dp}_{comm}", attempt(f"probe {dp} {comm}",
                                                   plan(manifest["probes"][dp]),
                                                   comm, args.steps))
        log("  probes (fastest): " + json.dumps(
            {k: round(min(v), 3) for k, v in out["probes"].items()}))

    run_s = []  # seconds per run (its probes included) of the finished rounds
    for r in range(args.rounds):
        elapsed = time.monotonic() - start
        need = 1.1 * max(run_s, default=0) * len(items)
        if r > 0 and args.budget_s and elapsed + need > args.budget_s:
            log(f"round {r + 1}: skipped (elapsed {elapsed:.0f} s, a round "
                f"takes ~{need:.0f} s, budget {args.budget_s:.0f} s)")
            break
        t0 = time.monotonic()
        order = items if r % 2 == 0 else items[::-1]
        if r == 0:
            order = [x for x in order if (x[0], x[1]["layout"], x[2], x[3]) not in done]
        for i, (m, lay, c, g) in enumerate(order):
            if i % args.probe_every == 0:
                sample_probes(c)
            ms = attempt(f"{m} {c} inject {g:g} {lay['layout']} round {r + 1}",
                         plan(lay["plan"]), c, args.steps, inject_specs(g))
            if ms is not None:
                out["layouts"].setdefault(key(m, c, g), {}).setdefault(
                    lay["layout"], []).append(ms)
            write_json(args.measured, out)
            now = time.monotonic()
            shown = "failed" if ms is None else f"{ms:9.2f} ms"
            print(f"[{now - start:6.0f} s] round {r + 1} {i + 1:3}/{len(order)} "
                  f"{m:6} {c:5} inject {g:g} {lay['layout']:34} {shown}"
                  + (f"  (round 1 projected {(now - t0) / (i + 1) * len(order):.0f} s)"
                     if r == 0 and i % 10 == 9 else ""), flush=True)
            if args.budget_s and now - start > args.budget_s and i + 1 < len(order):
                if r == 0:
                    write_json(args.measured, out)
                    sys.exit(f"run.py: over the budget ({args.budget_s:.0f} s) in round 1 "
                             f"after {i + 1} of {len(order)} runs; {args.measured} has "
                             "them (go on with --resume it, or split the call with --models)")
                # A later round cut short: its samples count all the same.
                log(f"round {r + 1}: stopped at the budget after {i + 1} of {len(order)} runs")
                out["partial_round"] = i + 1
                break
        else:
            if order:
                run_s.append((time.monotonic() - t0) / len(order))
            out["rounds"] = r + 1
            write_json(args.measured, out)
            continue
        break
    sample_probes(comms[-1])
    out["complete"] = True
    out["wall_s"] = round(time.monotonic() - start, 1)
    write_json(args.measured, out)
    shutil.rmtree(work)
    print(f"measured {len(items)} runs a round x {out['rounds']} rounds in "
          f"{out['wall_s']:.0f} s on {out['host']['cpus']} CPUs: {args.measured}")
    if out["failures"]:
        sys.exit(f"run.py: {len(out['failures'])} runs failed twice: "
                 + "; ".join(out["failures"]))


# --------------------------------------------------------------------------
# analyze (mapp-opt)
# --------------------------------------------------------------------------

def scale_rates(p, f):
    """Every compute rate of profile dict `p` times `f` (gemm_tflops, the
    gemm_rates table by size, the activation functions')."""
    p["gemm_tflops"]["f32"] *= f
    for pt in p.get("gemm_rates", {}).get("f32", []):
        pt[1] *= f
    if "activation_gelems" in p:
        p["activation_gelems"] *= f


def peak_of(p):
    """MFU's denominator and the search's bound: the fastest rate priced."""
    return max([p["gemm_tflops"]["f32"]] + [r for _, r in p.get("gemm_rates", {}).get("f32", [])])


def kernel_rates(args, meas):
    """The kernels' rates that shape the base profile (GEMMs by size, the
    activation functions and the streaming bandwidth, relative to each
    other; the probes fit their common scale): --rates-from's profile, else
    the one `mapp-run --calibrate` measured on the measuring host (measure
    stage; with --probe-load, its copies run on every rank's core at once),
    else none (the default profile's shape, one GEMM rate for every size)."""
    loaded = getattr(args, "probe_load", False) and meas.get("calibrate_profile_loaded")
    prof = (json.load(open(args.rates_from)) if args.rates_from
            else loaded or meas.get("calibrate_profile"))
    if not prof or not prof.get("gemm_rates", {}).get("f32"):
        return None
    return {"gemm_tflops": {"f32": prof["gemm_tflops"]["f32"]},
            "gemm_rates": {"f32": prof["gemm_rates"]["f32"]}, "mem_gbps": prof["mem_gbps"],
            **({"activation_gelems": prof["activation_gelems"]}
               if prof.get("activation_gelems") else {})}


class Calibration:
    """The profile from the probes' fastest samples: the rate scale and the
    per-op overhead from the two single-rank runs, the communicator's
    latency from the dp=8 run. Variants (the same measurements): the
    single-rank probes run as one copy per core at once (--probe-load), the
    latency and the bandwidth from the dp=8 runs of two gradient sizes
    (--fit-bandwidth)."""

    def __init__(self, args, work, best, cores, rates=None):
        self.args, self.work, self.best, self.cores = args, work, best, cores
        self.rates = rates  # kernel_rates() or None

    def predict(self, prof, world, batch, mbs, dp_only=False, cfg=CALIB, want=None):
        f = os.path.join(self.work, "p.json")
        json.dump(prof, open(f, "w"))
        r = os.path.join(self.work, "r.json")
        mlir = os.path.join(self.work, f"calm{mbs}-{os.path.basename(cfg)}.mlir")
        if not os.path.exists(mlir):
            import_model(self.args, f"{ROOT}/{cfg}", mbs, mlir)
        sh([tool(self.args, "mapp-opt"), mlir,
            f"--mapp-auto-parallel=world={world} global-batch={batch} micro-batches={mbs} "
            f"schedules=1f1b recompute=none zero1=false chunks=1 top=1000 search-only=true "
            f"profile={f} report={r}", "-o", os.devnull])
        rows = json.load(open(r))["top"]
        if dp_only:
            rows = [x for x in rows if x["dp"] == world]
        if want:  # (tp, pp, dp)
            rows = [x for x in rows if (x["tp"], x["pp"], x["dp"]) == want]
        return rows[0]["step_ms"]

    def profile(self, comm):
        base = json.loads(json.dumps(BASE_PROFILE))
        base["shared_cores"] = self.cores
        if self.rates:  # the kernels' rates relative to each other; the fit scales them
            base.update(json.loads(json.dumps(self.rates)))
        load = "_loaded" if self.args.probe_load else ""
        meas = [self.best["mbs2" + load], self.best["mbs16" + load]]
        a, b = [], []  # ms at the base rates without overhead; ms per us of overhead
        for mbs in (2, 16):
            p = json.loads(json.dumps(base))
            p.pop("shared_cores")
            p["op_overhead_us"] = 0
            p["peak_tflops"] = peak_of(p)
            a.append(self.predict(p, 1, mbs, mbs))
            p["op_overhead_us"] = 1
            scale_rates(p, 1e6)
            p["mem_gbps"] *= 1e6
            p["peak_tflops"] = peak_of(p)
            b.append(self.predict(p, 1, mbs, mbs))
        # meas_i = a_i / k + b_i * o  (k: rate scale, o: us per op)
        det = a[0] * b[1] - a[1] * b[0]
        inv_k = (meas[0] * b[1] - meas[1] * b[0]) / det
        o = (a[0] * meas[1] - a[1] * meas[0]) / det
        if inv_k <= 0 or o < 0:  # keep the default shape, fit one scale
            inv_k = sum(meas) / (sum(a) + 6 * sum(b))
            o = 6 * inv_k
        prof = json.loads(json.dumps(base))
        scale_rates(prof, 1 / inv_k)
        prof["mem_gbps"] = base["mem_gbps"] / inv_k
        prof["op_overhead_us"] = o
        prof["peak_tflops"] = peak_of(prof)  # MFU's denominator
        prof["busy_wait"] = comm == "mpi"  # MPI's waiting processes poll
        if self.args.shm_collectives and comm == "local":
            # The thread communicator's collectives: barriers, not ring steps.
            prof["collectives"] = "shared-memory"
        # The communicator's latency: what makes the dp=8 run's prediction
        # exact (on few cores, waking 8 ranks, not bytes, is the cost);
        # --latency-from tp2: the tp=2 run's, 34 small all-reduces a step.
        def probe_predict(key, latency_us, gbps, cfg=CALIB):
            p = json.loads(json.dumps(prof))
            for c in ("intra", "inter"):
                p["links"][c] = {"gbps": gbps, "latency_us": latency_us}
            t, pp, dp, m = PROBE_LAYOUTS[key]
            return self.predict(p, WORLD, 2 * dp * m, 2, cfg=cfg, want=(t, pp, dp))

        def dp_predict(cfg, latency_us, gbps):
            return probe_predict("dp8", latency_us, gbps, cfg)

        gbps = BASE_PROFILE["links"]["intra"]["gbps"]
        src = self.args.latency_from
        if f"{src}_{comm}" not in self.best:
            sys.exit(f"run.py: --latency-from {src}: no {src} probe measured over {comm}")
        lat = [probe_predict(src, l, gbps) for l in (0.0, 1000.0)]
        probe_ms = self.best[f"{src}_{comm}"]
        slope = (lat[1] - lat[0]) / 1000.0
        latency = max(0.0, (probe_ms - lat[0]) / slope) if slope > 0 else 10.0
        if self.args.fit_bandwidth and src == "dp8":
            # dp_j = base_j + latency * sl_j + (1 / gbps) * sb_j for the two
            # probes (their gradients 16x apart): both unknowns.
            eqs = []
            for cfg, key in ((CALIB, "dp8"), (CALIB_WIDE, "dp8w")):
                base_ms = dp_predict(cfg, 0.0, 1e9)
                sl = (dp_predict(cfg, 1000.0, 1e9) - base_ms) / 1000.0
                sb = dp_predict(cfg, 0.0, 1.0) - base_ms
                eqs.append((sl, sb, self.best[f"{key}_{comm}"] - base_ms))
            (a1, b1, c1), (a2, b2, c2) = eqs
            det = a1 * b2 - a2 * b1
            lat_fit = (c1 * b2 - c2 * b1) / det if det else -1
            inv_gbps = (a1 * c2 - a2 * c1) / det if det else -1
            if lat_fit >= 0 and inv_gbps > 0:
                latency, gbps = lat_fit, 1 / inv_gbps
            else:
                log(f"fit-bandwidth {comm}: no positive latency and bandwidth fit "
                    f"(latency {lat_fit:.1f} us, 1/gbps {inv_gbps:.4g}): latency only")
        for c in ("intra", "inter"):
            prof["links"][c] = {"gbps": gbps, "latency_us": latency}
        # Checks, never fitted: the tp, pp (and dp) probes' predictions.
        checks = {}
        for k, (t, pp, dp, m) in PROBE_LAYOUTS.items():
            if k != src and f"{k}_{comm}" in self.best:
                pred = self.predict(prof, WORLD, 2 * dp * m, 2, want=(t, pp, dp))
                meas_ms = self.best[f"{k}_{comm}"]
                checks[k] = {"predicted_ms": pred, "measured_ms": meas_ms}
                log(f"check {comm} {k} (calib.json tp{t} pp{pp} dp{dp} mbs2x{m}): predicted "
                    f"{pred:.2f} ms, measured {meas_ms:.2f} ms ({100 * (pred / meas_ms - 1):+.1f}%)")
        prof["measured"] = {"model": CALIB, "cores": self.cores, "checks": checks,
                            "probe_load": self.args.probe_load,
                            "fit_bandwidth": self.args.fit_bandwidth,
                            "latency_from": src,
                            "shm_collectives": self.args.shm_collectives,
                            "fastest_step_ms": {k: v for k, v in self.best.items()}}
        return prof


def stage_analyze(args, d):
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    files = args.measured.split(",")
    meas = load_measured(files)
    work = tempfile.mkdtemp(prefix="autopar-analyze-")
    best_probe = {k: min(v) for k, v in meas["probes"].items()}
    cores = meas["host"]["cpus"]
    cal = Calibration(args, work, best_probe, cores, kernel_rates(args, meas))
    gbps = meas["inject_gbps"]
    # The calibration variant names its outputs (several from one measurement).
    tag = ("-load" if args.probe_load else "") + ("-bw" if args.fit_bandwidth else "") + \
        ("-shm" if args.shm_collectives else "") + \
        ("-lat" + args.latency_from if args.latency_from != "dp8" else "") + \
        ("-rates" if cal.rates else "")
    pfiles = {}
    for comm in meas["comms"]:
        prof = cal.profile(comm)
        pfiles[(comm, 0)] = os.path.join(d, f"profile-{comm}{tag}.json")
        write_json(pfiles[(comm, 0)], prof)
        log(f"profile {comm}: {json.dumps(prof)}")
        if gbps and comm == "local":
            slow = json.loads(json.dumps(prof))
            slow["links"]["p2p"] = {"gbps": gbps,
                                    "latency_us": prof["links"]["intra"]["latency_us"]}
            pfiles[(comm, gbps)] = os.path.join(d, f"profile-local-slow-p2p{tag}.json")
            write_json(pfiles[(comm, gbps)], slow)
    results = []
    for model in meas["models"]:
        cfg = f"{ROOT}/{manifest['models'][model]['config']}"
        compiled = manifest["models"][model]["layouts"]
        runs = [(c, 0) for c in meas["comms"]]
        if gbps and "local" in meas["comms"]:
            runs.append(("local", gbps))
        for comm, g in runs:
            samples = meas["layouts"].get(f"{model}/{comm}/{g:g}", {})
            if g:  # no point-to-point link at pp = 1: the fault cannot act
                plain = meas["layouts"].get(f"{model}/{comm}/0", {})
                samples = {**{l["layout"]: plain[l["layout"]] for l in compiled
                              if l["pp"] == 1 and l["layout"] in plain}, **samples}
            rep = search_model(args, cfg, pfiles[(comm, g)], work)
            ranked = [r for r in rep["top"]]
            rows = [{"layout": r["layout"], "predicted_ms": r["step_ms"],
                     "measured_ms": min(samples[r["layout"]]),
                     "samples": len(samples[r["layout"]])}
                    for r in ranked if r["layout"] in samples]
            missing = [r["layout"] for r in ranked if r["layout"] not in samples]
            if missing:
                log(f"warning: {model} {comm} inject {g:g}: {len(missing)} of "
                    f"{len(ranked)} feasible layouts not measured ({', '.join(missing[:4])}...)")
            if not rows:
                log(f"warning: {model} {comm} inject {g:g}: nothing measured")
                continue
            res = {"model": model, "comm": comm, "inject_gbps": g, "rows": rows,
                   "feasible": len(ranked), **criteria(rows)}
            results.append(res)
            for r in rows:
                err = r["predicted_ms"] / r["measured_ms"] - 1
                print(f"  {model:6} {comm:5} {g:g} {r['layout']:34} predicted "
                      f"{r['predicted_ms']:8.2f} measured {r['measured_ms']:8.2f} ms "
                      f"({100 * err:+6.1f}%{'' if abs(err) <= 0.2 else ' >20%'})")
    # The slow pipeline links must change the choice (and keep it right).
    for r in results:
        if r["inject_gbps"]:
            plain = next((x for x in results if x["model"] == r["model"]
                          and x["comm"] == r["comm"] and not x["inject_gbps"]), None)
            r["choice_changed"] = plain is not None and plain["chosen"] != r["chosen"]
    write_json(os.path.join(d, f"results{tag}.json"), results)
    all_pass = write_tables(results, meas, tag, d)
    shutil.rmtree(work)
    print(f"\nissue 36 CPU criteria: {'PASS' if all_pass else 'FAIL'} "
          f"(calibration{tag or ' as before'}; tables: {d}/results{tag}.json, {d}/table{tag}.md)")
    return 0 if all_pass else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", nargs=2, metavar=("STAGE", "DIR"),
                    help="compile, measure or analyze, in DIR (default: all three)")
    ap.add_argument("--comm", default="local,mpi")
    ap.add_argument("--models", default="gpt-a,gpt-b,moe-a")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of each layout; the fastest counts")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="measure: start a round after the first only if it fits")
    ap.add_argument("--inject-gbps", type=float, default=0)
    ap.add_argument("--run-timeout-s", type=float, default=120,
                    help="measure: a run (all its copies) longer than this failed")
    ap.add_argument("--bin", default=f"{ROOT}/build/bin")
    ap.add_argument("--out", help="one-run mode: DIR (default: a temporary folder)")
    ap.add_argument("--measured", help="measure: the file to write (default "
                    "DIR/measured.json); analyze: the files to read, comma-separated")
    ap.add_argument("--resume", help="measure: a cut-off call's measured.json to go on from")
    ap.add_argument("--probe-every", type=int, default=12,
                    help="calibration probes before every Nth run")
    ap.add_argument("--max-layouts", type=int, default=0, help="smoke tests: the first N")
    ap.add_argument("--probe-load", action="store_true",
                    help="analyze: rates and kernel shape from runs of one copy a core at once")
    ap.add_argument("--shm-collectives", action="store_true",
                    help="analyze: price the local communicator's collectives as its "
                    "barriers (profile collectives=shared-memory), not a ring's steps")
    ap.add_argument("--rates-from", help="analyze: a profile from `mapp-run --calibrate "
                    "--backend cpu --threads 1` whose kernel rates (GEMMs by size, the "
                    "activation, streaming) shape the fitted profile (default: the one the measure stage took, if any)")
    ap.add_argument("--latency-from", choices=("dp8", "tp2"), default="dp8",
                    help="analyze: the probe the communicator's latency is fitted on "
                    "(dp8: one gradient all-reduce; tp2: 34 small all-reduces a step)")
    ap.add_argument("--fit-bandwidth", action="store_true",
                    help="analyze: the communicator's latency and bandwidth from two dp=8 probes")
    args = ap.parse_args()
    if args.stage:
        stage, d = args.stage
        if stage not in ("compile", "measure", "analyze"):
            sys.exit(f"run.py: --stage {stage}: expected compile, measure or analyze")
        stages = [stage]
    else:
        d = args.out or tempfile.mkdtemp(prefix="autopar-")
        stages = ["compile", "measure", "analyze"]
    d = os.path.abspath(d)
    if args.measured is None:
        args.measured = os.path.join(d, "measured.json")
    if "compile" in stages:
        os.makedirs(d, exist_ok=True)
    elif not os.path.exists(os.path.join(d, "manifest.json")):
        sys.exit(f"run.py: {d}/manifest.json: missing (run --stage compile {d} first)")
    rc = 0
    for s in stages:
        if s == "compile":
            stage_compile(args, d)
        elif s == "measure":
            stage_measure(args, d)
        else:
            rc = stage_analyze(args, d)
    return rc


if __name__ == "__main__":
    sys.exit(main())
