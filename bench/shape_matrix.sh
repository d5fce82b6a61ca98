#!/usr/bin/env bash
# The shape matrix of issue 43 ("speed on any shape"; docs/performance.md): for each trace shape,
# generate it (bench/make_shape_trace.sh), then measure, in this order and on the same file:
#   - bench --threads 1: the run phase (replayed from memory) on one thread: wall and CPU seconds
#     (on a shared machine the CPU figure is the one to read), its peak RSS, bench's end to end;
#   - bench --threads 2 --scaling R: two threads against one thread and against the capacity of
#     the machine, measured in the same rounds (medians of R rounds; docs/cli.md, bench);
#   - bench --threads 0: the run phase at the thread count the engine picks itself (docs/engine.md,
#     "Threads: how a run is split"), and which count it picked;
#   - explain --db FILE --quiet, as a user runs it (no --threads: the automatic count): wall, CPU,
#     peak RSS (/usr/bin/time);
#   - SQLite's own scan of the same rows (sqlite3 CLI, one thread, no output): every column
#     `explain` reads, every row, through Ingero's timestamp index (the time order the reader
#     delivers), and through the table alone. The "end to end <= 1.5x" target is against the
#     time-order scan.
# The scans and explain alternate (scan, explain, table scan, ...) REPEAT times; medians (peak RSS:
# the largest) are reported, so a noisy moment of a shared machine does not land on one side only.
#
#   bench/shape_matrix.sh [-b BIN] [-n EVENTS] [-r ROUNDS] [-k REPEAT] [-o OUT.jsonl] [-s SHAPE,...]
#                         [-d DIR] [--keep]
#
# -n: events per trace (default 5000000; 500000 for a quick look). -s: only these shapes (names
# below). -d: where the traces go (default /tmp; ~80 bytes of file a row). Each line of OUT.jsonl is
# one shape; the table on stdout is the same figures (markdown).
set -euo pipefail
bin=build/ingero-pipeline
n=5000000
rounds=3
repeat=3
out=/tmp/shape_matrix.jsonl
only=""
dir=/tmp
keep=0
while (($#)); do
  case $1 in
    -b) bin=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    -k) repeat=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -s) only=$2; shift 2 ;;
    -d) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [-b BIN] [-n EVENTS] [-r ROUNDS] [-k REPEAT] [-o OUT.jsonl] [-s SHAPE,...] [-d DIR] [--keep]" >&2
       exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
[[ -x $bin ]] || { echo "shape_matrix.sh: no binary at $bin (build the ingero-pipeline target)" >&2; exit 2; }
command -v jq >/dev/null && command -v sqlite3 >/dev/null || { echo "shape_matrix.sh: needs jq and sqlite3" >&2; exit 2; }

# name procs threads ops offcpu_pct tail_permille span_s. One factor at a time around `base`, the
# shape issue 43 reported (8 processes x 4 feeding threads, 6 ops, 10 % off-CPU spans, 5 s), plus
# `classic`, close to bench/make_ingero_trace.sh's (12 x 4, 3 ops).
shapes=(
  "base 8 4 6 10 10 5"
  "classic 12 4 3 10 10 5"
  "procs1 1 4 6 10 10 5"
  "procs64 64 4 6 10 10 5"
  "procs256 256 4 6 10 10 5"
  "threads1 8 1 6 10 10 5"
  "threads16 8 16 6 10 10 5"
  "threads64 8 64 6 10 10 5"
  "ops2 8 4 2 10 10 5"
  "ops20 8 4 20 10 10 5"
  "offcpu0 8 4 6 0 10 5"
  "offcpu30 8 4 6 30 10 5"
  "tail1 8 4 6 10 1 5"
  "tail50 8 4 6 10 50 5"
  "windows10 8 4 6 10 10 100"
  "windows100 8 4 6 10 10 1000"
)

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# SQLite's own scan of the same rows: one aggregate over every column `explain` reads, every row,
# through Ingero's timestamp index (the time order the reader delivers: each row looked up in the
# table) or the table alone; no output, so the CLI's printing costs nothing.
scan_sum='max("timestamp" + pid + tid + source + op + duration + gpu_id + arg0 + arg1 + ret_code + stack_hash + id)'
# Prints "wall cpu" seconds.
scan_time() {
  local db=$1 how=$2 tf w u sy
  tf=$(mktemp)
  /usr/bin/time -f '%e %U %S' -o "$tf" sqlite3 -readonly "$db" "SELECT $scan_sum FROM events $how" >/dev/null
  read -r w u sy <"$tf"
  rm -f "$tf"
  echo "$w $(echo "$u + $sy" | bc -l)"
}

