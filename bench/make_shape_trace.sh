#!/usr/bin/env bash
# Generates an Ingero 0.8-schema SQLite trace of a given *shape* for the shape matrix
# (bench/shape_matrix.sh, docs/performance.md "Speed on any shape"), inside SQLite (a recursive
# CTE: ~1-2 s per million rows). bench/make_ingero_trace.sh is the one fixed shape the older figures
# use; this is the same schema and the same kind of rows with every dimension a parameter.
#
#   bench/make_shape_trace.sh OUT.db [N=5000000] [PROCS=12] [THREADS=4] [OPS=3] [OFFCPU_PCT=10]
#                             [TAIL_PERMILLE=10] [SPAN_S=5]
#
# - N rows in all, SPAN_S seconds of trace time, evenly spaced (the pack's windows are 10 s, so
#   SPAN_S = 5 is one window, 1000 is 100).
# - PROCS processes (pids 4000..), THREADS threads each; the threads take turns in bursts of 10
#   rows (every thread of every process in a row), as feeding threads do.
# - OPS distinct CUDA/driver ops (2-20, in a fixed order: cudaLaunchKernel, cudaStreamSynchronize,
#   cuLaunchKernel, cudaMemcpyAsync, cudaMemcpy, cudaDeviceSynchronize, then the rest of both
#   tables), each row's op from a hash of its index. Durations 2-102 us, TAIL_PERMILLE per mille
#   of them 1-21 ms (the slow tail the joins look at).
# - OFFCPU_PCT % of the rows are HOST sched_switch rows of the same thread, spans up to 3 ms,
#   stored as Ingero stores them (timestamp = END of the off-CPU span).
# - Rows in timestamp order, with Ingero's three indexes. Deterministic: the same arguments give
#   the same file.
set -euo pipefail
out=${1:?usage: make_shape_trace.sh OUT.db [N] [PROCS] [THREADS] [OPS] [OFFCPU_PCT] [TAIL_PERMILLE] [SPAN_S]}
n=${2:-5000000}
procs=${3:-12}
threads=${4:-4}
ops=${5:-3}
offcpu=${6:-10}
tail_pm=${7:-10}
span_s=${8:-5}
for v in "$n" "$procs" "$threads" "$ops" "$offcpu" "$tail_pm" "$span_s"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "make_shape_trace.sh: '$v' is not a non-negative integer" >&2; exit 2; }
done
((ops >= 1 && ops <= 20)) || { echo "make_shape_trace.sh: OPS must be 1-20, got $ops" >&2; exit 2; }
((procs >= 1 && threads >= 1 && n >= 1 && span_s >= 1 && offcpu <= 100 && tail_pm <= 1000)) ||
  { echo "make_shape_trace.sh: PROCS, THREADS, N, SPAN_S >= 1; OFFCPU_PCT <= 100; TAIL_PERMILLE <= 1000" >&2; exit 2; }
rm -f "$out"
sqlite3 "$out" <<SQL
PRAGMA journal_mode=OFF;
PRAGMA synchronous=OFF;
PRAGMA page_size=4096;
PRAGMA cache_size=-262144;
CREATE TABLE events (
  id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
  source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL,
  gpu_id INTEGER NOT NULL DEFAULT 0, arg0 INTEGER NOT NULL DEFAULT 0,
  arg1 INTEGER NOT NULL DEFAULT 0, ret_code INTEGER NOT NULL DEFAULT 0,
  stack_hash INTEGER NOT NULL DEFAULT 0);
CREATE TABLE process_names (pid INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO schema_info VALUES ('version', '0.8');
CREATE TEMP TABLE shape_ops (k INTEGER PRIMARY KEY, source INTEGER, op INTEGER);
INSERT INTO shape_ops VALUES (0,1,3),(1,1,5),(2,4,1),(3,1,7),(4,1,4),(5,1,6),(6,1,1),(7,1,2),(8,1,8),(9,1,9),
  (10,4,2),(11,4,3),(12,4,4),(13,4,5),(14,4,6),(15,4,7),(16,4,8),(17,4,9),(18,4,10),(19,4,11);
WITH RECURSIVE p(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM p WHERE i < $procs - 1)
INSERT INTO process_names SELECT 4000 + i, 'python3' FROM p;
WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < $n - 1),
rows AS (
  SELECT i,
         (i / 10) % ($procs * $threads) AS j,
         ((i * 2654435761) >> 7) % 1000 < $offcpu * 10 AS off,
         ((i * 40503) >> 5) % 1000 < $tail_pm AS slow,
         ((i / 3) * 2654435761 >> 11) % $ops AS k
  FROM r)
INSERT INTO events(id, timestamp, pid, tid, source, op, duration)
SELECT i + 1,
       1700000000000000000 + i * ($span_s * 1000000000 / $n),
       4000 + j % $procs,
       100000 + (j % $procs) * $threads + j / $procs,
       CASE WHEN off THEN 3 ELSE (SELECT source FROM shape_ops WHERE shape_ops.k = rows.k) END,
       CASE WHEN off THEN 1 ELSE (SELECT op FROM shape_ops WHERE shape_ops.k = rows.k) END,
       CASE WHEN off THEN 1000 + (i * 7919) % 2999000
            WHEN slow THEN 1000000 + (i * 40503) % 20000000
            ELSE 2000 + (i * 2654435761) % 100000 END
FROM rows;
CREATE INDEX idx_events_timestamp ON events(timestamp);
CREATE INDEX idx_events_pid ON events(pid);
CREATE INDEX idx_events_source_op_stack ON events(source, op, stack_hash);
SQL
echo "$out: $(sqlite3 "$out" 'select count(*) from events') events, $(du -h "$out" | cut -f1)"
