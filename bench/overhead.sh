#!/usr/bin/env bash
# Live-capture overhead and sustained-rate benchmark (not a test: needs root and BPF, and takes
# minutes). Results and how to read them: docs/performance.md, section "Live capture".
#
#   bench/overhead.sh overhead [BUILD_DIR] [ROUNDS] [CALLS]
#       ns per cudaLaunchKernel call (real libcudart, no GPU: the call fails fast) measured
#       untraced, under `ingero-pipeline trace`, and under the minimal bpftrace uprobe+uretprobe
#       timing script, interleaved ROUNDS times in one run; prints each and the ratio.
#       `trace` runs with its defaults: stacks on for calls >= 1 ms (these fast calls stay under
#       the threshold) and the 49 Hz CPU sampler on.
#   bench/overhead.sh stacks [BUILD_DIR] [ROUNDS] [CALLS]
#       cost of a captured slow-call stack: the same loop under `trace --stack-min 0` (a stack on
#       every call, rate limit lifted) next to `trace --no-stacks --no-samples`, and bpftrace's
#       `ustack` on the same uretprobe next to the bpftrace floor; prints ns added per stack.
#   bench/overhead.sh bpfstats [BUILD_DIR] [CALLS]
#       in-kernel time per BPF program (kernel.bpf_stats_enabled, `bpftool prog show -j`) around
#       the same loop under `trace` defaults and under `trace --no-stacks --no-samples`: runs per
#       call and ns per run of every program that ran. Counts only the programs' own time, so it
#       is robust to machine load (absolute ns are still inflated on a loaded machine).
#   bench/overhead.sh cputime [BUILD_DIR] [ROUNDS] [CALLS]
#       the workload's own CPU time (user + sys from /usr/bin/time, which includes the uprobe and
#       BPF work done in its context but not the tracer's consumer threads) per call, under `trace`
#       defaults, `--no-stacks --no-samples`, `--disable sched` and the bpftrace floor, interleaved
#       ROUNDS times; less sensitive to machine load than wall time (10 ms resolution: 10 ns per
#       call at 1M calls).
#   bench/overhead.sh sustain [BUILD_DIR] [SECONDS] [RATE]
#       the workload paced at RATE calls/s for SECONDS under `trace --db`; prints drops, late
#       events and the tracer's peak resident memory (VmHWM).
set -euo pipefail

