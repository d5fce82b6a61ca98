# Calls the real CUDA runtime (libcudart, no GPU needed: the calls fail fast but the uprobes fire)
# through ctypes from known file:function:line sites, for the live stack tests
# (tests/bpf/live_stacks_test.cpp). The test finds the lines by their "SITE:" markers, so edit
# freely but keep one marker per site.
#
# Usage: python cuda_stacks.py LIBCUDART MODE [N]
#   MODE main     two calls on the main thread, two on a threading.Thread
#   MODE recurse  one call at the bottom of an N-deep Python recursion (default 200)
#   MODE exit     two calls on the main thread, then os._exit(0) at once
#   MODE block    one call, then the main thread waits 0.3 s on a threading.Event (a futex)
#   MODE busy     N rounds (default 20) of 50 calls then ~30 ms of pure-Python work in spin()
#   MODE paced    step() every 2 ms on the main thread and on a threading.Thread started first,
#                 for N seconds (default 4) or until SIGUSR1 (a job a tracer attaches to while it runs)
#   MODE phases   N rounds (default 3) of 1 s of cudaLaunchKernel calls then 1 s in spin(): the
#                 launching thread stops launching because it is busy on CPU in Python
# Protocol: prints "ready" and waits for a line on stdin before calling; prints "tid <main> <worker>"
# at the end.
import ctypes
import os
import signal
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1])
mode = sys.argv[2]
arg = int(sys.argv[3]) if len(sys.argv) > 3 else 0


def launch():
    return lib.cudaDeviceSynchronize()  # SITE:launch


def step():
    return launch()  # SITE:step


def worker_body():
    step()  # SITE:worker
    step()  # SITE:worker2


def launch_kernel():
    f = lib.cudaLaunchKernel
    f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                  ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return f(None, 1, 1, 1, 1, None, 0, None)  # SITE:kernel


def recurse(n):
    if n == 0:
        return launch()  # SITE:bottom
    return recurse(n - 1)  # SITE:recurse


def spin(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end: x += 1  # SITE:spin  (one line: every sample lands on it)
    return x


def run():
    worker_tid = 0
    if mode == "main":
        step()  # SITE:main1
        step()  # SITE:main2
        t = threading.Thread(target=worker_body)
        t.start()
        worker_tid = t.native_id if hasattr(t, "native_id") else 0
        t.join()
    elif mode == "recurse":
        recurse(arg or 200)
    elif mode == "exit":
        step()  # SITE:exit1
        step()  # SITE:exit2
        os._exit(0)
    elif mode == "block":
        step()  # SITE:block
        threading.Event().wait(0.3)  # SITE:wait
    elif mode == "busy":
        for _ in range(arg or 20):
            for _ in range(50):
                launch()
            spin(0.03)  # SITE:busy
    elif mode == "paced":
        end = time.perf_counter() + (arg or 4)
        stop = threading.Event()
        signal.signal(signal.SIGUSR1, lambda *_: stop.set())

        def pace():
            while time.perf_counter() < end and not stop.is_set():
                step()  # SITE:paced
                time.sleep(0.002)
        t = threading.Thread(target=pace)
        t.start()
        worker_tid = t.native_id if hasattr(t, "native_id") else 0
        pace()
        t.join()
    elif mode == "phases":
        for _ in range(arg or 3):
            end = time.perf_counter() + 1.0
            while time.perf_counter() < end:
                launch_kernel()
            spin(1.0)  # SITE:phase_spin
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            launch_kernel()
    return worker_tid


print("ready", flush=True)
sys.stdin.readline()
wtid = run()  # SITE:module
print("tid %d %d" % (threading.get_native_id(), wtid), flush=True)
