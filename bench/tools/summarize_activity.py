#!/usr/bin/env python3
"""Summarizes what sample_activity.sh collected: the busiest (wait, query)
pairs of pg_stat_activity per database of the phase, and from each warden's
last /metrics the iteration's wait for durable writes and the stop latency.
usage: summarize_activity.py DIR"""
import collections
import glob
import re
import sys

d = sys.argv[1]
by_db = collections.defaultdict(collections.Counter)
samples = collections.defaultdict(set)
for line in open(f"{d}/activity.txt", errors="replace"):
    parts = line.rstrip("\n").split("|", 5)
    if len(parts) < 6:
        continue
    ts, db, state, wtype, wevent, query = parts
    db = db.rsplit("_", 1)[-1]
    samples[db].add(ts)
    by_db[db][(state, f"{wtype}/{wevent}", query[:70])] += 1
for db, counts in sorted(by_db.items()):
    n = len(samples[db])
    print(f"== {db}: {n} samples, mean non-idle backends {sum(counts.values()) / max(n, 1):.1f}")
    for (state, wait, query), c in counts.most_common(12):
        print(f"  {c / max(n, 1):5.2f}  {state:20} {wait:28} {query}")


def hist(text, name):
    buckets = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        buckets.append((le, float(m.group(2))))
    return buckets


def q(buckets, p):
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= p * total:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (p * total - prev_c) / max(c - prev_c, 1e-9)
        prev_le, prev_c = le, c
    return None


for f in sorted(glob.glob(f"{d}/metrics-*.txt")):
    text = open(f).read()
    out = []
    for name in ["warden_iteration_writes_seconds", "warden_stop_latency_seconds"]:
        b = hist(text, name)
        if b and b[-1][1]:
            p50, p99 = q(b, 0.5), q(b, 0.99)
            out.append(f"{name}: n={b[-1][1]:.0f} p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms")
    if out:
        print(f.rsplit("/", 1)[-1], "(last scrape", text.strip().splitlines()[-1] + ")")
        for o in out:
            print("  ", o)
