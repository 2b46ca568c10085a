#!/usr/bin/env python3
"""Writes the traces of a pp4-dp2 GPipe job (8 ranks, one host) in which
either the ranks at both ends of a slow link run their ops slower between
waits (victims) or one rank's device is slow (a culprit).

  victim_trace.py DIR --victims      link 5 -> 7 takes 5 ms per message, and
                                     ranks 5 and 7 run every op 1.5x slower
                                     except those right after a collective
  victim_trace.py DIR --culprit R    rank R runs every op 1.5x slower
  ... --factor F                     (F x slower instead)
  ... --culprit-sends                and its sends take 1.5x longer too
  (both at once: rank R is a culprit and, if 5 or 7, a victim too)
  ... --cpu                          compute ops carry their thread CPU time
  ... --processes                    one process a rank (MPI); else the
                                     ranks are threads of one process
  victim_trace.py DIR --cpu --descheduled R
                                     rank R's op spans are FACTOR longer
                                     (its thread shared a core) but its CPU
                                     times are its peers'

The victim pattern is what a bandwidth-capped link did to its two ends on
an oversubscribed host (docs/benchmarks.md, "MegaScan scenarios"): their
bursts of ops between 21 ms waits ran 1.2-1.8x slower than their DP twins'
back-to-back ops, while the optimizer ops that run in lockstep with the
twin, right after the gradient all-reduce, ran at the same speed.
Op durations carry +-3% deterministic jitter (seeded).
"""
import argparse
import json
import os
import random

TP, PP, DP = 1, 4, 2
WORLD = TP * PP * DP
STEPS, MICROBATCHES = 4, 4
FWD_NS, BWD_NS, ADAMW_NS = 200_000, 400_000, 150_000
LINK_NS, SLOW_LINK_NS = 20_000, 5_000_000
COLL_NS, GAP_NS = 30_000, 1_000
FACTOR = 1.5


def rank_of(d, p):
    return d + DP * p


class Rank:
    def __init__(self, r):
        self.r, self.t, self.events = r, 1_000_000_000, []

    def add(self, **e):
        e["id"] = len(self.events)
        self.events.append(e)
        return e


