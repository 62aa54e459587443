#!/usr/bin/env bash
# Samples pg_stat_activity of the benchmark's databases every 100 ms, and
# every 2 s each running warden's /metrics, while a warden-bench phase runs.
# usage: sample_activity.sh OUT_DIR  (runs until killed)
set -u
out=${1:?out dir}
mkdir -p "$out"
psql_() { psql -h 127.0.0.1 -U postgres -d postgres -AtX -F '|' "$@"; }
n=0
while true; do
  psql_ -c "SELECT to_char(clock_timestamp(),'HH24:MI:SS.MS'), datname, state,
                   coalesce(wait_event_type,'-'), coalesce(wait_event,'-'),
                   regexp_replace(left(query, 90), '\s+', ' ', 'g')
            FROM pg_stat_activity
            WHERE datname LIKE 'warden_bench_%' AND pid <> pg_backend_pid()
              AND state <> 'idle'" >> "$out/activity.txt" 2>/dev/null
  if (( n % 20 == 0 )); then
    for port in $(ss -ltnp 2>/dev/null | awk '/"warden"/ {split($4,a,":"); print a[length(a)]}'); do
      curl -s -m 1 "http://127.0.0.1:$port/metrics" > "$out/metrics-$port.txt.new" \
        && mv "$out/metrics-$port.txt.new" "$out/metrics-$port.txt"
      date +%T >> "$out/metrics-$port.txt"
    done
  fi
  n=$((n + 1))
  sleep 0.1
done
