#!/usr/bin/env bash
# Interleaved A/B rounds of bench's run phase (docs/performance.md, parts 14-19): for each round,
# each binary, one and two threads, `bench --trace TRACE --no-per-rule --json` with the trace
# preloaded (INGERO_SQLITE_STREAM=0), one line per run:
#
#   round binary threads run_seconds run_cpu_seconds chains chains_match
#
#   bench/ab_run_phase.sh [-t TRACE] [-r ROUNDS] BIN [BIN ...]
#
# TRACE defaults to /tmp/big5m.db (bench/make_ingero_trace.sh /tmp/big5m.db 5000000 5), ROUNDS
# to 5. Interleaving matters on a small VM: both sides move by a third between identical runs, so
# compare medians of the same rounds, never one run with another.
set -euo pipefail
trace=/tmp/big5m.db
rounds=5
while getopts "t:r:" opt; do
  case $opt in
    t) trace=$OPTARG ;;
    r) rounds=$OPTARG ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    for t in 1 2; do
      INGERO_SQLITE_STREAM=0 "$bin" bench --trace "$trace" --no-per-rule --threads "$t" --batch 4096 --json >"$out"
      python3 - "$out" "$r" "$(basename "$bin")" "$t" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
run = d["phases"]["run"]
print(sys.argv[2], sys.argv[3], sys.argv[4], "%.4f" % run["seconds"], "%.4f" % run["cpu_seconds"],
      d["chains"], d["chains_match"])
PY
    done
  done
done
