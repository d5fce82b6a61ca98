#!/usr/bin/env bash
# Interleaved A/B rounds of bench's run phase (docs/performance.md, parts 14-20): for each round,
# each binary, one and two threads, `bench --trace TRACE --no-per-rule --json` with the trace
# preloaded (INGERO_SQLITE_STREAM=0), one line per run:
#
#   round binary threads run_seconds run_cpu_seconds chains chains_match [capacity handoff_ns]
#
#   bench/ab_run_phase.sh [-t TRACE] [-r ROUNDS] [-c PROBE] BIN [BIN ...]
#
# -c PROBE: run PROBE (build/ingero-pair-capacity) right after each run and print what it
# measured: the two vCPUs' capacity (2.0: two whole cores) and the latency of handing a cache line
# from one to the other (tens of ns: they share an L3; over 100: they do not). On a VM both change
# from one second to the next (docs/performance.md, part 20).
#
# TRACE defaults to /tmp/big5m.db (bench/make_ingero_trace.sh /tmp/big5m.db 5000000 5), ROUNDS
# to 5. Interleaving matters on a small VM: both sides move by a third between identical runs, so
# compare medians of the same rounds, never one run with another.
set -euo pipefail
trace=/tmp/big5m.db
rounds=5
probe=
while getopts "t:r:c:" opt; do
  case $opt in
    t) trace=$OPTARG ;;
    r) rounds=$OPTARG ;;
    c) probe=$OPTARG ;;
    *) sed -n '2,17p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
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
