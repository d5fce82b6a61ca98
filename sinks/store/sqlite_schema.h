// The DDL of databases written by SqliteSink (internal; documented in docs/storage.md).
//
// Ingero 0.9's tables are reproduced column for column, so Ingero's readers and the SQL users
// already wrote against Ingero traces keep working. Differences, all additive or relaxing:
// - events.id is TEXT NOT NULL without PRIMARY KEY: synthetic and merged inputs may repeat ids,
//   and a sink must never drop an event over a uniqueness rule (indexed instead).
// - events gains prev_state and flags (Ingero does not record why a thread was off CPU).
// - The four `events` indexes live in kEventIndexSql, created after the data (see there).
// - ip_* tables hold what Ingero has no place for: full chains with provenance, op statistics,
//   the time accounting of the GPU-feeding threads, the inferred steps, the format/tool version
//   and input health.
#pragma once

namespace ingero::sqlite_detail {

inline constexpr const char* kSchemaSql = R"sql(
CREATE TABLE events (
  id         TEXT NOT NULL,              -- "{node}:{seq}", or "{seq}" for the local node
  timestamp  INTEGER NOT NULL,           -- unix nanos; HOST sched_switch: switch-in (span END)
  pid        INTEGER NOT NULL,
  tid        INTEGER NOT NULL,
  source     INTEGER NOT NULL,
  op         INTEGER NOT NULL,
  duration   INTEGER NOT NULL,           -- nanos
  gpu_id     INTEGER NOT NULL DEFAULT 0,
  arg0       INTEGER NOT NULL DEFAULT 0,
  arg1       INTEGER NOT NULL DEFAULT 0,
  ret_code   INTEGER NOT NULL DEFAULT 0,
  stack_hash INTEGER NOT NULL DEFAULT 0, -- FK to stack_traces.hash (0 = no stack)
  node       TEXT NOT NULL DEFAULT '',
  rank       INTEGER,
  local_rank INTEGER,
  world_size INTEGER,
  stack_ips  TEXT NOT NULL DEFAULT '',
  cgroup_id  INTEGER NOT NULL DEFAULT 0,
  prev_state INTEGER NOT NULL DEFAULT 0, -- ingero-pipeline: 0 unknown, 1 preempted, 2 sleeping, 3 disk wait, 4 other
  flags      INTEGER NOT NULL DEFAULT 0  -- ingero-pipeline: 1 truncated span, 2 synthetic, 16 delivered late (live)
);
CREATE TABLE stack_traces (
  hash   INTEGER PRIMARY KEY,
  ips    TEXT NOT NULL,
  frames TEXT NOT NULL DEFAULT ''
);
CREATE TABLE causal_chains (
  id              TEXT PRIMARY KEY,
  detected_at     INTEGER NOT NULL,
  severity        TEXT NOT NULL,
  summary         TEXT NOT NULL,
  root_cause      TEXT NOT NULL,
  explanation     TEXT NOT NULL,
  recommendations TEXT NOT NULL DEFAULT '',
  cuda_op         TEXT NOT NULL DEFAULT '',
  cuda_p99_us     INTEGER NOT NULL DEFAULT 0,
  cuda_p50_us     INTEGER NOT NULL DEFAULT 0,
  tail_ratio      REAL NOT NULL DEFAULT 0,
  timeline        TEXT NOT NULL DEFAULT '',
  node            TEXT NOT NULL DEFAULT ''
);
CREATE INDEX idx_chains_detected_at ON causal_chains(detected_at);
CREATE INDEX idx_chains_severity ON causal_chains(severity);
CREATE TABLE sources (
  id          INTEGER PRIMARY KEY,
  name        TEXT NOT NULL,
  description TEXT NOT NULL
);
CREATE TABLE ops (
  source_id   INTEGER NOT NULL,
  op_id       INTEGER NOT NULL,
  name        TEXT NOT NULL,
  description TEXT NOT NULL,
  PRIMARY KEY (source_id, op_id)
);
CREATE TABLE schema_info (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE system_snapshots (
  id        INTEGER PRIMARY KEY AUTOINCREMENT,
  timestamp INTEGER NOT NULL UNIQUE,
  cpu_pct   REAL NOT NULL,
  mem_pct   REAL NOT NULL,
  mem_avail INTEGER NOT NULL,
  swap_mb   INTEGER NOT NULL,
  load_avg  REAL NOT NULL
);
CREATE TABLE sessions (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  started_at INTEGER NOT NULL,
  stopped_at INTEGER NOT NULL DEFAULT 0,
  gpu_model  TEXT NOT NULL DEFAULT '',
  gpu_driver TEXT NOT NULL DEFAULT '',
  cpu_model  TEXT NOT NULL DEFAULT '',
  cpu_cores  INTEGER NOT NULL DEFAULT 0,
  mem_total  INTEGER NOT NULL DEFAULT 0,
  kernel     TEXT NOT NULL DEFAULT '',
  os_release TEXT NOT NULL DEFAULT '',
  cuda_ver   TEXT NOT NULL DEFAULT '',
  python_ver TEXT NOT NULL DEFAULT '',
  ingero_ver TEXT NOT NULL DEFAULT '',
  pid_filter TEXT NOT NULL DEFAULT '',
  flags      TEXT NOT NULL DEFAULT '',
  node       TEXT NOT NULL DEFAULT '',
  rank       INTEGER,
  local_rank INTEGER,
  world_size INTEGER
);
CREATE INDEX idx_sessions_started ON sessions(started_at);
CREATE TABLE process_names (
  pid     INTEGER NOT NULL,
  name    TEXT NOT NULL,
  seen_at INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (pid)
);
CREATE TABLE event_aggregates (
  bucket   INTEGER NOT NULL,
  source   INTEGER NOT NULL,
  op       INTEGER NOT NULL,
  pid      INTEGER NOT NULL DEFAULT 0,
  count    INTEGER NOT NULL DEFAULT 0,
  stored   INTEGER NOT NULL DEFAULT 0,
  sum_dur  INTEGER NOT NULL DEFAULT 0,
  min_dur  INTEGER NOT NULL DEFAULT 0,
  max_dur  INTEGER NOT NULL DEFAULT 0,
  sum_arg0 INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket, source, op, pid)
);
CREATE TABLE cgroup_metadata (
  cgroup_id    INTEGER PRIMARY KEY,
  container_id TEXT NOT NULL DEFAULT '',
  cgroup_path  TEXT NOT NULL DEFAULT '',
  pod_name     TEXT NOT NULL DEFAULT '',
  namespace    TEXT NOT NULL DEFAULT ''
);
CREATE TABLE cgroup_schedstat (
  cgroup_id     INTEGER NOT NULL,
  p99_off_cpu   INTEGER NOT NULL,
  total_off_cpu INTEGER NOT NULL,
  event_count   INTEGER NOT NULL,
  window_start  INTEGER NOT NULL DEFAULT 0,
  window_end    INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (cgroup_id, window_end)
);

CREATE TABLE ip_meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE ip_thread_names (              -- thread names (comm) when the recorder knew them
  tid  INTEGER PRIMARY KEY,
  name TEXT NOT NULL
);
CREATE TABLE ip_process_capture (           -- live capture: when each process's calls are captured from
  pid         INTEGER PRIMARY KEY,
  attached_at INTEGER NOT NULL,              -- unix ns: calls that start from here on are in the trace
  started_at  INTEGER NOT NULL DEFAULT 0,    -- unix ns the process started (0 unknown)
  predates    INTEGER NOT NULL DEFAULT 0     -- 1: running before the trace started
);
CREATE TABLE ip_health (
  kind   TEXT NOT NULL,                  -- 'skip' (odd input rows), 'drop' (lost before us), 'miss' (probe hits the self-check found undelivered)
  reason TEXT NOT NULL,
  count  INTEGER NOT NULL,
  PRIMARY KEY (kind, reason)
);
CREATE TABLE ip_op_stats (
  source     INTEGER NOT NULL,
  op         INTEGER NOT NULL,
  op_name    TEXT NOT NULL,
  count      INTEGER NOT NULL,
  p50_ns     INTEGER NOT NULL,
  p95_ns     INTEGER NOT NULL,
  p99_ns     INTEGER NOT NULL,
  min_ns     INTEGER NOT NULL,
  max_ns     INTEGER NOT NULL,
  total_ns   INTEGER NOT NULL,
  tail_ratio REAL NOT NULL,
  exact      INTEGER NOT NULL,             -- 0: quantiles from a sketch with rel_error
  rel_error  REAL NOT NULL,
  errors     INTEGER NOT NULL,
  PRIMARY KEY (source, op)
);
CREATE TABLE ip_chains (
  id             TEXT PRIMARY KEY,
  position       INTEGER NOT NULL,         -- order in the result (severity, window, rule, key)
  rule           TEXT NOT NULL,
  rule_hash      TEXT NOT NULL,
  severity       TEXT NOT NULL,
  category       TEXT NOT NULL,
  source         INTEGER NOT NULL,
  op             INTEGER NOT NULL,
  op_name        TEXT NOT NULL,
  pid            INTEGER NOT NULL,
  tid            INTEGER NOT NULL,
  node           TEXT NOT NULL,
  node_index     INTEGER NOT NULL,
  rank           INTEGER,                  -- NULL = unknown
  window_start   INTEGER NOT NULL,
  window_end     INTEGER NOT NULL,
  summary        TEXT NOT NULL,
  root_cause     TEXT NOT NULL,
  explanation    TEXT NOT NULL,
  recommendations TEXT NOT NULL,           -- JSON array of strings
  evidence       TEXT NOT NULL,            -- JSON [{kind, detail, value, unit, event_ids}]
  predicates     TEXT NOT NULL,            -- JSON [{label, lhs, rhs, margin, passed}]
  slot_values    TEXT NOT NULL,            -- JSON [{name, value}] in emit order
  exemplars      TEXT NOT NULL,            -- JSON array of every evidence event id
  p50_ns         INTEGER NOT NULL,
  p99_ns         INTEGER NOT NULL,
  tail_ratio     REAL NOT NULL,
  dropped_events INTEGER NOT NULL,
  threads        TEXT NOT NULL DEFAULT '[]',   -- JSON [{tid, name, share}], largest share first
  stacks         TEXT NOT NULL DEFAULT '[]',   -- JSON [{role, stack_id, share, calls, truncated, frames: [{kind, function, file, line, module}]}]
  time_split     TEXT NOT NULL DEFAULT 'null', -- JSON {tid, start_ns, end_ns, in_calls, off_cpu_*, on_cpu, dominant} or null
  accounting     TEXT NOT NULL DEFAULT 'null', -- JSON: the chain's thread over its window, as ip_accounting's row in explain --json (docs/accounting.md), or null
  over_time      INTEGER NOT NULL DEFAULT 0    -- 1: from a rule over the accounting stream (one finding over the windows in a row it fired in)
);
CREATE INDEX idx_ip_chains_window ON ip_chains(window_start);
CREATE TABLE ip_accounting (               -- where each main GPU-feeding thread's time went, whole trace (docs/accounting.md)
  position          INTEGER NOT NULL,      -- order in the result (wall time desc)
  node              TEXT NOT NULL,
  node_index        INTEGER NOT NULL,
  pid               INTEGER NOT NULL,
  tid               INTEGER NOT NULL,
  comm              TEXT NOT NULL,         -- thread name, else process name, else ''
  rank              INTEGER,               -- NULL = unknown
  start_ns          INTEGER NOT NULL,      -- the interval accounted: first event start .. last event end
  end_ns            INTEGER NOT NULL,
  wall_ns           INTEGER NOT NULL,      -- = in_calls_total_ns + on_cpu_ns + preempted_ns + blocked_total_ns + unknown_ns
  in_calls_total_ns INTEGER NOT NULL,
  in_calls_ns       TEXT NOT NULL,         -- JSON {launch, copy, sync, alloc, collective, other}: ns by the outermost call's kind
  on_cpu_ns         INTEGER NOT NULL,
  preempted_ns      INTEGER NOT NULL,
  preempted_by      TEXT NOT NULL,         -- JSON [{pid, tid, comm, ns}]: the top tasks that ran instead
  blocked_total_ns  INTEGER NOT NULL,
  blocked_ns        TEXT NOT NULL,         -- JSON {lock, io, network, sleep, other}: ns by reason
  unknown_ns        INTEGER NOT NULL,
  scheduler_data    INTEGER NOT NULL,      -- 1: the process has switch-out states (else time outside calls is unknown)
  PRIMARY KEY (node_index, tid)
);
CREATE TABLE ip_steps (                    -- the inferred step period of each process (docs/steps.md)
  position             INTEGER NOT NULL,   -- order in the result (node, pid, rank)
  node                 TEXT NOT NULL,
  node_index           INTEGER NOT NULL,
  pid                  INTEGER NOT NULL,
  rank                 INTEGER,            -- NULL = unknown
  count                INTEGER NOT NULL,   -- steps over the whole trace (0 when method is 'none')
  period_ns            INTEGER NOT NULL,
  p50_ns               INTEGER NOT NULL,
  p99_ns               INTEGER NOT NULL,
  method               TEXT NOT NULL,      -- 'cudaStreamSynchronize x1', 'launch bursts x4 (gap >= 1.0 ms)', 'annotated (step)', 'none', ...
  reason               TEXT NOT NULL,      -- method 'none': why there is no period
  confidence           REAL NOT NULL,      -- 0..1
  boundaries           TEXT NOT NULL,      -- JSON array of unix ns: the last step boundaries (or the fallback grid)
  fallback_interval_ns INTEGER NOT NULL,   -- method 'none': the grid's interval
  first_ns             INTEGER NOT NULL,   -- the process's first GPU call start
  last_ns              INTEGER NOT NULL,   -- and last call end
  epochs               INTEGER NOT NULL DEFAULT 0  -- method 'annotated (step)': the distinct epochs its markers named
);
CREATE TABLE ip_rule_outcomes (
  rule              TEXT PRIMARY KEY,
  position          INTEGER NOT NULL,      -- plan order
  rule_hash         TEXT NOT NULL,
  category          TEXT NOT NULL,
  windows           INTEGER NOT NULL,      -- window rows that reached the first predicate
  chains            INTEGER NOT NULL,
  has_miss          INTEGER NOT NULL,
  miss_stage        INTEGER NOT NULL,
  miss              TEXT NOT NULL,         -- JSON {label, lhs, rhs, margin, passed}
  miss_key          TEXT NOT NULL,
  miss_window_start INTEGER NOT NULL,
  miss_window_end   INTEGER NOT NULL,
  miss_values       TEXT NOT NULL,         -- JSON [{name, value}]
  over_time         INTEGER NOT NULL DEFAULT 0  -- 1: a rule over the accounting stream
);
)sql";

