#!/usr/bin/env bash
# Onset -> alert received, end to end (issue 42 item 3; docs/fleet.md "Alerts in seconds"):
# repeats the Alertmanager end-to-end test (tests/sinks/metrics/alertmanager_e2e_test.cpp: a real
# Prometheus with a 5 s scrape and 5 s evaluation, a real Alertmanager with group_wait 0s, a
# webhook receiver, 8 nodes replayed at real speed, one rank turning straggler at a known moment)
# and prints each run's onset-to-alert time, the median and the max. Target: <= 15 s.
#
#   bench/alert_latency.sh [REPEATS=5] [BUILD_DIR=build]
#
# Needs prometheus and prometheus-alertmanager (Debian packages) and the test built
# (cmake --build build --target alertmanager_e2e_test). Each repeat takes ~35 s.
set -euo pipefail
repeats=${1:-5}
build=${2:-build}
test_bin="$build/tests/sinks/metrics/alertmanager_e2e_test"
[ -x "$test_bin" ] || { echo "build $test_bin first (cmake --build $build --target alertmanager_e2e_test)" >&2; exit 2; }
figures=()
for i in $(seq 1 "$repeats"); do
  # A random 0-5 s pause: each repeat takes about the same time, which would otherwise put every
  # onset at the same phase of Prometheus's 5 s scrape and evaluation grid.
  [ "$i" -gt 1 ] && sleep "$((RANDOM % 5)).$((RANDOM % 10))"
  out=$("$test_bin" 2>&1) || { echo "$out" | grep -v '^{' | tail -60 >&2; echo "repeat $i failed" >&2; exit 1; }
  if echo "$out" | grep -q '\[  SKIPPED \]'; then echo "$out" | grep -i skip >&2; exit 77; fi
  s=$(echo "$out" | sed -n 's/^onset -> alert received: \([0-9.]*\) s.*/\1/p')
  echo "repeat $i: onset -> alert received ${s} s"
  echo "$out" | grep '^  ' | sed 's/^/    /'
  figures+=("$s")
done
printf '%s\n' "${figures[@]}" | sort -g | awk '{v[NR]=$1} END {
  m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2
  printf "repeats %d: median %.2f s, max %.2f s, min %.2f s (target <= 15 s, 5 s scrape)\n", NR, m, v[NR], v[1] }'
