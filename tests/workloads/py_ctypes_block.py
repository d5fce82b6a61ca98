# Target for stacks_userspace_test: a Python call into C through ctypes (libffi), two levels deep,
# that blocks in libc read() with the GIL released, so a test can stop the thread and unwind its
# native stack through libffi, _ctypes and the interpreter. Lines are found by the "@" markers.
import ctypes
import ctypes.util
import os

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def call_read(fd):
    buf = ctypes.create_string_buffer(1)
    return libc.read(fd, buf, 1)  # @ctypes_block


def level2(fd):
    return call_read(fd)  # @ctypes_call


print("ready", os.getpid(), flush=True)
level2(0)  # @ctypes_module
