#!/usr/bin/env bash
# Interleaved A/B rounds of bench's run phase (docs/history/issue-12.md, parts 14-21): for each round,
# each binary, one and two threads, `bench --trace TRACE --no-per-rule --json` with the trace
# preloaded (INGERO_SQLITE_STREAM=0), one line per run:
#
#   round binary threads run_seconds run_cpu_seconds chains chains_match [capacity handoff_ns]
#
#   bench/ab_run_phase.sh [-t TRACE] [-r ROUNDS] [-c PROBE | -S N] BIN [BIN ...]
#
# -c PROBE: run PROBE (build/ingero-pair-capacity) right after each run and print what it
# measured: the two vCPUs' capacity (2.0: two whole cores) and the latency of handing a cache line
# from one to the other (tens of ns: they share an L3; over 100: they do not). On a VM both change
# from one second to the next (docs/history/issue-12.md, part 20).
# -S N: instead, each round runs each binary once as `bench --threads 2 --scaling N` and prints a
# line per scaling round, then each binary's medians over all of them:
#
#   round binary k one_s engine_s speedup capacity time_split_bound efficiency
#
# capacity is then what the machine gave two copies of the one-thread run at once in that round,
# and efficiency = speedup / capacity, steadier than the speedup on a VM (part 21).
#
# TRACE defaults to /tmp/big5m.db (bench/make_ingero_trace.sh /tmp/big5m.db 5000000 5), ROUNDS
# to 5. Interleaving matters on a small VM: both sides move by a third between identical runs, so
# compare medians of the same rounds, never one run with another.
set -euo pipefail
trace=/tmp/big5m.db
rounds=5
probe=
scaling=
while getopts "t:r:c:S:" opt; do
  case $opt in
    t) trace=$OPTARG ;;
    r) rounds=$OPTARG ;;
    c) probe=$OPTARG ;;
    S) scaling=$OPTARG ;;
    *) sed -n '2,24p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
out=$(mktemp)
lines=$(mktemp)
trap 'rm -f "$out" "$lines"' EXIT
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    if [ -n "$scaling" ]; then
      INGERO_SQLITE_STREAM=0 "$bin" bench --trace "$trace" --no-per-rule --threads 2 --scaling "$scaling" --json >"$out"
      python3 - "$out" "$r" "$(basename "$bin")" <<'PY' | tee -a "$lines"
import json, sys
path, r, name = sys.argv[1:]
for k, s in enumerate(json.load(open(path))["scaling"]["rounds"], 1):
    print(r, name, k, "%.4f %.4f %.2f %.2f %.2f %.2f" % (
        s["one_thread"]["seconds"], s["engine"]["seconds"], s["speedup"], s["capacity"],
        s["time_split_bound"], s["efficiency"]))
PY
      continue
    fi
    for t in 1 2; do
      INGERO_SQLITE_STREAM=0 "$bin" bench --trace "$trace" --no-per-rule --threads "$t" --batch 4096 --json >"$out"
      capacity=
      [ -z "$probe" ] || capacity=$("$probe" --json)
      python3 - "$out" "$r" "$(basename "$bin")" "$t" "$capacity" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
run = d["phases"]["run"]
line = [sys.argv[2], sys.argv[3], sys.argv[4], "%.4f" % run["seconds"], "%.4f" % run["cpu_seconds"],
        d["chains"], d["chains_match"]]
if sys.argv[5]:
    probe = json.loads(sys.argv[5])
    line += ["%.2f" % probe["capacity"], "%.0f" % probe["handoff_ns"]]
print(*line)
PY
    done
  done
done
[ -z "$scaling" ] || python3 - "$lines" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[1], []).append([float(x) for x in f[3:9]])
print("medians: binary rounds one_s engine_s speedup capacity time_split_bound efficiency")
for name, v in rows.items():
    med = [statistics.median(x[i] for x in v) for i in range(6)]
    print(name, len(v), "%.4f %.4f" % tuple(med[:2]), " ".join("%.2f" % m for m in med[2:]))
PY
