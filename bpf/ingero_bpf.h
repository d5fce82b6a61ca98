/* Records and constants shared by the BPF programs (gpu.bpf.c, host.bpf.c) and the loader.
 *
 * Contract:
 * - Plain C, fixed-width fields, no padding holes: the kernel writes `struct ip_record` into a
 *   ring buffer and user space reads it back byte for byte.
 * - `ts` is CLOCK_MONOTONIC (bpf_ktime_get_ns) at the START of the interval; user space adds the
 *   realtime-monotonic offset measured at start to get unix ns.
 * - `source`/`op` are the engine's ids (engine/ops.h); the static_asserts in bpf/records.cpp keep
 *   both sides in step.
 */
#ifndef INGERO_BPF_H
#define INGERO_BPF_H

#ifdef __bpf__
/* vmlinux.h supplies __u64 and friends */
#else
#include <linux/types.h>
#endif

#define IP_MAX_DEPTH 8          /* nested/recursive probed calls tracked per thread */
#define IP_MAX_THREADS 32768    /* threads with open calls or off-CPU spans */
#define IP_MAX_TRACED 8192      /* traced processes */

/* Sources (engine/ops.h Source). */
#define IP_SRC_CUDA 1
#define IP_SRC_HOST 3
#define IP_SRC_DRIVER 4
#define IP_SRC_IO 5
#define IP_SRC_TCP 6
#define IP_SRC_NET 7
#define IP_SRC_GRAPH 8
#define IP_SRC_NCCL 9

/* Off-CPU states (engine/event.h OffCpuState). */
#define IP_STATE_PREEMPTED 1
#define IP_STATE_SLEEPING 2
#define IP_STATE_DISKWAIT 3
#define IP_STATE_OTHER 4

/* Process filter modes (rodata `filter_mode`). */
#define IP_FILTER_CUDA 0    /* processes that call a probed CUDA function are traced */
#define IP_FILTER_PIDS 1    /* seeded pids and their descendants */
#define IP_FILTER_CGROUP 2  /* processes in the cgroup (v2 id) and their descendants */

/* Rings: one per program family; overflow is counted per ring. */
#define IP_RING_GPU 0
#define IP_RING_HOST 1
#define IP_NUM_RINGS 2

/* Per-CPU counters (array map `counters`). */
#define IP_CNT_DROP_GPU 0       /* ring full: GPU record lost */
#define IP_CNT_DROP_HOST 1      /* ring full: host record lost */
#define IP_CNT_DEPTH 2          /* call nested deeper than IP_MAX_DEPTH: not timed */
#define IP_CNT_UNMATCHED 3      /* return without its entry (attached mid-call) */
#define IP_CNT_NO_SLOT 4        /* per-thread state map full */
#define IP_CNT_PAGE_BYTES 5     /* mm_page_alloc bytes (aggregated in the kernel) */
#define IP_CNT_PAGE_COUNT 6     /* mm_page_alloc calls */
#define IP_NUM_COUNTERS 8

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

/* record flags */
#define IP_REC_CLASSIC 1        /* produced by a classic (non-BTF) tracepoint */

struct ip_record {
  __u64 ts;       /* interval start, CLOCK_MONOTONIC ns */
  __u64 dur;      /* interval length, ns (0 for instants) */
  __u64 arg0;     /* op-specific, see docs/live-capture.md */
  __u64 arg1;
  __u64 arg2;
  __u64 cgroup;   /* cgroup v2 id of the task */
  __u32 pid;      /* tgid */
  __u32 tid;
  __s32 ret;      /* return code (CUDA error, -errno) */
  __u8 source;
  __u8 op;
  __u8 state;     /* off-CPU state for sched_switch spans */
  __u8 flags;
};

/* One open call on a thread's stack. */
struct ip_frame {
  __u64 ts;
  __u64 arg0, arg1, arg2;
  __u8 source, op;
  __u8 pad[6];
};

struct ip_call_stack {
  __u32 depth;    /* frames pushed, may exceed IP_MAX_DEPTH (those are not timed) */
  __u32 pad;
  struct ip_frame frames[IP_MAX_DEPTH];
};

/* An off-CPU span in progress: written at switch-out, closed at switch-in. */
struct ip_offcpu {
  __u64 ts;
  __u32 tgid;
  __u32 next_tid; /* the task that ran instead */
  __u8 state;
  __u8 pad[7];
};

#endif