: >"$out"
printf '| shape | P x T, ops, off-CPU %%, tail permille, span s | run 1 thr: M ev/CPU-s (wall M ev/s) | 2 thr / 1 thr (scaling rounds) | capacity | efficiency | auto: thr, wall vs 1 thr | explain s (CPU s) | SQLite scan, time order s (CPU s) | explain / scan, wall (CPU) | explain peak RSS MB | chains | load |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for s in "${shapes[@]}"; do
  read -r name p t k off tail span <<<"$s"
  if [[ -n $only && ",$only," != *",$name,"* ]]; then continue; fi
  db=$dir/shape_${name}_${n}.db
  [[ -f $db ]] || bash "$here/make_shape_trace.sh" "$db" "$n" "$p" "$t" "$k" "$off" "$tail" "$span" >/dev/null
  load=$(cut -d' ' -f1 /proc/loadavg)
  oj=$("$bin" bench --trace "$db" --json -q --no-per-rule --threads 1)
  bj=$("$bin" bench --trace "$db" --json -q --no-per-rule --threads 2 --scaling "$rounds")
  aj=$("$bin" bench --trace "$db" --json -q --no-per-rule --threads 0 2>/dev/null ||
    echo '{"run_seconds": 0, "run_cpu_seconds": 0, "chains": -1}')
  ex=() sc=() sccpu=() st=() rss=() excpu=()
  for ((i = 0; i < repeat; i++)); do
    read -r w c <<<"$(scan_time "$db" 'INDEXED BY idx_events_timestamp')"
    sc+=("$w") sccpu+=("$c")
    tf=$(mktemp)
    /usr/bin/time -f '%e %U %S %M' -o "$tf" "$bin" explain --db "$db" --quiet >/dev/null
    read -r e u sy m <"$tf"
    rm -f "$tf"
    ex+=("$e") rss+=("$m") excpu+=("$(echo "$u + $sy" | bc -l)")
    read -r w c <<<"$(scan_time "$db" 'NOT INDEXED')"
    st+=("$w")
  done
  ex_m=$(printf '%s\n' "${ex[@]}" | median)
  sc_m=$(printf '%s\n' "${sc[@]}" | median)
  sccpu_m=$(printf '%s\n' "${sccpu[@]}" | median)
  st_m=$(printf '%s\n' "${st[@]}" | median)
  rss_m=$(printf '%s\n' "${rss[@]}" | sort -g | tail -1)
  cpu_m=$(printf '%s\n' "${excpu[@]}" | median)
  line=$(jq -c -n --arg name "$name" --argjson p "$p" --argjson t "$t" --argjson k "$k" --argjson off "$off" \
    --argjson tail "$tail" --argjson span "$span" --argjson events "$n" --argjson o "$oj" --argjson b "$bj" --argjson a "$aj" \
    --argjson ex "$ex_m" --argjson excpu "$cpu_m" --argjson sc "$sc_m" --argjson sccpu "$sccpu_m" --argjson st "$st_m" --argjson rss "$rss_m" \
    --argjson load "$load" \
    '{shape: $name, procs: $p, threads_per_proc: $t, ops: $k, offcpu_pct: $off, tail_permille: $tail, span_s: $span,
      events: $events, load_before: $load,
      run1_s: $o.run_seconds, run1_cpu_s: $o.run_cpu_seconds, run1_peak_rss_bytes: $o.phases.run.peak_rss_bytes,
      bench_end_to_end_s: $o.end_to_end_seconds, bench_end_to_end_cpu_s: $o.end_to_end_cpu_seconds,
      run_one_thread_s: $b.scaling.median.one_thread_seconds, run_two_threads_s: $b.scaling.median.engine_seconds,
      speedup: $b.scaling.median.speedup, capacity: $b.scaling.median.capacity,
      efficiency: $b.scaling.median.efficiency,
      run_auto_s: $a.run_seconds, run_auto_cpu_s: $a.run_cpu_seconds, auto_threads: $a.engine_threads,
      chains: $o.chains, chains_two: $b.chains, chains_auto: $a.chains,
      explain_s: $ex, explain_cpu_s: $excpu, explain_peak_rss_kb: $rss, scan_time_order_s: $sc, scan_cpu_s: $sccpu, scan_table_order_s: $st}')
  echo "$line" >>"$out"
  jq -r 'def r2: . * 100 | round / 100; def r1: . * 10 | round / 10;
    "| \(.shape) | \(.procs) x \(.threads_per_proc), \(.ops), \(.offcpu_pct), \(.tail_permille), \(.span_s) | \(.events / .run1_cpu_s / 1e6 | r1) (\(.events / .run1_s / 1e6 | r1)) | \(.speedup | r2) | \(.capacity | r2) | \(.efficiency | r2) | \(.auto_threads), \(if .run_auto_s > 0 then (.run1_s / .run_auto_s | r2) else "-" end) | \(.explain_s | r2) (\(.explain_cpu_s | r2)) | \(.scan_time_order_s | r2) (\(.scan_cpu_s | r2)) | \(.explain_s / .scan_time_order_s | r2) (\(.explain_cpu_s / .scan_cpu_s | r2)) | \(.explain_peak_rss_kb / 1024 | round) | \(.chains) | \(.load_before) |"' <<<"$line"
  ((keep)) || rm -f "$db"
done