def main():
    global PP, DP, WORLD
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--victims", action="store_true")
    ap.add_argument("--culprit", type=int)
    ap.add_argument("--factor", type=float, default=FACTOR,
                    help="the culprit's slowdown")
    ap.add_argument("--culprit-sends", action="store_true",
                    help="the culprit's sends take FACTOR longer too")
    ap.add_argument("--cpu", action="store_true",
                    help="compute ops carry 'cpu' (thread CPU time)")
    ap.add_argument("--processes", action="store_true",
                    help="a pid per rank (MPI), not one (rank threads)")
    ap.add_argument("--descheduled", type=int,
                    help="this rank's spans are FACTOR longer, not its CPU")
    ap.add_argument("--pp", type=int, default=PP,
                    help="pipeline stages (2: a 4-rank world, where the "
                    "culprit and its DP twin are half the ranks)")
    ap.add_argument("--dp", type=int, default=DP, help="data-parallel ranks")
    ap.add_argument("--same-layers", action="store_true",
                    help="every stage runs ops of one name (equal layers), so "
                    "ranks of different stages are each other's peers")
    a = ap.parse_args()
    if not a.victims and a.culprit is None and a.descheduled is None:
        ap.error("give --victims, --culprit R, --descheduled R or both")
    rng = random.Random(7)
    PP, DP = a.pp, a.dp
    WORLD = TP * PP * DP
    stage = (lambda p: "layers") if a.same_layers else (lambda p: f"stage{p}")
    ranks = [Rank(r) for r in range(WORLD)]
    slow_link = (rank_of(1, 2), rank_of(1, 3)) if a.victims else None
    victims = set(slow_link) if a.victims else set()

    def op(rk, name, base, step, mb, cat="compute", lockstep=False):
        f = 1 + rng.uniform(-0.03, 0.03)
        if rk.r == a.culprit:
            f *= a.factor
        elif rk.r in victims and not lockstep:
            f *= FACTOR
        span = base * f * (FACTOR if rk.r == a.descheduled else 1)
        rk.t += GAP_NS
        e = rk.add(name=name, cat=cat, b=rk.t, e=rk.t + int(span), step=step,
                   mb=mb)
        if a.cpu:
            e["cpu"] = int(base * f)
        rk.t += int(span)

    def send(src, dst, name, step, mb, tag, inbox):
        rk = ranks[src]
        rk.t += GAP_NS
        x = SLOW_LINK_NS if (src, dst) == slow_link else LINK_NS
        if a.culprit_sends and src == a.culprit:
            x = int(x * FACTOR)  # its own copy into the link is slow too
        rk.add(name=name, cat="comm", op="send", b=rk.t, e=rk.t + x,
               step=step, mb=mb, bytes=65536, peer=dst, tag=tag)
        rk.t += x
        inbox[(dst, tag)] = rk.t

    def recv(dst, src, name, step, mb, tag, inbox):
        rk = ranks[dst]
        rk.t += GAP_NS
        b = rk.t
        rk.t = max(rk.t, inbox[(dst, tag)]) + 2_000
        rk.add(name=name, cat="comm", op="recv", b=b, e=rk.t, step=step,
               mb=mb, bytes=65536, peer=src, tag=tag)

    def collective(members, kind, name, step, seq):
        begin = {r: ranks[r].t + GAP_NS for r in members}
        end = max(begin.values()) + COLL_NS
        for r in members:
            ranks[r].add(name=name, cat="comm", op="all_reduce", b=begin[r],
                         e=end, step=step, bytes=4096, group_kind=kind,
                         members=sorted(members), seq=seq)
            ranks[r].t = end

    for step in range(STEPS):
        inbox = {}
        for d in range(DP):
            # GPipe: all forwards stage by stage, then all backwards.
            for p in range(PP):
                r = rank_of(d, p)
                for mb in range(MICROBATCHES):
                    if p > 0:
                        recv(r, rank_of(d, p - 1), "recv.act", step, mb,
                             100 * p + mb, inbox)
                    op(ranks[r], f"fwd.{stage(p)}", FWD_NS, step, mb)
                    if p < PP - 1:
                        send(r, rank_of(d, p + 1), "send.act", step, mb,
                             100 * (p + 1) + mb, inbox)
            for p in reversed(range(PP)):
                r = rank_of(d, p)
                for mb in range(MICROBATCHES):
                    if p < PP - 1:
                        recv(r, rank_of(d, p + 1), "recv.grad", step, mb,
                             1000 + 100 * p + mb, inbox)
                    op(ranks[r], f"bwd.{stage(p)}", BWD_NS, step, mb)
                    if p > 0:
                        send(r, rank_of(d, p - 1), "send.grad", step, mb,
                             1000 + 100 * (p - 1) + mb, inbox)
        for p in range(PP):
            collective([rank_of(d, p) for d in range(DP)], "dp",
                       f"all_reduce.grad.stage{p}", step, step)
        collective(list(range(WORLD)), "world", "step.metrics", step, step)
        for rk in ranks:
            # The optimizer region encloses the adamw op (a container).
            p = rk.r // DP
            region = rk.add(name="optimizer", cat="optimizer", b=rk.t, e=0,
                            step=step)
            op(rk, f"adamw.{stage(p)}", ADAMW_NS, step, -1, cat="optimizer",
               lockstep=True)
            rk.t += 500
            region["e"] = rk.t

    os.makedirs(a.dir, exist_ok=True)
    for rk in ranks:
        p, d = rk.r // DP, rk.r % DP
        hdr = {"type": "header", "format": "mapp-trace", "version": 1,
               "rank": rk.r, "world": WORLD, "dp": d, "pp": p, "tp": 0,
               "dp_size": DP, "pp_size": PP, "tp_size": TP, "host": "h0",
               "device": "cpu",
               "pid": 100 + rk.r if a.processes else 100, "clock": "steady",
               "mono_start_ns": 1_000_000_000,
               "wall_start_ns": 1_700_000_000_000_000_000}
        with open(os.path.join(a.dir, f"rank-{rk.r}.trace.jsonl"), "w") as f:
            f.write(json.dumps(hdr) + "\n")
            for e in rk.events:
                if e.get("mb", 0) < 0:
                    del e["mb"]
                f.write(json.dumps(e) + "\n")
            f.write(json.dumps({"type": "footer", "events": len(rk.events),
                                "dropped": 0, "mono_end_ns": rk.t}) + "\n")


if __name__ == "__main__":
    main()
