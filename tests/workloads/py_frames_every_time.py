# Issue 43 item 2 ("Python frames every time"): a short process that calls the real CUDA runtime
# (libcudart through ctypes; no GPU needed: the calls fail fast but the uprobes fire) from known
# lines, on its main thread and on a threading.Thread, as soon as it starts. It is run many
# times under one `ingero-pipeline trace --stack-min 0` (tests/cli/py_frames_every_time_test.cpp):
# every call after the process's first must carry these Python frames, on both threads.
# The test finds the lines by their "SITE:" markers, so edit freely but keep one marker per site.
#
# Usage: python py_frames_every_time.py LIBCUDART [ROUNDS]
#   ROUNDS (default 3) rounds of cudaLaunchKernel + cudaStreamSynchronize on the main thread,
#   then the same on a worker thread, then once more on the main thread.
# Prints "pid <pid> main <tid> worker <tid>" at the end.
import ctypes
import sys
import threading

lib = ctypes.CDLL(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3

launch = lib.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                   ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
sync = lib.cudaStreamSynchronize
sync.argtypes = [ctypes.c_void_p]


def main_step():
    launch(None, 1, 1, 1, 1, None, 0, None)  # SITE:main_launch
    sync(None)  # SITE:main_sync


def worker_step():
    launch(None, 1, 1, 1, 1, None, 0, None)  # SITE:worker_launch
    sync(None)  # SITE:worker_sync


def worker():
    for _ in range(rounds):
        worker_step()  # SITE:worker_loop


for _ in range(rounds):
    main_step()  # SITE:main_loop
t = threading.Thread(target=worker)
t.start()
t.join()
main_step()  # SITE:main_after
print("pid", threading.get_native_id() if hasattr(threading, "get_native_id") else 0, "main",
      threading.get_native_id(), "worker", t.native_id, flush=True)
