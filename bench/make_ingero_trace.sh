#!/usr/bin/env bash
# Generates an Ingero 0.8-schema SQLite trace of N events for the replay/scale benchmarks
# (docs/performance.md), entirely inside SQLite (a recursive CTE: no Python, ~1 s per million).
#
#   bench/make_ingero_trace.sh OUT.db [N=5000000] [SPAN_S=5]
#
# Shape (the worst case for per-window state: the whole trace falls in one 10 s window):
# - 90 % CUDA/driver calls: 12 pids x 3 ops (cudaLaunchKernel, cudaStreamSynchronize,
#   cuLaunchKernel) = 36 (pid, source, op) keys, durations 2-102 us with a 1 % tail of 1-21 ms.
# - 10 % HOST sched_switch rows, stored as Ingero stores them (timestamp = END of the off-CPU
#   span), spans up to 3 ms: the only rows out of start-time order.
# - Rows are in timestamp order, SPAN_S seconds in all, with idx_events_timestamp (as Ingero).
# Deterministic: the same N and SPAN_S give the same file.
set -euo pipefail
out=${1:?usage: make_ingero_trace.sh OUT.db [N] [SPAN_S]}
n=${2:-5000000}
span_s=${3:-5}
rm -f "$out"
sqlite3 "$out" <<SQL
PRAGMA journal_mode=OFF;
PRAGMA synchronous=OFF;
PRAGMA page_size=4096;
CREATE TABLE events (
  id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
  source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL,
  gpu_id INTEGER NOT NULL DEFAULT 0, arg0 INTEGER NOT NULL DEFAULT 0,
  arg1 INTEGER NOT NULL DEFAULT 0, ret_code INTEGER NOT NULL DEFAULT 0,
  stack_hash INTEGER NOT NULL DEFAULT 0);
CREATE TABLE process_names (pid INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO schema_info VALUES ('version', '0.8');
WITH RECURSIVE p(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM p WHERE i < 11)
INSERT INTO process_names SELECT 4000 + i, 'python3' FROM p;
WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < $n - 1)
INSERT INTO events(id, timestamp, pid, tid, source, op, duration)
SELECT i + 1,
       1700000000000000000 + i * ($span_s * 1000000000 / $n),
       4000 + (i / 10) % 12,
       40000 + (i / 10) % 12 * 4 + i % 4,
       CASE WHEN i % 10 = 9 THEN 3 WHEN (i / 120) % 3 = 2 THEN 4 ELSE 1 END,
       CASE WHEN i % 10 = 9 THEN 1 WHEN (i / 120) % 3 = 0 THEN 3 WHEN (i / 120) % 3 = 1 THEN 5 ELSE 1 END,
       CASE WHEN i % 10 = 9 THEN 1000 + (i * 7919) % 2999000
            WHEN (i * 2654435761) % 100 = 0 THEN 1000000 + (i * 40503) % 20000000
            ELSE 2000 + (i * 2654435761) % 100000 END
FROM r;
CREATE INDEX idx_events_timestamp ON events(timestamp);
CREATE INDEX idx_events_pid ON events(pid);
CREATE INDEX idx_events_source_op_stack ON events(source, op, stack_hash);
SQL
echo "$out: $(sqlite3 "$out" 'select count(*) from events') events, $(du -h "$out" | cut -f1)"
