#!/usr/bin/env python3
"""Writes the traces of a tp2-pp2-dp2 job (8 ranks, one host) whose exposed
communication, critical path and per-class statistics have closed forms.

  exposed_trace.py DIR             the timeline below, every step alike
  ... --slow R                     rank R's compute ops take 1.5x
  ... --ramp                       compute ops of step s take (1 + 0.1 s)x
  ... --no-phase                   no "phase" fields (classes from names)

One step, in us from its start (ranks of a tp pair run alike; stage 0 is
ranks 0-3, stage 1 ranks 4-7, Megatron order):

  stage 0: data.load 0-50, fwd.a 50-250, tp all-reduce 250-280,
           send.fwd 280-300, recv.bwd 300-980, bwd.a 980-1180,
           tp all-reduce 1180-1210, bwd.b 1210-1410
  stage 1: recv.fwd 0-300, fwd.a 300-500, tp all-reduce 500-530,
           bwd.a 530-730, tp all-reduce 730-760, bwd.b 760-960,
           send.bwd 960-980
  both:    after bwd.a's all-reduce, the layer's gradient bucket is
           all-reduced over dp on stream "comm" (300 us; stage 0 1210-1510,
           stage 1 760-1060) beside bwd.b; the "optimizer" region then
           encloses the grad-norm all-reduce over the world (10 us after
           the last rank arrives: 1510-1520; stage 1 waits from 1060) and
           adamw 1520-1620, and ends at 1630, where the next step starts.

Eager sends take 20 us; a receive ends when its send does. Rank r's times
are r ns late (files with identical times are taken for copies).
"""
import argparse
import json
import os

TP, PP, DP = 2, 2, 2
WORLD = TP * PP * DP
STEPS = 3
US = 1000  # ns
DATA, FWD, BWD, ADAMW = 50, 200, 200, 100
TP_AR, DP_AR, NORM_AR, SEND = 30, 300, 10, 20
REGION_TAIL = 10
BASE_NS = 1_000_000_000


def rank_of(t, d, p):
    return t + TP * (d + DP * p)


