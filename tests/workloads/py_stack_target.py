# Target for stacks_userspace_test: known Python stacks at known lines, on the main thread and on a
# threading.Thread, blocked in C (os.read / time.sleep) so a walker sees them stand still.
# The lines are found by the markers in the comments ("@name"); keep one marker per line.
# Non-ASCII function names exercise the compact non-ASCII str kinds 1 and 2.
import os
import sys
import threading
import time


def grüße_inner(fd):
    return os.read(fd, 1)  # @main_block


def outer(fd):
    data = grüße_inner(fd)  # @main_call
    return data


def wait_в_потоке(ready):
    ready.set()
    time.sleep(3600)  # @thread_block


class Worker:
    def body(self, ready):
        wait_в_потоке(ready)  # @thread_call


ready = threading.Event()
t = threading.Thread(target=Worker().body, args=(ready,), daemon=True)
t.start()
ready.wait()
print("ready", os.getpid(), t.native_id, flush=True)
outer(0)  # @module_call
