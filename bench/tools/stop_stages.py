#!/usr/bin/env python3
"""Joins the STOPTRACE lines of an instrumented warden (stderr of a
`warden-bench --only replicas` run) into one row per cross-replica stop,
and prints each stage's time since the stop was received (p50/p90/p99/max)
and the share of the slowest stops each step between stages took."""
import collections, re, sys

LINE = re.compile(r"STOPTRACE (\S+) (\S+) (\d+)")
stops = collections.defaultdict(dict)
for raw in open(sys.argv[1], errors="replace"):
    m = LINE.search(raw)
    if m:
        sid, stage, t = m.group(1), m.group(2), int(m.group(3))
        stops[sid].setdefault(stage, t)

cross = {s: st for s, st in stops.items() if "a3_notified" in st and "a0_received" in st}
print(f"{len(cross)} cross-replica stops traced")

def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

order = ["a0_received", "a1_locked", "a2_flag_committed", "a3_notified", "o1_heard_stop_owner",
         "o2_commit_returned", "o2b_ckpt_snapshot_done", "o3_runner_saw_stop", "o4_finish_snapshot_start",
         "o5_finish_snapshot_done", "o5b_finish_began", "o5c_finish_row_locked", "o6_end_committed",
         "o7_deregistered", "o8_ended_sent", "a4_heard_ended", "a5_woke_ended", "a5_woke_backstop",
         "a6_row_ended", "a7_waited", "a8_stored_read"]
print(f"{'stage':28} {'n':>4} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}  (ms since a0)")
for stage in order:
    xs = [(st[stage] - st["a0_received"]) / 1000 for st in cross.values() if stage in st]
    if xs:
        print(f"{stage:28} {len(xs):4} {q(xs,.5):8.1f} {q(xs,.9):8.1f} {q(xs,.99):8.1f} {max(xs):8.1f}")
# Steps between consecutive stages present, for the slowest 10 % by total.
total = sorted(cross.items(), key=lambda kv: kv[1].get("a8_stored_read", 0) - kv[1]["a0_received"])
slow = total[-max(1, len(total) // 10):]
print("\nslowest stops, step by step (ms):")
for sid, st in slow[-10:]:
    present = [s for s in order if s in st]
    present.sort(key=lambda s: st[s])
    steps = [f"{b}+{(st[b]-st[a])/1000:.0f}" for a, b in zip(present, present[1:])]
    print(sid[:8], " ".join(steps))
print("\nstep totals over all stops (ms, p50 / p99 / max), consecutive stages in time order:")
steps = collections.defaultdict(list)
for st in cross.values():
    present = sorted((s for s in order if s in st), key=lambda s: st[s])
    for a, b in zip(present, present[1:]):
        steps[f"{a} -> {b}"].append((st[b] - st[a]) / 1000)
for k, xs in sorted(steps.items(), key=lambda kv: -q(kv[1], .99)):
    print(f"{k:60} n={len(xs):4} {q(xs,.5):8.1f} {q(xs,.99):8.1f} {max(xs):8.1f}")
