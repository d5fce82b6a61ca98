# A training loop in miniature for tests/bpf/time_findings_test.cpp: a loader thread makes batches
# and puts them in a queue.Queue; the feeding (main) thread takes one per step (next_batch(), a
# futex wait in queue.get while the queue is empty), makes 21 CUDA runtime calls through ctypes on
# the real libcudart (no GPU needed: the calls fail fast, the uprobes fire), then does ~5 ms of
# host work on CPU (spin()). The main thread's code is the same in both modes; only the loader
# differs.
#
# Usage: python py_input_wait.py LIBCUDART MODE SECONDS
#   MODE starved  the loader needs 50 ms per batch (time.sleep): the feeding thread waits in
#                 next_batch() for ~45 ms of every ~50 ms step (~90 %)
#   MODE ready    the loader needs no time and keeps the queue full: next_batch() returns at once
#                 (batches always ready); steps are ~5 ms, on CPU
# Protocol: prints "ready" then "tid <feeding thread> <loader thread>", waits for a line on stdin,
# runs for SECONDS (or until SIGUSR1), then prints "steps <n> waited_ns <total ns in next_batch>
# from <unix ns> to <unix ns>" (when the loop started and ended).
import ctypes
import queue
import signal
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1])
mode = sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
if mode not in ("starved", "ready"):
    sys.exit("unknown mode " + mode)

launch = lib.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                   ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
memcpy_async = lib.cudaMemcpyAsync
memcpy_async.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
sync = lib.cudaStreamSynchronize
sync.argtypes = [ctypes.c_void_p]

stop = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: stop.set())
batches = queue.Queue(maxsize=4)


def make_batch(n):
    return [n] * 64


def loader():
    n = 0
    while not stop.is_set():
        if mode == "starved":
            time.sleep(0.05)  # reading and decoding the next batch
        batch = make_batch(n)
        while not stop.is_set():
            try:
                batches.put(batch, timeout=0.1)
                break
            except queue.Full:
                pass
        n += 1


def next_batch():
    return batches.get()  # the feeding thread waits here for input


def copy_in(batch):
    buf = ctypes.create_string_buffer(64)
    return memcpy_async(buf, buf, 64, 1, None)  # cudaMemcpyHostToDevice


def forward(batch):
    for _ in range(19):
        launch(None, 1, 1, 1, 1, None, 0, None)


def spin(s):
    end = time.perf_counter() + s
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def train(end):
    steps = waited = 0
    while time.perf_counter() < end and not stop.is_set():
        t0 = time.perf_counter_ns()
        batch = next_batch()
        waited += time.perf_counter_ns() - t0
        copy_in(batch)  # 1 call
        forward(batch)  # 19 calls
        sync(None)  # 1 call: 21 in all
        spin(0.005)  # host-side work of the step
        steps += 1
    return steps, waited


t = threading.Thread(target=loader, daemon=True)
t.start()
if mode == "ready":
    while batches.qsize() < 4:
        time.sleep(0.001)
print("ready", flush=True)
print("tid %d %d" % (threading.get_native_id(), t.native_id), flush=True)
sys.stdin.readline()
t0 = time.time_ns()
steps, waited = train(time.perf_counter() + seconds)
t1 = time.time_ns()
stop.set()
print("steps %d waited_ns %d from %d to %d" % (steps, waited, t0, t1), flush=True)
