#!/usr/bin/env python3
"""Writes the traces of a pp4-dp2 GPipe job (8 ranks, one host) with eager
sends: every send returns after 20 us, and every message has arrived before
its receiver asks for it (the receiver is busy until then), so each recv
lasts 2 us too. Link 5 -> 7 takes 5 ms per message; the others 20 us. Only
the recvs' `sent`/`arrived` fields show it (docs/trace-format.md).

  eager_trace.py DIR               with sent/arrived on every recv
  eager_trace.py DIR --no-arrived  without them (an older trace)
  eager_trace.py DIR --polled      as MPI writes them: receivers wait in
      their recv, and a poll notices a payload between `pending` (the last
      poll that missed it) and `arrived`; link 0 -> 2's receiver is
      descheduled for 3 ms after its last miss, every time (clean link,
      late receiver: only its upper bound looks slow).
  eager_trace.py DIR --polled --pp 2 --forward-us F [--slow-us S]
      a pp2-dp2 job (two links each way) whose forward links all take F us
      and backward ones 20 us (a direction-wide difference of the
      schedule); with --slow-us, link 0 -> 2 takes S us instead.
  eager_trace.py DIR --busy [--slow-us S]
      the 8 ranks ran on 2 CPUs (headers' `cpus`, ops' CPU time): a host
      with more rank threads than cores; link 5 -> 7 takes S us.
"""
import argparse
import json
import os

PP, DP = 4, 2
WORLD = PP * DP
STEPS, MICROBATCHES = 4, 4
FWD_NS, BWD_NS, SEND_NS, RECV_NS = 200_000, 400_000, 20_000, 2_000
LINK_NS, SLOW_LINK_NS = 20_000, 5_000_000
SLOW_LINK = (5, 7)
POLL_NS, LATE_NS, LATE_LINK = 50_000, 3_000_000, (0, 2)


def main():
    global PP, WORLD, SLOW_LINK, SLOW_LINK_NS
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--no-arrived", action="store_true")
    ap.add_argument("--polled", action="store_true")
    ap.add_argument("--pp", type=int, default=PP)
    ap.add_argument("--forward-us", type=int, default=0)
    ap.add_argument("--slow-us", type=int, default=0)
    ap.add_argument("--busy", action="store_true")
    a = ap.parse_args()
    PP = a.pp
    WORLD = PP * DP
    if PP == 2:  # links 0 -> 2, 1 -> 3 forward; 2 -> 0, 3 -> 1 backward
        SLOW_LINK = (0, 2) if a.slow_us else None
    if a.slow_us:
        SLOW_LINK_NS = a.slow_us * 1000
    t = [1_000_000_000] * WORLD
    events = [[] for _ in range(WORLD)]

    def add(r, **e):
        e["id"] = len(events[r])
        events[r].append(e)

    def op(r, name, ns, step, mb):
        t[r] += 1_000
        cpu = {"cpu": ns} if a.busy else {}
        add(r, name=name, cat="compute", b=t[r], e=t[r] + ns, step=step, mb=mb,
            **cpu)
        t[r] += ns

    def send(src, dst, name, step, mb, tag, inbox):
        t[src] += 1_000
        add(src, name=name, cat="comm", op="send", b=t[src],
            e=t[src] + SEND_NS, step=step, mb=mb, bytes=65536, peer=dst,
            tag=tag)
        wire = SLOW_LINK_NS if (src, dst) == SLOW_LINK else LINK_NS
        if a.forward_us and dst > src and (src, dst) != SLOW_LINK:
            wire = a.forward_us * 1000
        inbox[(dst, tag)] = (t[src], t[src] + wire)
        t[src] += SEND_NS

    def recv(dst, src, name, step, mb, tag, inbox):
        sent, arrived = inbox[(dst, tag)]
        if a.polled:
            b = t[dst] + 1_000
            if arrived > b:  # waits, polling
                late = LATE_NS if (src, dst) == LATE_LINK else POLL_NS // 2
                pending = max(b, arrived - POLL_NS // 2)
                noticed = arrived + late
            else:  # the first poll finds it
                pending, noticed = 0, b
            add(dst, name=name, cat="comm", op="recv", b=b,
                e=noticed + RECV_NS, step=step, mb=mb, bytes=65536,
                peer=src, tag=tag, sent=sent, arrived=noticed,
                pending=pending)
            t[dst] = noticed + RECV_NS
            return
        # Busy elsewhere until the bytes are in: the recv never waits.
        t[dst] = max(t[dst], arrived) + 10_000
        e = dict(name=name, cat="comm", op="recv", b=t[dst],
                 e=t[dst] + RECV_NS, step=step, mb=mb, bytes=65536, peer=src,
                 tag=tag)
        if not a.no_arrived:
            e.update(sent=sent, arrived=arrived)
        add(dst, **e)
        t[dst] += RECV_NS

    for step in range(STEPS):
        inbox = {}
        for d in range(DP):
            for p in range(PP):
                r = d + DP * p
                for mb in range(MICROBATCHES):
                    if p > 0:
                        recv(r, r - DP, "recv.act", step, mb, 100 * p + mb,
                             inbox)
                    op(r, f"fwd.stage{p}", FWD_NS, step, mb)
                    if p < PP - 1:
                        send(r, r + DP, "send.act", step, mb,
                             100 * (p + 1) + mb, inbox)
            for p in reversed(range(PP)):
                r = d + DP * p
                for mb in range(MICROBATCHES):
                    if p < PP - 1:
                        recv(r, r + DP, "recv.grad", step, mb,
                             1000 + 100 * p + mb, inbox)
                    op(r, f"bwd.stage{p}", BWD_NS, step, mb)
                    if p > 0:
                        send(r, r - DP, "send.grad", step, mb,
                             1000 + 100 * (p - 1) + mb, inbox)
        end = max(t) + 1_000
        t = [end] * WORLD

    os.makedirs(a.dir, exist_ok=True)
    for r in range(WORLD):
        hdr = {"type": "header", "format": "mapp-trace", "version": 1,
               "rank": r, "world": WORLD, "dp": r % DP, "pp": r // DP,
               "tp": 0, "dp_size": DP, "pp_size": PP, "tp_size": 1,
               "host": "h0", "device": "cpu", "pid": 100 + r,
               "clock": "steady", "mono_start_ns": 1_000_000_000,
               "wall_start_ns": 1_700_000_000_000_000_000}
        if a.busy:
            hdr["cpus"] = "0-1"
        with open(os.path.join(a.dir, f"rank-{r}.trace.jsonl"), "w") as f:
            f.write(json.dumps(hdr) + "\n")
            for e in events[r]:
                f.write(json.dumps(e) + "\n")
            f.write(json.dumps({"type": "footer", "events": len(events[r]),
                                "dropped": 0, "mono_end_ns": t[r]}) + "\n")


if __name__ == "__main__":
    main()
