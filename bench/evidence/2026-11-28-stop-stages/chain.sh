#!/usr/bin/env bash
# h-stop2: instrumented before run, build of the fix, after run, in one lock hold
# (fewer steps when the lock comes late: the deadline is 11:30 UTC).
set -u
cd /work/wt/h-stop2
E=bench/evidence/2026-11-28-stop-stages
mkdir -p $E/before $E/after
run() { # label warden
  bench/tools/sample_blockers.sh /tmp/h-stop2-blockers-$1.txt & local s=$!
  { date -u; uptime; } > $E/$1/host.txt
  /tmp/h-stop2-bench --warden $2 --only replicas > $E/$1/bench.md 2> /tmp/h-stop2-$1.err
  { date -u; uptime; } >> $E/$1/host.txt
  kill $s
}
now=$(date -u +%H%M)
echo "lock taken $(date -u)"
if [ "$now" -le 1111 ] || [ "$now" -gt 1118 ]; then
  echo "before start $(date -u)"
  run before /tmp/h-stop2-warden-before
fi
if [ "$now" -le 1118 ]; then
  echo "build start $(date -u)"
  touch src/store/leases.rs src/store/group_commit.rs
  cargo build --release --locked --workspace > /tmp/h-stop2-build.log 2>&1 || { echo build failed; exit 1; }
  cp target/release/warden /tmp/h-stop2-warden-after
  echo "after start $(date -u)"
  run after /tmp/h-stop2-warden-after
fi
echo "done $(date -u)"
if [ "$(date -u +%H%M)" -le 1124 ]; then
  mkdir -p $E/before-traced
  echo "before (traced) start $(date -u)"
  run before-traced /tmp/h-stop2-warden-before
  echo "before (traced) done $(date -u)"
fi
