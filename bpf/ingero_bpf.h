/* Records and constants shared by the BPF programs (gpu.bpf.c, host.bpf.c) and the loader.
 *
 * Contract:
 * - Plain C, fixed-width fields, no padding holes: the kernel writes `struct ip_record` into a
 *   ring buffer and user space reads it back byte for byte.
 * - `ts` is CLOCK_MONOTONIC (bpf_ktime_get_ns) at the START of the interval; user space adds the
 *   realtime-monotonic offset measured at start to get unix ns.
 * - `source`/`op` are the engine's ids (model/ops.h); the static_asserts in bpf/records.cpp keep
 *   both sides in step.
 */
#ifndef INGERO_BPF_H
#define INGERO_BPF_H

#ifdef __bpf__
/* vmlinux.h supplies __u64 and friends */
#else
#include <linux/types.h>
#endif

#define IP_MAX_DEPTH 8       /* nested/recursive probed calls tracked per thread */
#define IP_MAX_THREADS 32768 /* threads with open calls or off-CPU spans */
#define IP_MAX_TRACED 8192   /* traced processes */
#define IP_MAX_LIBS 16       /* libraries with uprobes: a link's cookie is its library's slot */

/* Sources (model/ops.h Source). */
#define IP_SRC_CUDA 1
#define IP_SRC_HOST 3
#define IP_SRC_DRIVER 4
#define IP_SRC_IO 5
#define IP_SRC_TCP 6
#define IP_SRC_NET 7
#define IP_SRC_GRAPH 8
#define IP_SRC_NCCL 9

/* Off-CPU states (model/event.h OffCpuState). */
#define IP_STATE_PREEMPTED 1
#define IP_STATE_SLEEPING 2
#define IP_STATE_DISKWAIT 3
#define IP_STATE_OTHER 4

/* Process filter modes (rodata `filter_mode`). */
#define IP_FILTER_CUDA 0   /* processes that call a probed CUDA function are traced */
#define IP_FILTER_PIDS 1   /* seeded pids and their descendants */
#define IP_FILTER_CGROUP 2 /* processes in the cgroup (v2 id) and their descendants */

/* Rings: one per program family, plus one for records that carry stacks (variable length);
 * overflow is counted per ring. */
#define IP_RING_GPU 0
#define IP_RING_HOST 1
#define IP_RING_STACK 2
#define IP_NUM_RINGS 3

/* Per-CPU counters (array map `counters`). */
#define IP_CNT_DROP_GPU 0   /* ring full: GPU record lost */
#define IP_CNT_DROP_HOST 1  /* ring full: host record lost */
#define IP_CNT_DEPTH 2      /* call nested deeper than IP_MAX_DEPTH: not timed */
#define IP_CNT_UNMATCHED 3  /* return without its entry (attached mid-call) */
#define IP_CNT_NO_SLOT 4    /* per-thread state map full */
#define IP_CNT_PAGE_BYTES 5 /* mm_page_alloc bytes (aggregated in the kernel) */
#define IP_CNT_PAGE_COUNT 6 /* mm_page_alloc calls */
#define IP_CNT_DROP_STACK 7 /* stack ring full: the event went out without its stack */
#define IP_CNT_STACKS 8     /* stack records emitted (slow calls, off-CPU spans, samples) */
#define IP_CNT_STACK_RATE 9 /* slow call over the threshold, stack skipped by the rate limit */
#define IP_CNT_PY_FAULT 10  /* a Python frame walk stopped on an unreadable pointer */
#define IP_CNT_PY_CODES 11  /* code objects interned (strings + line table read in BPF) */
#define IP_CNT_SAMPLES 12   /* CPU-clock samples of traced threads */
#define IP_CNT_PY_SELF 13   /* Python processes BPF registered itself at their first stack (py_bins) */
#define IP_NUM_COUNTERS 16

/* Per-library counters of probe hits (per-CPU array map `lib_counts`, index
 * slot * IP_LC_NUM + IP_LC_*), for the capture's self-check (docs/live-capture.md): every entry
 * of a traced process's call is either still open, lost (IP_LC_LOST), or paired with its return,
 * and every paired return is a record (or a counted ring drop). */