// One row per incident of the result (operators/incidents.h; docs/rules.md "Incidents"), most
// time lost first, replaced with each result; the verdict is the row of ip_meta key 'verdict'.
// Created when a result is written (IF NOT EXISTS: databases of older versions gain it then).
inline constexpr const char* kIncidentsSql = R"sql(
CREATE TABLE IF NOT EXISTS ip_incidents (
  position        INTEGER NOT NULL,   -- 0 = the most time lost
  id              TEXT NOT NULL,      -- its first chain's id
  rule            TEXT NOT NULL,
  category        TEXT NOT NULL,
  severity        TEXT NOT NULL,      -- 'HIGH', 'MEDIUM', 'LOW'
  pid             INTEGER NOT NULL,
  tid             INTEGER NOT NULL,
  node            TEXT NOT NULL,
  rank            INTEGER,            -- NULL = unknown
  start_ns        INTEGER NOT NULL,
  end_ns          INTEGER NOT NULL,
  steps           INTEGER NOT NULL,   -- steps of its process inside it (0: no period known)
  lost_ns         INTEGER NOT NULL,
  lost_basis      TEXT NOT NULL,
  lost_share      REAL NOT NULL,      -- of the job's wall time
  gpus            REAL NOT NULL,
  gpus_from       TEXT NOT NULL,      -- 'trace', '--gpus', 'assumed'
  gpu_hours       REAL NOT NULL,
  cost            REAL,               -- NULL without a price
  currency        TEXT,
  what_if_step_ns INTEGER,            -- NULL without a step period
  summary         TEXT NOT NULL,
  step_ns         INTEGER,            -- the process's step time p50 (NULL: unknown)
  chains          TEXT NOT NULL       -- JSON array of the ids of its chains (ip_chains.chain_id)
);
)sql";

