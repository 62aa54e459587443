#!/usr/bin/env bash
# Samples, every 100 ms while a warden-bench phase runs, each waiting
# backend of the benchmark's databases with the first backend blocking it
# (pg_blocking_pids): who waits on whom, by statement.
# usage: sample_blockers.sh OUT_FILE  (runs until killed)
set -u
out=${1:?out file}
while true; do
  psql -h 127.0.0.1 -U postgres -d postgres -AtX -F '|' -c "
    SELECT to_char(clock_timestamp(),'HH24:MI:SS.MS'), w.datname,
           w.wait_event_type || '/' || w.wait_event,
           regexp_replace(left(w.query, 60), '\s+', ' ', 'g'),
           b.state, coalesce(b.wait_event_type || '/' || b.wait_event, '-'),
           regexp_replace(left(b.query, 60), '\s+', ' ', 'g'),
           round(extract(epoch FROM clock_timestamp() - b.xact_start) * 1000)
    FROM pg_stat_activity w
    CROSS JOIN LATERAL (SELECT (pg_blocking_pids(w.pid))[1] AS pid) bp
    JOIN pg_stat_activity b ON b.pid = bp.pid
    WHERE w.datname LIKE 'warden_bench_%' AND w.wait_event_type = 'Lock'" >> "$out" 2>/dev/null
  sleep 0.1
done