mode=${1:-overhead}
build=${2:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
[[ $build = /* ]] || build="$here/$build"
tracer="$build/ingero-pipeline"
work="$build/workloads/ip-cuda-workload"
cudart=$(readlink -f "${CUDART:-/usr/local/cuda/lib64/libcudart.so}")
tmp=$(mktemp -d /tmp/ip_overhead.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for f in "$tracer" "$work"; do
  [[ -x $f ]] || { echo "missing $f (build the ingero-pipeline and ip-cuda-workload targets)" >&2; exit 2; }
done
[[ $(id -u) = 0 ]] || { echo "needs root (BPF)" >&2; exit 2; }

# Starts the tracer in the background and waits until its uprobes are attached.
start_tracer() {
  "$tracer" trace -q --cuda-lib "$cudart" "$@" 2>"$tmp/trace.err" &
  tracer_pid=$!
  for _ in $(seq 1 300); do
    grep -q "^tracing libcudart" "$tmp/trace.err" 2>/dev/null && return 0
    kill -0 "$tracer_pid" 2>/dev/null || { cat "$tmp/trace.err" >&2; exit 1; }
    sleep 0.1
  done
  echo "tracer did not attach in 30 s" >&2; cat "$tmp/trace.err" >&2; exit 1
}
stop_tracer() {
  kill -INT "$tracer_pid"
  wait "$tracer_pid" || true
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

if [[ $mode = overhead ]]; then
  rounds=${3:-5}
  calls=${4:-2000000}
  command -v bpftrace >/dev/null || { echo "bpftrace not installed (apt-get install bpftrace)" >&2; exit 2; }
  cat >"$tmp/floor.bt" <<BT
uprobe:$cudart:cudaLaunchKernel { @start[tid] = nsecs; }
uretprobe:$cudart:cudaLaunchKernel /@start[tid]/ { @ns = stats(nsecs - @start[tid]); delete(@start[tid]); }
BT
  : >"$tmp/untraced"; : >"$tmp/ingero"; : >"$tmp/bpftrace"; : >"$tmp/nostk"
  load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  for r in $(seq 1 "$rounds"); do
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/untraced"

    start_tracer
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/ingero"
    stop_tracer
    grep "^trace:" "$tmp/trace.err" >&2 || true

    start_tracer --no-stacks --no-samples
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/nostk"
    stop_tracer

    bpftrace "$tmp/floor.bt" >"$tmp/bt.out" 2>&1 &
    bt=$!
    for _ in $(seq 1 300); do grep -q "Attaching" "$tmp/bt.out" && break; sleep 0.1; done
    sleep 0.5  # "Attaching N probes" is printed just before the attach completes
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/bpftrace"
    kill -INT "$bt"; wait "$bt" || true
    echo "round $r: untraced $(tail -1 "$tmp/untraced") ns, ingero $(tail -1 "$tmp/ingero") ns, ingero --no-stacks --no-samples $(tail -1 "$tmp/nostk") ns, bpftrace $(tail -1 "$tmp/bpftrace") ns" >&2
  done
  u=$(median <"$tmp/untraced"); i=$(median <"$tmp/ingero"); b=$(median <"$tmp/bpftrace")
  n=$(median <"$tmp/nostk")
  echo "calls per run: $calls, rounds: $rounds (medians, ns per cudaLaunchKernel call)"
  echo "untraced:                 $u"
  echo "ingero-pipeline trace:    $i   (defaults: stacks for calls >= 1 ms, 49 Hz samples)"
  echo "  --no-stacks --no-samples $n"
  echo "bpftrace uprobe+uretprobe $b"
  awk -v i="$i" -v b="$b" -v u="$u" -v n="$n" 'BEGIN {
    printf "ratio ingero/bpftrace:    %.3f (target <= 1.0)\n", i / b
    printf "ratio ingero --no-stacks --no-samples/bpftrace: %.3f\n", n / b
    printf "added per call: ingero %.0f ns, bpftrace %.0f ns\n", i - u, b - u }'
  # One line to quote: both ratios against the floor of the same run, and how loaded the machine was.
  awk -v i="$i" -v b="$b" -v n="$n" -v ls="$load_start" -v le="$(cut -d' ' -f1-3 /proc/loadavg)" \
      -v r="$rounds" -v c="$calls" 'BEGIN {
    printf "SUMMARY overhead: with stacks (trace defaults) %.3fx, without (--no-stacks --no-samples) %.3fx the bpftrace uprobe+uretprobe floor (%.1f ns/call); %d rounds x %d calls, medians; load average %s at start, %s at end\n", i / b, n / b, b, r, c, ls, le }'
elif [[ $mode = cputime ]]; then
  rounds=${3:-3}
  calls=${4:-1000000}
  command -v bpftrace >/dev/null || { echo "bpftrace not installed (apt-get install bpftrace)" >&2; exit 2; }
  cat >"$tmp/floor.bt" <<BT
uprobe:$cudart:cudaLaunchKernel { @start[tid] = nsecs; }
uretprobe:$cudart:cudaLaunchKernel /@start[tid]/ { @ns = stats(nsecs - @start[tid]); delete(@start[tid]); }
BT
  # ns of the workload's user + sys CPU time per call, appended to $1.
  cpu_run() {
    /usr/bin/time -f "%U %S" -o "$tmp/time" "$work" loop --calls "$calls" >/dev/null
    awk -v c="$calls" '{printf "%.0f\n", ($1 + $2) * 1e9 / c}' "$tmp/time" >>"$1"
  }
  names=(defaults nostk nosched bpftrace)
  for n in "${names[@]}"; do : >"$tmp/$n"; done
  load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  for r in $(seq 1 "$rounds"); do
    start_tracer; cpu_run "$tmp/defaults"; stop_tracer
    start_tracer --no-stacks --no-samples; cpu_run "$tmp/nostk"; stop_tracer
    start_tracer --disable sched; cpu_run "$tmp/nosched"; stop_tracer
    bpftrace "$tmp/floor.bt" >"$tmp/bt.out" 2>&1 &
    bt=$!
    for _ in $(seq 1 300); do grep -q "Attaching" "$tmp/bt.out" && break; sleep 0.1; done
    sleep 0.5
    cpu_run "$tmp/bpftrace"
    kill -INT "$bt"; wait "$bt" || true
    echo "round $r (workload CPU ns/call): defaults $(tail -1 "$tmp/defaults"), --no-stacks --no-samples $(tail -1 "$tmp/nostk"), --disable sched $(tail -1 "$tmp/nosched"), bpftrace $(tail -1 "$tmp/bpftrace")" >&2
  done
  d=$(median <"$tmp/defaults"); n=$(median <"$tmp/nostk"); s=$(median <"$tmp/nosched")
  b=$(median <"$tmp/bpftrace")
  awk -v d="$d" -v n="$n" -v s="$s" -v b="$b" -v ls="$load_start" \
      -v le="$(cut -d' ' -f1-3 /proc/loadavg)" -v r="$rounds" -v c="$calls" 'BEGIN {
    printf "SUMMARY cputime: workload CPU ns/call (medians) defaults %d (%.3fx), --no-stacks --no-samples %d (%.3fx), --disable sched %d (%.3fx), bpftrace floor %d; %d rounds x %d calls; load average %s at start, %s at end\n", d, d / b, n, n / b, s, s / b, b, r, c, ls, le }'
elif [[ $mode = stacks ]]; then
  rounds=${3:-3}
  calls=${4:-200000}
  command -v bpftrace >/dev/null || { echo "bpftrace not installed (apt-get install bpftrace)" >&2; exit 2; }
  cat >"$tmp/floor.bt" <<BT
uprobe:$cudart:cudaLaunchKernel { @start[tid] = nsecs; }
uretprobe:$cudart:cudaLaunchKernel /@start[tid]/ { @ns = stats(nsecs - @start[tid]); delete(@start[tid]); }
BT
  cat >"$tmp/ustack.bt" <<BT
uprobe:$cudart:cudaLaunchKernel { @start[tid] = nsecs; }
uretprobe:$cudart:cudaLaunchKernel /@start[tid]/ { @ns = stats(nsecs - @start[tid]); @s[ustack] = count(); delete(@start[tid]); }
BT
  run_bt() {
    bpftrace "$1" >"$tmp/bt.out" 2>&1 &
    bt=$!
    for _ in $(seq 1 300); do grep -q "Attaching" "$tmp/bt.out" && break; sleep 0.1; done
    sleep 0.5
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$2"
    kill -INT "$bt"; wait "$bt" || true
  }
  : >"$tmp/nostk"; : >"$tmp/stk"; : >"$tmp/btf"; : >"$tmp/btu"
  for r in $(seq 1 "$rounds"); do
    start_tracer --no-stacks --no-samples
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/nostk"
    stop_tracer
    start_tracer --stack-min 0 --stack-rate 1000000 --no-samples
    "$work" loop --calls "$calls" | awk '{print $2}' >>"$tmp/stk"
    stop_tracer
    grep "^trace: stacks" "$tmp/trace.err" >&2 || true
    run_bt "$tmp/floor.bt" "$tmp/btf"
    run_bt "$tmp/ustack.bt" "$tmp/btu"
    echo "round $r: ingero no stacks $(tail -1 "$tmp/nostk") ns, ingero stack per call $(tail -1 "$tmp/stk") ns, bpftrace floor $(tail -1 "$tmp/btf") ns, bpftrace ustack $(tail -1 "$tmp/btu") ns" >&2
  done
  n=$(median <"$tmp/nostk"); s=$(median <"$tmp/stk"); f=$(median <"$tmp/btf"); u=$(median <"$tmp/btu")
  echo "calls per run: $calls, rounds: $rounds (medians, ns per cudaLaunchKernel call)"
  echo "ingero trace --no-stacks:          $n"
  echo "ingero trace --stack-min 0:        $s"
  echo "bpftrace uprobe+uretprobe:         $f"
  echo "bpftrace + ustack:                 $u"
  awk -v n="$n" -v s="$s" -v f="$f" -v u="$u" 'BEGIN {
    printf "per captured stack: ingero %.0f ns (16 KiB window + FP stack + Python walk), bpftrace ustack %.0f ns (FP only)\n", s - n, u - f }'
elif [[ $mode = bpfstats ]]; then
  calls=${3:-1000000}
  command -v bpftool >/dev/null || { echo "bpftool not installed" >&2; exit 2; }
  was=$(sysctl -n kernel.bpf_stats_enabled)
  sysctl -qw kernel.bpf_stats_enabled=1
  for args in "" "--no-stacks --no-samples"; do
    # shellcheck disable=SC2086
    start_tracer $args
    bpftool prog show -j >"$tmp/before.json"
    ns=$("$work" loop --calls "$calls" | awk '{print $2}')
    bpftool prog show -j >"$tmp/after.json"
    stop_tracer
    echo "trace ${args:-(defaults)}: $ns ns per call, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 - "$tmp/before.json" "$tmp/after.json" "$calls" <<'PY'
import json, sys
before = {p["id"]: p for p in json.load(open(sys.argv[1]))}
calls = int(sys.argv[3])
for p in json.load(open(sys.argv[2])):
    q = before.get(p["id"])
    if q is None:
        continue
    n = p.get("run_cnt", 0) - q.get("run_cnt", 0)
    t = p.get("run_time_ns", 0) - q.get("run_time_ns", 0)
    if n:
        print(f"  {p.get('name', '?'):24s} {n / calls:7.3f} runs/call {t / n:8.1f} ns/run "
              f"{t / calls:8.1f} ns/call")
PY
  done
  sysctl -qw kernel.bpf_stats_enabled="$was"
elif [[ $mode = sustain ]]; then
  seconds=${3:-60}
  rate=${4:-200000}
  calls=$((seconds * rate))
  start_tracer --duration "$((seconds + 10))s" --db "$tmp/sustain.db" ${TRACE_ARGS:-}
  peak=0; at_peak=""; cpu=0
  "$work" loop --calls "$calls" --rate "$rate" >"$tmp/work.out" &
  wl=$!
  while kill -0 "$tracer_pid" 2>/dev/null; do
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$tracer_pid/status" 2>/dev/null || echo 0)
    if [[ -n $hwm && $hwm -gt $peak ]]; then
      peak=$hwm
      at_peak=$(awk '/RssAnon|RssFile/ {printf "%s %d MiB  ", $1, $2 / 1024}' "/proc/$tracer_pid/status" 2>/dev/null)
    fi
    # utime + stime of the whole tracer (all threads), in clock ticks
    c=$(awk '{print $14 + $15}' "/proc/$tracer_pid/stat" 2>/dev/null || true)
    [[ -n $c ]] && cpu=$c
    sleep 0.5
  done
  wait "$wl" || true
  wait "$tracer_pid" || true
  echo "workload: $(cat "$tmp/work.out")"
  grep -E "^(trace|db):" "$tmp/trace.err"
  echo "tracer peak RSS (VmHWM): $((peak / 1024)) MiB (target <= 64); last sample at the peak: $at_peak"
  echo "  (each BPF ring counts twice its --ring-mb in RssFile: the kernel maps ring data twice)"
  echo "tracer CPU: $(awk -v c="$cpu" -v t="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", c / t}') s"
  echo "events in the database: $(sqlite3 "$tmp/sustain.db" 'select count(*) from events')"
  echo "indexes in the database: $(sqlite3 "$tmp/sustain.db" "select count(*) from sqlite_master where type = 'index' and tbl_name = 'events'")"
  echo "chains: $(sqlite3 "$tmp/sustain.db" "select count(*) from causal_chains")"
  sqlite3 "$tmp/sustain.db" "select '  [' || severity || '] ' || summary from causal_chains"
else
  echo "usage: $0 overhead|stacks|bpfstats|sustain [BUILD_DIR] ..." >&2
  exit 2
fi