#define IP_LC_ENTER 0     /* entries (traced processes) */
#define IP_LC_RETURN 1    /* returns (traced processes) */
#define IP_LC_UNMATCHED 2 /* returns without their entry */
#define IP_LC_LOST 3      /* entries dropped without a return (the thread's call stack was full) */
#define IP_LC_DROP 4      /* paired calls whose record found the ring full */
#define IP_LC_NUM 5
/* Classic tracepoint fields whose offsets the loader reads from tracefs (host.bpf.c). */
#define IP_OFF_SW_PREV_PID 0
#define IP_OFF_SW_PREV_STATE 1
#define IP_OFF_SW_NEXT_PID 2
#define IP_OFF_WK_PID 3
#define IP_OFF_FORK_CHILD_PID 4
#define IP_OFF_EXEC_OLD_PID 5
#define IP_OFF_PA_ORDER 6
#define IP_OFF_BI_DEV 7
#define IP_OFF_BI_SECTOR 8
#define IP_OFF_BI_BYTES 9
#define IP_OFF_BI_RWBS 10
#define IP_OFF_BC_DEV 11
#define IP_OFF_BC_SECTOR 12
#define IP_OFF_BC_ERROR 13
#define IP_OFF_TCP_FAMILY 14
#define IP_OFF_TCP_DPORT 15
#define IP_OFF_TCP_DADDR 16
#define IP_OFF_TCP_DADDR6 17
#define IP_NUM_OFF 18

/* A host record that is not an event: the command name of a task that ran instead of a traced
 * thread (arg0..arg1 = comm, 16 bytes; arg2 = the task's start time, to tell a reused tid; pid/tid
 * = the task's). Sent once per task (and again when its tid is reused or it execs a new name). */
#define IP_OP_TASK_NAME 200

/* record flags */
#define IP_REC_CLASSIC 1  /* produced by a classic (non-BTF) tracepoint */
#define IP_REC_STACKIDS 2 /* off-CPU span: arg2 = stack_ids ids + 1 (kernel low, user high) */

struct ip_record {
  __u64 ts;   /* interval start, CLOCK_MONOTONIC ns */
  __u64 dur;  /* interval length, ns (0 for instants) */
  __u64 arg0; /* op-specific, see docs/live-capture.md */
  __u64 arg1;
  __u64 arg2;
  __u64 cgroup; /* cgroup v2 id of the task */
  __u32 pid;    /* tgid */
  __u32 tid;
  __s32 ret; /* return code (CUDA error, -errno) */
  __u8 source;
  __u8 op;
  __u8 state; /* off-CPU state for sched_switch spans; the library slot for probed calls */
  __u8 flags;
};

/* One open call on a thread's stack. */
struct ip_frame {
  __u64 ts;
  __u64 arg0, arg1, arg2;
  __u8 source, op;
  __u8 lib; /* the library's slot (the uprobe link's cookie) */
  __u8 pad[5];
};

/* A thread's open probed calls, and its share of the self-check: calls whose return or entry was
 * not seen (user space sums them per process). */
struct ip_call_stack {
  __u32 depth; /* open frames, at most IP_MAX_DEPTH */
  __u32 tgid;
  __u32 lost;      /* entries dropped because no return came (the stack filled up) */
  __u32 unmatched; /* returns without their entry: up to IP_MAX_DEPTH are calls open at attach */
  struct ip_frame frames[IP_MAX_DEPTH];
};

/* An off-CPU span in progress: written at switch-out, closed at switch-in. */
struct ip_offcpu {
  __u64 ts;
  __u32 tgid;
  __u32 next_tid; /* the task that ran instead */
  __u8 state;
  __u8 pad[3];
  __s32 kstack;    /* stack_ids id of the kernel stack at switch-out, <0 none */
  __s32 ustack;    /* stack_ids id of the frame-pointer user stack, <0 none */
  __u32 next_tgid; /* the process of the task that ran instead (0: unknown, classic tracepoint) */
};

/* ---- Stacks ------------------------------------------------------------------------------
 * A record that carries stacks is a `struct ip_stack_record` on the stack ring: the event itself
 * (same fields as on the other rings) followed by what was captured at the event. Only the first
 * `offsetof(ustack) + ustack_len` bytes are sent (bpf_ringbuf_output with a bounded length). */
#define IP_USTACK_MAX 28672  /* largest user-stack window (a per-CPU map value is <= 32 KiB) */
#define IP_FP_MAX 32         /* frame-pointer user stack (cross-check) */
#define IP_KSTACK_MAX 32     /* kernel stack (off-CPU spans) */
#define IP_PY_MAX 128        /* Python frames walked at most (power of two) */
#define IP_PY_FILE_MAX 256   /* bytes of co_filename kept */
#define IP_PY_NAME_MAX 128   /* bytes of co_qualname (co_name on 3.10) kept */
#define IP_PY_LINES_MAX 2048 /* bytes of co_linetable kept (power of two) */

