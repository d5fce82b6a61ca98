# Workload of annotate_live_test.cpp: a training loop that reports its steps the way Ingero's
# PyTorch Lightning callback does (one NDJSON line per batch start on the annotation socket:
# {"labels":{"epoch":"E","step":"N"},"pid":PID}, no ts), and makes a CUDA runtime call per step
# (libcudart through ctypes; no GPU needed, the call fails fast but the uprobes fire).
# Usage: python annotate_steps.py SOCKET LIBCUDART STEPS PERIOD_MS
# Protocol: prints "ready", waits for a line on stdin, connects, runs STEPS steps, exits.
import ctypes
import json
import os
import socket
import sys
import time

path, cudart, steps, period = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) / 1000.0
lib = ctypes.CDLL(cudart) if os.path.exists(cudart) else None
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.readline()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
start = time.monotonic()
for step in range(steps):
    epoch = step // 10
    # What the Lightning callback sends at on_train_batch_start (global_step, current_epoch).
    line = json.dumps({"labels": {"epoch": str(epoch), "step": str(step)}, "pid": os.getpid()},
                      separators=(",", ":"), sort_keys=True)
    s.sendall(line.encode() + b"\n")
    if lib is not None:
        lib.cudaDeviceSynchronize()
    # Sleep to the next step's start, so steps are PERIOD_MS apart whatever the call cost.
    time.sleep(max(0.0, start + (step + 1) * period - time.monotonic()))
s.sendall(b'{"labels":{"epoch":"9","phase":"epoch_end"}}\n')
s.close()
