"""Where two runs of one plan part: MegaScope probe stores compared point by
point, in execution order (a bisect of a numerics departure, e.g. the CUDA
backend against the CPU's from the same weights and batch).

  python3 -m mapp.probe_diff A.sqlite B.sqlite [--step K] [--threshold T]
                             [--all]

Each store holds one run of the same probed plan (`--mapp-insert-probes`
with scalar reductions: mean, std, absmax, max, min, sparsity). Per probe
point, the largest relative difference of its scalars over the step's
microbatches: |a - b| / |b|, a mean relative to b's std where the point
records one (a mean near zero says nothing relative to itself). Points are
listed in the order the run recorded them (forward, then backward), the
first above the threshold marked: where the runs part. B is the reference.
Exit status 0 when no point departs, 1 when one does, 2 on bad input.
"""
import argparse
import sqlite3
import sys

SCALARS = ("mean", "std", "absmax", "max", "min", "sparsity")


class BadStore(Exception):
    pass


def load(path, step):
    """{point: {(microbatch, reduction): value}} in execution order (dicts
    keep insertion order), for `step` of the store's one run."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        runs = db.execute("select count(*) from runs").fetchone()[0]
        rows = db.execute(
            "select p.point, s.microbatch, s.reduction, s.value "
            "from samples s join probes p on p.probe_id = s.probe_id "
            "and p.run_id = s.run_id and p.rank = s.rank "
            "where s.step = ? and s.rank = 0 order by s.rowid", (step,)).fetchall()
    except sqlite3.Error as e:
        raise BadStore(f"{path}: not a MegaScope probe store ({e})")
    if runs != 1:
        raise BadStore(f"{path}: holds {runs} runs; compare stores of one run each")
    points = {}
    for point, mb, red, value in rows:
        if red in SCALARS and value is not None:
            points.setdefault(point, {})[(mb, red)] = value
    if not points:
        raise BadStore(f"{path}: no scalar probe samples at step {step}")
    return points


def compare(a, b):
    """[(point, worst relative difference, its reduction)] in b's order."""
    keys = lambda s: {(p, mb, red) for p, v in s.items() for mb, red in v}  # noqa: E731
    missing = sorted(keys(a) ^ keys(b))
    if missing:
        point, mb, red = missing[0]
        raise BadStore(f"the stores record different samples ({len(missing)}, e.g. "
                       f"{red} of '{point}' microbatch {mb}): not one plan's runs")
    out = []
    for point, ref in b.items():
        worst, which = 0.0, ""
        for (mb, red), r in ref.items():
            # A mean near zero says nothing relative to itself: its std.
            scale = abs(ref[(mb, "std")]) if red == "mean" and (mb, "std") in ref else abs(r)
            rel = abs(a[point][(mb, red)] - r) / max(scale, 1e-30)
            if rel >= worst:
                worst, which = rel, red
        out.append((point, worst, which))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m mapp.probe_diff",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b", help="the reference run's store")
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=1e-4)
    ap.add_argument("--all", action="store_true", help="every point, not only the departing")
    args = ap.parse_args(argv)
    if not args.threshold > 0:
        print("probe_diff: --threshold must be positive", file=sys.stderr)
        return 2
    try:
        rows = compare(load(args.a, args.step), load(args.b, args.step))
    except BadStore as e:
        print(f"probe_diff: {e}", file=sys.stderr)
        return 2
    first = next((p for p, rel, _ in rows if rel > args.threshold), None)
    for point, rel, red in rows:
        if args.all or rel > args.threshold:
            print(f"{rel:.3e}  {red:8s} {point}{'  <- first' if point == first else ''}")
    worst = max(rows, key=lambda r: r[1])
    print(f"{len(rows)} points at step {args.step}; worst {worst[1]:.3e} ({worst[2]} of "
          f"'{worst[0]}'); " + (f"first above {args.threshold:g}: '{first}'" if first
                                 else f"none above {args.threshold:g}"))
    return 1 if first else 0


if __name__ == "__main__":
    sys.exit(main())
