"""bench/autopar's measurement files and issue 36's criteria (run.py's
analyze stage): the host's kernel calibration, merging the files of a
measurement split over calls, and judging one table of predicted against
measured step times."""
import json
import os
import statistics
import subprocess
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def calibrate_kernels(mapp_run, work, copies):
    """The host's kernel rates on one core (`mapp-run --calibrate --backend
    cpu --threads 1`: GEMMs by size, the activation function, streaming),
    alone, then as `copies` copies at once (as many cores busy as the
    bench's ranks keep): (alone, loaded), None where a run failed; the
    loaded profile holds each rate's median over the copies."""
    def start(tag):
        out = os.path.join(work, f"calibrate{tag}.json")
        cmd = [mapp_run, "--calibrate", "--backend", "cpu", "--threads", "1",
               "--calibrate-seconds", "10", "--quiet", "-o", out]
        return out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def finish(out, proc):
        err = proc.communicate()[1]
        if proc.returncode != 0:
            log(f"mapp-run --calibrate failed ({proc.returncode}): {err[-500:]}")
            return None
        return json.load(open(out))

    alone = finish(*start(""))
    loaded = [finish(*run) for run in [start(f"-loaded{i}") for i in range(copies)]]
    if not alone or not all(loaded):
        return alone, None
    dims = [[d for d, _ in p["gemm_rates"]["f32"]] for p in loaded]
    if any(d != dims[0] for d in dims):
        log("mapp-run --calibrate: the loaded copies measured different GEMM classes")
        return alone, None
    med = lambda get: statistics.median(get(p) for p in loaded)  # noqa: E731
    prof = json.loads(json.dumps(loaded[0]))
    prof["gemm_tflops"]["f32"] = med(lambda p: p["gemm_tflops"]["f32"])
    prof["mem_gbps"] = med(lambda p: p["mem_gbps"])
    if all(p.get("activation_gelems") for p in loaded):
        prof["activation_gelems"] = med(lambda p: p["activation_gelems"])
    prof["gemm_rates"]["f32"] = [[d, med(lambda p: p["gemm_rates"]["f32"][i][1])]
                                 for i, d in enumerate(dims[0])]
    return alone, prof


def load_measured(files):
    """Merges measurement files (a call split by --models): the samples of
    each layout and probe concatenated."""
    merged = None
    for f in files:
        m = json.load(open(f))
        if not m.get("complete"):
            log(f"warning: {f} is incomplete (the call was cut off): "
                "layouts it did not reach are missing")
        if merged is None:
            merged = m
            continue
        if m["host"]["cpus"] != merged["host"]["cpus"]:
            sys.exit(f"run.py: {f} was measured on {m['host']['cpus']} CPUs, "
                     f"the others on {merged['host']['cpus']}")
        for k, v in m["probes"].items():
            merged["probes"].setdefault(k, []).extend(v)
        for k, lays in m["layouts"].items():
            for lay, v in lays.items():
                merged["layouts"].setdefault(k, {}).setdefault(lay, []).extend(v)
        merged["inject_gbps"] = merged["inject_gbps"] or m["inject_gbps"]
        merged["comms"] = sorted(set(merged["comms"]) | set(m["comms"]))
        merged["models"] += [x for x in m["models"] if x not in merged["models"]]
        merged["complete"] = merged.get("complete") and m.get("complete")
        for k in ("calibrate_profile", "calibrate_profile_loaded"):
            merged[k] = merged.get(k) or m.get(k)
    return merged


def criteria(rows):
    """Issue 36's CPU line for one table: the search's first layout within
    10% of the best measured, predictions within 20% of measured for at
    least 90% of layouts."""
    chosen = rows[0]
    best = min(rows, key=lambda r: r["measured_ms"])
    within = sum(1 for r in rows
                 if abs(r["predicted_ms"] - r["measured_ms"]) <= 0.2 * r["measured_ms"])
    over = chosen["measured_ms"] / best["measured_ms"] - 1
    return {"chosen": chosen["layout"], "chosen_ms": chosen["measured_ms"],
            "best": best["layout"], "best_ms": best["measured_ms"],
            "chosen_over_best": over, "within_20pct": within, "layouts": len(rows),
            "choice_pass": over <= 0.10, "prediction_pass": within >= 0.9 * len(rows)}


def write_tables(results, meas, tag, d):
    """Prints the criteria table of analyze's results and writes it as
    markdown to D/table<tag>.md; True when every row passes."""
    print(f"\n{'model':7} {'comm':5} {'inject':>7} {'layouts':>7} {'chosen (search #1)':34} "
          f"{'ms':>8} {'best measured':34} {'ms':>8} {'chosen/best':>11} "
          f"{'pred within 20%':>15}  verdict")
    md = ["| model | comm | inject | chosen (search #1) | its ms | best measured | its ms "
          "| chosen / best | predicted within 20% | verdict |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    all_pass = bool(results)
    for r in results:
        inj = f"{r['inject_gbps']:g}G" if r["inject_gbps"] else "-"
        verdict = [("PASS" if r["choice_pass"] else "FAIL") + " choice<=10%",
                   ("PASS" if r["prediction_pass"] else "FAIL") + " 90%<=20%"]
        if "choice_changed" in r:
            verdict.append(("PASS" if r["choice_changed"] else "FAIL") + " choice changes")
        ok = r["choice_pass"] and r["prediction_pass"] and r.get("choice_changed", True)
        all_pass &= ok
        counted = f"{r['within_20pct']}/{r['layouts']}"
        if r["layouts"] != r["feasible"]:
            counted += f" (of {r['feasible']})"
            all_pass = False
        print(f"{r['model']:7} {r['comm']:5} {inj:>7} {r['layouts']:>7} {r['chosen']:34} "
              f"{r['chosen_ms']:8.2f} {r['best']:34} {r['best_ms']:8.2f} "
              f"{100 * r['chosen_over_best']:+10.1f}% {counted:>15}  {', '.join(verdict)}")
        md.append(f"| {r['model']} | {r['comm']} | {inj} | {r['chosen']} | {r['chosen_ms']:.2f} "
                  f"| {r['best']} | {r['best_ms']:.2f} | {100 * r['chosen_over_best']:+.1f}% "
                  f"| {counted} | {', '.join(verdict)} |")
    host = meas["host"]
    md.insert(0, f"Measured on {host['node']} ({host['cpus']} CPUs, {host['cpu']}), "
                 f"{meas['steps']} steps a run, {meas['rounds']} round(s), calibration "
                 f"{tag[1:] or 'as before'}, commit "
                 f"{meas['commit']}{'' if meas.get('complete') else ' (INCOMPLETE)'}.\n")
    open(os.path.join(d, f"table{tag}.md"), "w").write("\n".join(md) + "\n")
    return all_pass