class Rank:
    def __init__(self, r):
        self.r = r
        self.t = 0.0      # main stream cursor, us
        self.comm = 0.0   # "comm" stream cursor
        self.events = []
        self.seq = {}

    def add(self, **e):
        e["id"] = len(self.events)
        self.events.append(e)
        return e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--slow", type=int, default=-1)
    ap.add_argument("--ramp", action="store_true")
    ap.add_argument("--no-phase", action="store_true")
    a = ap.parse_args()
    ranks = [Rank(r) for r in range(WORLD)]

    def scale(r, step):
        f = 1.5 if r == a.slow else 1.0
        return f * (1 + 0.1 * step if a.ramp else 1.0)

    def ns(rk, us):  # + rank ns: no two files hold the same times
        return int(round(us * US)) + BASE_NS + rk.r

    def ev(rk, name, cat, b, e, step, phase=None, **kw):
        x = dict(name=name, cat=cat, b=ns(rk, b), e=ns(rk, e), step=step,
                 **kw)
        if phase and not a.no_phase:
            x["phase"] = phase
        return rk.add(**x)

    def compute(r, name, us, step, phase=None, cat="compute"):
        rk = ranks[r]
        d = us * scale(r, step)
        ev(rk, name, cat, rk.t, rk.t + d, step, phase)
        rk.t += d

    def collective(members, kind, name, step, dur, stream=None, phase=None):
        begin = {r: (ranks[r].comm if stream else ranks[r].t) for r in members}
        end = max(begin.values()) + dur
        for r in members:
            rk = ranks[r]
            key = (kind, tuple(members))
            seq = rk.seq.get(key, 0)
            rk.seq[key] = seq + 1
            extra = {"stream": stream} if stream else {}
            ev(rk, name, "comm", begin[r], end, step, phase, op="all_reduce",
               bytes=4096, group_kind=kind, members=sorted(members), seq=seq,
               **extra)
            if stream:
                rk.comm = end
            else:
                rk.t = end
        return end

    inbox = {}

    def send(src, dst, name, step, tag, phase):
        rk = ranks[src]
        ev(rk, name, "comm", rk.t, rk.t + SEND, step, phase, op="send",
           bytes=65536, peer=dst, tag=tag)
        rk.t += SEND
        inbox[(dst, tag)] = rk.t

    def recv(dst, src, name, step, tag, phase):
        rk = ranks[dst]
        b = rk.t
        rk.t = max(rk.t, inbox[(dst, tag)])
        ev(rk, name, "comm", b, rk.t, step, phase, op="recv", bytes=65536,
           peer=src, tag=tag)

    tp_groups = [[rank_of(t, d, p) for t in range(TP)]
                 for p in range(PP) for d in range(DP)]
    dp_groups = [[rank_of(t, d, p) for d in range(DP)]
                 for p in range(PP) for t in range(TP)]

    def tp_allreduce(p, name, step, phase):
        for g in tp_groups:
            if ranks[g[0]].r // (TP * DP) == p:
                collective(g, "tp", name, step, TP_AR, phase=phase)

    def stage(p):
        return [r for r in range(WORLD) if r // (TP * DP) == p]

    for step in range(STEPS):
        # Forward: stage 0 computes and sends, stage 1 receives.
        for r in stage(0):
            compute(r, "data.load", DATA, step, cat="data")
            compute(r, "fwd.a", FWD, step, "fwd")
        tp_allreduce(0, "fwd.allreduce", step, "fwd")
        for r in stage(0):
            send(r, r + TP * DP, "send.fwd", step, 100 + step, "fwd")
        for r in stage(1):
            recv(r, r - TP * DP, "recv.fwd", step, 100 + step, "fwd")
            compute(r, "fwd.a", FWD, step, "fwd")
        tp_allreduce(1, "fwd.allreduce", step, "fwd")

        def backward(p, then):
            for r in stage(p):
                compute(r, "bwd.a", BWD, step, "bwd")
            tp_allreduce(p, "bwd.allreduce", step, "bwd")
            for r in stage(p):  # the bucket waits for its gradients
                ranks[r].comm = max(ranks[r].comm, ranks[r].t)
            for g in dp_groups:
                if g[0] // (TP * DP) == p:
                    collective(g, "dp", "grad.allreduce", step, DP_AR,
                               stream="comm")
            for r in stage(p):
                compute(r, "bwd.b", BWD, step, "bwd")
            then()

        backward(1, lambda: [send(r, r - TP * DP, "send.bwd", step,
                                  200 + step, "bwd") for r in stage(1)])
        for r in stage(0):
            recv(r, r + TP * DP, "recv.bwd", step, 200 + step, "bwd")
        backward(0, lambda: None)

        # The update waits for the buckets; its region encloses the
        # grad-norm all-reduce and adamw.
        regions = {}
        for rk in ranks:
            rk.t = max(rk.t, rk.comm)
            regions[rk.r] = ev(rk, "optimizer", "optimizer", rk.t, rk.t, step)
        collective(list(range(WORLD)), "world", "grad-norm.allreduce", step,
                   NORM_AR)
        for rk in ranks:
            compute(rk.r, "adamw", ADAMW, step, cat="optimizer")
            rk.t += REGION_TAIL
            regions[rk.r]["e"] = ns(rk, rk.t)

    os.makedirs(a.dir, exist_ok=True)
    for rk in ranks:
        t, d, p = rk.r % TP, (rk.r // TP) % DP, rk.r // (TP * DP)
        hdr = {"type": "header", "format": "mapp-trace", "version": 1,
               "rank": rk.r, "world": WORLD, "dp": d, "pp": p, "tp": t,
               "dp_size": DP, "pp_size": PP, "tp_size": TP, "host": "h0",
               "device": "cpu", "pid": 100 + rk.r, "clock": "steady",
               "mono_start_ns": BASE_NS,
               "wall_start_ns": 1_700_000_000_000_000_000}
        with open(os.path.join(a.dir, f"rank-{rk.r}.trace.jsonl"), "w") as f:
            f.write(json.dumps(hdr) + "\n")
            for e in rk.events:
                f.write(json.dumps(e) + "\n")
            f.write(json.dumps({"type": "footer", "events": len(rk.events),
                                "dropped": 0,
                                "mono_end_ns": int(rk.t * US) + BASE_NS + 8})
                    + "\n")


if __name__ == "__main__":
    main()