// The `events` table's secondary indexes (Ingero's names and columns). Kept apart from kSchemaSql
// because maintaining four B-trees per INSERT is most of the cost of a live capture: SqliteSink
// creates them after the last event when Options::defer_indexes is set (the default), and with
// the schema otherwise. IF NOT EXISTS makes the statement safe to run on either kind of file.
// A database whose writer was killed before close() has no indexes; every reader and `query`
// still work on it (full scans instead of index lookups).
inline constexpr const char* kEventIndexSql = R"sql(
CREATE INDEX IF NOT EXISTS idx_events_timestamp ON events(timestamp);
CREATE INDEX IF NOT EXISTS idx_events_pid ON events(pid);
CREATE INDEX IF NOT EXISTS idx_events_id ON events(id);
CREATE INDEX IF NOT EXISTS idx_events_source_op_stack ON events(source, op, stack_hash);
)sql";

// Fleet identity (sinks/fleet/process_identity.h, docs/fleet.md): written by `trace --db` after the
// capture and carried by `merge`; absent from older files, whose readers never need them.
inline constexpr const char* kIdentitySql = R"sql(
CREATE TABLE IF NOT EXISTS ip_node_attributes (   -- per node: hostname, node_id_source, ...
  node  TEXT NOT NULL,
  key   TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (node, key)
);
CREATE TABLE IF NOT EXISTS ip_process_identity (  -- per traced process, from its environment
  node       TEXT NOT NULL,
  pid        INTEGER NOT NULL,
  rank       INTEGER,                    -- NULL = not in the environment
  local_rank INTEGER,
  world_size INTEGER,
  job_id     TEXT NOT NULL DEFAULT '',
  launcher   TEXT NOT NULL DEFAULT '',   -- torchrun | openmpi | slurm
  first_seen INTEGER NOT NULL DEFAULT 0, -- unix ns of the pid's first event
  PRIMARY KEY (node, pid, first_seen)
);
)sql";