/* kinds */
#define IP_STK_CALL 1   /* a slow probed call, captured at its return */
#define IP_STK_OFFCPU 2 /* an off-CPU span, captured at switch-out */
#define IP_STK_SAMPLE 3 /* an on-CPU sample (CPU clock) */

/* flags */
#define IP_STKF_USTACK_FULL 1  /* the copy filled the whole window: the stack goes on above it */
#define IP_STKF_PY 2           /* the process has validated Python offsets: a walk was done */
#define IP_STKF_PY_TRUNC 4     /* more Python frames than IP_PY_MAX */
#define IP_STKF_PY_NO_TSTATE 8 /* the thread has no Python thread state */
#define IP_STKF_PY_FAULT 16    /* the walk stopped on an unreadable pointer */
#define IP_STKF_KSTACK 32      /* kern[] holds the kernel stack */
#define IP_STKF_USER_REGS 64   /* ip/sp/bp are valid user registers */

struct ip_py_frame {
  __u64 code;  /* PyCodeObject*; (tgid, code) keys py_codes */
  __u32 lasti; /* byte offset of the executing instruction in the bytecode */
  __u32 pad;
};

struct ip_stack_record {
  struct ip_record rec;
  __u64 ip, sp, bp; /* user registers at the capture point */
  __u32 kind;       /* IP_STK_* */
  __u32 flags;      /* IP_STKF_* */
  __u16 n_fp, n_kern, n_py, pad16;
  __u32 ustack_len; /* valid bytes of ustack, copied from sp upward */
  char comm[16];    /* the thread's name (threads may be gone when user space reads) */
  __u32 pad32;
  __u64 fp[IP_FP_MAX];              /* bpf_get_stack(BPF_F_USER_STACK), innermost first */
  __u64 kern[IP_KSTACK_MAX];        /* kernel stack, innermost first */
  struct ip_py_frame py[IP_PY_MAX]; /* innermost first */
  __u8 ustack[IP_USTACK_MAX];
};

/* Per traced Python process (map py_procs, tgid -> this): filled by user space from a validated
 * inspect_python(); a process without an entry gets native stacks only. */
struct ip_py_proc {
  __u64 runtime;      /* absolute address of _PyRuntime */
  __u32 minor;        /* 10..13 */
  __u32 key_off;      /* _PyRuntime -> int autoTSSkey */
  __u32 tss_base;     /* fsbase -> glibc specific_1stblock */
  __u32 tstate_frame; /* 3.10 frame, 3.11/12 cframe, 3.13 current_frame */
  __s32 cframe_frame; /* cframe -> current_frame, -1 when no cframe */
  __u32 frame_code, frame_back, frame_instr;
  __s32 frame_owner; /* -1: none (3.10) */
  __u32 code_filename, code_name, code_firstlineno, code_linetable, code_bytecode;
  __u32 str_state, str_ascii_data, str_compact_data;
  __u32 bytes_size, bytes_data;
};

/* An interpreter executable user space has read (map py_bins; key: mm->exe_file's inode number and
 * size): lets BPF find and check _PyRuntime in a process of it at the process's first stack, before
 * user space has seen the process (pyintrospect.h PyBinary). */
struct ip_py_bin_key {
  __u64 ino;
  __u64 size;
};

struct ip_py_bin {
  struct ip_py_proc layout; /* runtime = 0: found per process */
  __u64 text_vaddr;         /* mm->start_code - text_vaddr = the executable's load bias */
  __u64 got_vaddr;          /* shared libpython: GOT slot of Py_BytesMain (exe vaddr); 0: static */
  __s64 runtime_off;        /* static: _PyRuntime's vaddr; shared: _PyRuntime - Py_BytesMain */
  __u32 interp_head;        /* _PyRuntime -> interpreters.head */
  __u32 tstate_interp;      /* tstate -> interp */
};

struct ip_py_code_key {
  __u32 tgid;
  __u32 pad;
  __u64 code;
};

/* A code object's strings and line table, read in BPF the first time a walk meets it, so a
 * process that exits right after still resolves (map py_codes, LRU). */
struct ip_py_code {
  __s32 firstlineno;
  __u32 linetable_len;       /* bytes valid in linetable */
  __u16 file_len, name_len;  /* bytes valid in file/name (raw str data) */
  __u8 file_kind, name_kind; /* 1/2/4 bytes per character (1 for ASCII) */
  __u8 pad[2];
  char file[IP_PY_FILE_MAX];
  char name[IP_PY_NAME_MAX];
  __u8 linetable[IP_PY_LINES_MAX];
};

#endif
