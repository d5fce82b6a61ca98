# Prints, for many real code objects of the running interpreter, the raw line table and the line
# CPython itself gives every instruction (from co_lines()), one JSON object per line, so the C++
# decoder (python_line) can be checked against the interpreter on every version.
import json
import sys
import threading
import json.decoder


def long_jumps(x):
    a = x

    # a gap of more than 127 lines follows, to force multi-entry / long-form deltas






























































































































































    b = a + 1
    return (a,
            b,
            [i
             for i in range(3)])


def codes_of(obj, seen):
    stack = [obj]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        yield c
        for k in c.co_consts:
            if hasattr(k, "co_code"):
                stack.append(k)


def roots():
    for mod in (threading, json.decoder, sys.modules[__name__]):
        for v in list(vars(mod).values()):
            if hasattr(v, "__code__"):
                yield v.__code__
            if isinstance(v, type):
                for m in vars(v).values():
                    if hasattr(m, "__code__"):
                        yield m.__code__


seen = set()
for root in roots():
    for c in codes_of(root, seen):
        n = len(c.co_code)
        lines = [0] * (n // 2)
        for start, end, line in c.co_lines():
            for b in range(start, min(end, n), 2):
                lines[b // 2] = line or 0
        print(json.dumps({"name": c.co_name, "first": c.co_firstlineno,
                          "table": c.co_linetable.hex(), "lines": lines}))
