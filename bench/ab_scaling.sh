#!/usr/bin/env bash
# Interleaved A/B sets of `bench --scaling` (docs/performance.md, part 21): for each set, each
# binary, `bench --trace TRACE --no-per-rule --threads 2 --scaling ROUNDS --json` with the trace
# preloaded (INGERO_SQLITE_STREAM=0); one line per round, then each binary's medians over every
# round of every set:
#
#   set binary round one_s engine_s speedup capacity time_split_bound efficiency
#
#   bench/ab_scaling.sh [-t TRACE] [-s SETS] [-r ROUNDS] BIN [BIN ...]
#
# capacity is what the machine gave two copies of the one-thread run at once in that round (2.0:
# two whole cores); efficiency = speedup / capacity, steadier than the speedup on a VM whose second
# vCPU comes and goes. TRACE defaults to /tmp/big5m.db (bench/make_ingero_trace.sh /tmp/big5m.db
# 5000000 5), SETS to 3, ROUNDS to 4.
set -euo pipefail
trace=/tmp/big5m.db
sets=3
rounds=4
while getopts "t:s:r:" opt; do
  case $opt in
    t) trace=$OPTARG ;;
    s) sets=$OPTARG ;;
    r) rounds=$OPTARG ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
out=$(mktemp)
lines=$(mktemp)
trap 'rm -f "$out" "$lines"' EXIT
for s in $(seq 1 "$sets"); do
  for bin in "$@"; do
    INGERO_SQLITE_STREAM=0 "$bin" bench --trace "$trace" --no-per-rule --threads 2 --scaling "$rounds" --json >"$out"
    python3 - "$out" "$s" "$bin" <<'PY' | tee -a "$lines"
import json, sys
path, s, name = sys.argv[1:]
for i, r in enumerate(json.load(open(path))["scaling"]["rounds"], 1):
    print(s, name, i, "%.4f %.4f %.2f %.2f %.2f %.2f" % (
        r["one_thread"]["seconds"], r["engine"]["seconds"], r["speedup"], r["capacity"],
        r["time_split_bound"], r["efficiency"]))
PY
  done
done
python3 - "$lines" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[1], []).append([float(x) for x in f[3:9]])
print("medians: binary rounds one_s engine_s speedup capacity time_split_bound efficiency")
for name, v in rows.items():
    print(name, len(v), " ".join("%.4f" % statistics.median(x[i] for x in v) if i < 2 else
                                "%.2f" % statistics.median(x[i] for x in v) for i in range(6)))
PY