// Explicit annotations (`trace --annotate`: Ingero's annotation protocol, model/annotation.h;
// docs/storage.md): written by `trace --db` after the capture (write_annotations) and read back by
// `explain` for its step markers (read_annotations). Absent from older files.
inline constexpr const char* kAnnotationsSql = R"sql(
CREATE TABLE IF NOT EXISTS ip_annotations (  -- what traced programs reported about themselves
  ts_ns      INTEGER NOT NULL,            -- unix ns: the line's ts, else when it was received
  ts_given   INTEGER NOT NULL DEFAULT 0,  -- 1: the program gave ts; 0: the receive time
  node       TEXT NOT NULL DEFAULT '',
  pid        INTEGER NOT NULL,            -- the process it is about (the line's pid, else the sender)
  tid        INTEGER NOT NULL DEFAULT 0,  -- its thread, when the line said (0: not said)
  start_time INTEGER NOT NULL DEFAULT 0,  -- /proc/<pid>/stat start time in clock ticks (0: unknown)
  span_start INTEGER NOT NULL DEFAULT 0,  -- unix ns; both 0: an instant
  span_end   INTEGER NOT NULL DEFAULT 0,
  labels     TEXT NOT NULL,               -- JSON object of strings: {"step":"42","epoch":"3"}
  step       INTEGER,                     -- labels.step as a number (NULL: absent or not one)
  epoch      INTEGER,                     -- labels.epoch likewise
  peer_pid   INTEGER NOT NULL DEFAULT 0,  -- SO_PEERCRED of the connection it came on
  peer_uid   INTEGER NOT NULL DEFAULT 0,
  peer_gid   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_ip_annotations_pid_ts ON ip_annotations(pid, ts_ns);
)sql";

}  // namespace ingero::sqlite_detail
