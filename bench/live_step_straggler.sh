#!/usr/bin/env bash
# Live check of the per-step straggler signal (docs/fleet.md, "The per-step straggler signal on
# /metrics"): four "ranks" of a simulated synchronous job (Python + ctypes, 50 ms steps on a
# shared wall-clock schedule) call a stand-in libnccl's ncclAllReduce and a stand-in libcudart's
# cudaStreamSynchronize (which sleeps until the collective "completes": the last arrival + 2 ms).
# Rank 2 arrives 5 ms (10 % of a step) late from ONSET_S seconds on. `ingero-pipeline trace
# --metrics-addr` captures them live (eBPF uprobes on the stand-ins) and a real Prometheus (5 s
# scrape, the shipped rules) scrapes it. Prints when GpuStallStepStraggler fires, for which rank,
# the node's per-rank medians and lateness ratios, and any alert before the onset.
#
#   sudo bench/live_step_straggler.sh [BUILD_DIR=build] [ONSET_S=100]
#
# Needs root (eBPF), gcc, python3, prometheus, curl, bc. ~2.5 min (BPF loading can take a minute
# on a loaded machine, hence the late onset). Ports 19464 and 19090 on 127.0.0.1.
set -u
build=${1:-build}
onset_s=${2:-100}
bin=$(realpath "$build/ingero-pipeline")
rules=$(realpath "$(dirname "$0")/../prometheus/gpustall_fleet.rules.yml")
D=$(mktemp -d /tmp/live_step_straggler.XXXXXX)
trap 'rm -rf "$D"' EXIT
cd "$D"
cat > nccl.c <<'EOT'
#include <stddef.h>
volatile unsigned long sink;
__attribute__((noinline)) int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, void* comm, void* st) {
  sink += n + (unsigned long)comm; return 0; }
__attribute__((noinline)) int ncclCommInitRank(void** comm, int nranks, char id[128], int rank) {
  sink += nranks + rank; if (comm) *comm = (void*)0xabc; return 0; }
EOT
cat > cudart.c <<'EOT'
#include <stdint.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) int cudaStreamSynchronize(void* stream) {
  uint64_t us = (uint64_t)(uintptr_t)stream;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, 0); sink++; return 0; }
int cudaDeviceSynchronize(void) { return 0; }
EOT
mkdir -p lib && gcc -shared -fPIC -O1 -fno-inline -o lib/libnccl.so.2 nccl.c && gcc -shared -fPIC -O1 -fno-inline -o lib/libcudart.so.13 cudart.c || exit 1
cat > rank.py <<'EOT'
import ctypes, os, sys, time
cudart = ctypes.CDLL(sys.argv[1]); nccl = ctypes.CDLL(sys.argv[2])
rank = int(os.environ["RANK"]); late = int(os.environ["LATE"]); t0 = float(os.environ["T0"])
onset = float(os.environ["ONSET"]); end = float(os.environ["END"])
comm = ctypes.c_void_p(); uid = ctypes.create_string_buffer(128)
nccl.ncclCommInitRank(ctypes.byref(comm), 4, uid, rank)
k = max(0, int((time.time() - t0) / 0.05) + 1)
while True:
    st = t0 + k * 0.05
    if st > end: break
    lag = 0.005 if st >= onset else 0.0
    arrive = st + 0.020 + (lag if rank == late else 0.0)
    done = st + 0.020 + lag + 0.002
    d = arrive - time.time()
    if d > 0: time.sleep(d)
    nccl.ncclAllReduce(None, None, ctypes.c_size_t(1024), 7, 0, comm, None)
    cudart.cudaStreamSynchronize(ctypes.c_void_p(int(max(0.0, done - time.time()) * 1e6)))
    k += 1
EOT
now=$(date +%s.%N); ONSET=$(echo "$now + $onset_s" | bc); END=$(echo "$now + $onset_s + 50" | bc)
pids=""
for r in 0 1 2 3; do
  env RANK=$r WORLD_SIZE=4 LATE=2 T0="$now" ONSET="$ONSET" END="$END" python3 rank.py lib/libcudart.so.13 lib/libnccl.so.2 > "r$r.log" 2>&1 &
  pids="$pids $!"
done
sleep 0.5
args=""; for p in $pids; do args="$args --pid $p"; done
# shellcheck disable=SC2086
"$bin" trace $args --cuda-lib "$D/lib/libcudart.so.13" --cuda-lib "$D/lib/libnccl.so.2" --metrics-addr 127.0.0.1:19464 \
  --node live-0 --cluster lc --duration "$((onset_s + 60))s" --no-stacks --no-samples -q > trace.log 2>&1 &
tp=$!
cat > prom.yml <<EOT
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ['$rules']
scrape_configs:
  - job_name: live
    static_configs: [{targets: ['127.0.0.1:19464'], labels: {node: live-0, cluster: lc}}]
EOT
prometheus --config.file=prom.yml --storage.tsdb.path=tsdb --web.listen-address=127.0.0.1:19090 > prom.log 2>&1 &
pp=$!
alerts() {
  curl -s 'http://127.0.0.1:19090/api/v1/alerts' | python3 -c 'import json,sys
d=json.load(sys.stdin)
print(" ".join("rank "+a["labels"].get("rank","?")+" "+a["state"] for a in d["data"]["alerts"] if a["labels"]["alertname"]=="GpuStallStepStraggler"))' 2>/dev/null
}
seen=""
while [ "$(echo "$(date +%s.%N) < $END" | bc)" = 1 ]; do
  sleep 1
  a=$(alerts); t=$(echo "$(date +%s.%N) - $ONSET" | bc)
  [ -n "$a" ] && [ "$(echo "$t < 0" | bc)" = 1 ] && echo "ALERT BEFORE THE ONSET (t - onset = $t s): $a"
  if [ -n "$a" ] && [ -z "$seen" ]; then
    seen=1
    echo "t - onset = $t s: GpuStallStepStraggler firing in Prometheus: $a"
    curl -s 127.0.0.1:19464/metrics | grep -E '^gpustall_step_(wait_)?median'
    curl -s 'http://127.0.0.1:19090/api/v1/query?query=node_rank:gpustall_step_lateness:ratio' |
      python3 -c 'import json,sys; [print("lateness rank", r["metric"]["rank"], r["value"][1]) for r in json.load(sys.stdin)["data"]["result"]]'
  fi
done
kill "$pp"; kill -INT "$tp"; for p in $pids; do kill "$p" 2>/dev/null; done; wait "$tp"
tail -3 trace.log
[ -n "$seen" ] && echo "alert: seen" || { echo "alert: none"; exit 1; }
