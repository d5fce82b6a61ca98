# Workload of stacks_live_test.cpp: synchronising CUDA runtime calls (libcudart through ctypes; no
# GPU needed, the calls fail fast but the uprobes fire) issued from a known line of a function
# named like a training step. Usage: python step_syncs.py LIBCUDART N
# Protocol: prints "ready", waits for a line on stdin, makes N calls 2 ms apart, exits.
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])


def train_step():
    return lib.cudaDeviceSynchronize()  # SITE:sync


def main():
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    for _ in range(n):
        train_step()
        time.sleep(0.002)


main()
