/* Kernel tracepoints: off-CPU spans (sched_switch), wakeups, process lifecycle, page allocation
 * (aggregated in the kernel), block I/O requests, TCP retransmits and socket send/recv syscalls.
 *
 * Each tracepoint has a tp_btf program (typed arguments, CO-RE reads) and a classic fallback for
 * kernels without BTF for it; the loader enables one of the two. sched_switch and friends are
 * filtered in the kernel to every thread of the traced processes (traced_tgids is keyed by tgid,
 * so worker threads are followed, not only the main thread). */
#include "stack.bpf.h"

/* Blocked (not preempted) off-CPU spans at least this long carry the kernel and frame-pointer user
 * stacks taken at switch-out (ids into stack_ids, in arg2); ~0 = no off-CPU stacks (nothing
 * captured at all). */
const volatile __u64 offcpu_stack_min_ns = ~0ULL;
/* Set by the loader when offcpu_sys_exit (or its fallback btf_sys_exit) is loaded: a long blocked
 * span of a thread that slept in a syscall is held (offcpu_done) until that syscall returns, and
 * sent from there with the thread's full user stacks (window + Python frames), which are still
 * those of the blocking call. A span whose syscall has no exit program (not on the loader's list)
 * or that blocked outside a syscall (a page fault) is flushed with its switch-out stacks at the
 * thread's next switch-out or exit. */
const volatile bool offcpu_user_at_exit = false;

/* Which families emit records (the programs of a disabled family are not even loaded; process
 * tracking programs always load because fork-following and cleanup depend on them). */
const volatile bool emit_process = true;
const volatile __u32 page_size = 4096;

/* Classic tracepoint field offsets, read by the loader from tracefs `format` files (layouts differ
 * between kernels, and a kernel without BTF cannot relocate CO-RE reads). Index: IP_OFF_*. */
const volatile __u32 classic_off[IP_NUM_OFF] = {};

static __always_inline __u64 field(void* ctx, int idx, int size) {
  __u64 v = 0;
  bpf_probe_read_kernel(&v, size, (char*)ctx + classic_off[idx]);
  return v;
}

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4 << 20);
} host_events SEC(".maps");

/* tid -> off-CPU span in progress. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, IP_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct ip_offcpu);
} offcpu SEC(".maps");

/* tid -> a long blocked off-CPU span that ended, waiting for its thread's syscall return to be
 * sent with the user stacks (offcpu_user_at_exit). Starts with ts like the maps below. Every
 * insert adds one to held_spans, every successful delete takes one off (see offcpu_sys_exit). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, IP_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct ip_record);
} offcpu_done SEC(".maps");

/* An upper bound of the entries in offcpu_done (more only after an LRU eviction, which no
 * delete reports): 0 lets the sys_exit programs return after one load, without a map lookup. */
__u64 held_spans = 0;

/* Every open-interval value starts with its entry timestamp: user space scans them all the same
 * way to hold the watermark (probes.cpp oldest_open). */
struct blk_start {
  __u64 ts;
  __u64 bytes;
  __u32 pid, tid;
  __u8 op;
  __u8 pad[7];
};

/* request -> issue (tp_btf keys by the request pointer, classic by dev << 48 ^ sector). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64);
  __type(value, struct blk_start);
} blk_reqs SEC(".maps");

struct net_start {
  __u64 ts;
  __u64 fd;
  __u8 op;
  __u8 pad[7];
};

/* tid -> socket syscall in progress. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, IP_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct net_start);
} net_calls SEC(".maps");

/* Records are submitted with BPF_RB_NO_WAKEUP: the poller drains on a timer (gpu.bpf.c says why). */
static __always_inline struct ip_record* reserve(void) {
  struct ip_record* r = bpf_ringbuf_reserve(&host_events, sizeof(struct ip_record), 0);
  if (!r) {
    count(IP_CNT_DROP_HOST, 1);
    return 0;
  }
  __builtin_memset(r, 0, sizeof(*r));
  return r;
}

static __always_inline __u64 task_cgroup(struct task_struct* t) {
  return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

static __always_inline int task_traced(struct task_struct* t) {
  __u32 tgid = BPF_CORE_READ(t, tgid);
  if (tgid_traced(tgid)) return 1;
  if (filter_mode == IP_FILTER_CGROUP && task_cgroup(t) == target_cgroup) {
    trace_tgid(tgid);
    return 1;
  }
  return 0;
}

static __always_inline int current_traced(void) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (tgid_traced(tgid)) return 1;
  if (filter_mode == IP_FILTER_CGROUP && bpf_get_current_cgroup_id() == target_cgroup) {
    trace_tgid(tgid);
    return 1;
  }
  return 0;
}

/* ---- sched_switch: off-CPU spans ---------------------------------------------------------- */

/* Ends a held span (sent or flushed): the entry goes, and held_spans with it. */
static __always_inline void release_done(__u32 tid) {
  if (bpf_map_delete_elem(&offcpu_done, &tid) == 0) __sync_fetch_and_add(&held_spans, -1);
}

/* A held span (offcpu_done) goes out as a plain record: its thread blocked again or exited
 * before a syscall return gave its user stacks. */
static __always_inline void flush_done(__u32 tid) {
  struct ip_record* d = bpf_map_lookup_elem(&offcpu_done, &tid);
  if (!d) return;
  struct ip_record* r = reserve();
  if (r) {
    __builtin_memcpy(r, d, sizeof(*r));
    bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  }
  release_done(tid);
}

static __always_inline void switch_out(void* ctx, __u32 tgid, __u32 tid, __u32 next_tid,
                                       __u32 next_tgid, __u8 state, __u64 now) {
  if (offcpu_user_at_exit) flush_done(tid);
  struct ip_offcpu o = {.ts = now, .tgid = tgid, .next_tid = next_tid, .state = state,
                        .kstack = -1, .ustack = -1, .next_tgid = next_tgid};
  if (offcpu_stack_min_ns != ~0ULL && state != IP_STATE_PREEMPTED) {
    /* Runs in the context of the thread going off CPU: these are its stacks. Only for a thread
     * that blocks (sleep, disk wait): a preempted thread did not choose to wait, so where it was
     * is the sampler's business, and contention (many preemptions) would make this costly. */
    o.kstack = bpf_get_stackid(ctx, &stack_ids, 0);
    o.ustack = bpf_get_stackid(ctx, &stack_ids, BPF_F_USER_STACK);
  }
  if (bpf_map_update_elem(&offcpu, &tid, &o, BPF_ANY) != 0) count(IP_CNT_NO_SLOT, 1);
}

static __always_inline void switch_in(__u32 tid, __u64 now, __u8 flags) {
  struct ip_offcpu* o = bpf_map_lookup_elem(&offcpu, &tid);
  if (!o) return; /* not traced, or traced only since it went off CPU */
  struct ip_record rec = {};
  rec.ts = o->ts;
  rec.dur = now - o->ts;
  rec.arg0 = o->next_tgid;
  rec.arg1 = o->next_tid;
  rec.pid = o->tgid;
  rec.tid = tid;
  rec.source = IP_SRC_HOST;
  rec.op = 1; /* sched_switch */
  rec.state = o->state;
  rec.flags = flags;
  int hold = 0;
  if (rec.dur >= offcpu_stack_min_ns && (o->kstack >= 0 || o->ustack >= 0)) {
    /* ids + 1 (0 = none): kernel stack in the low half, user stack in the high half */
    rec.arg2 = (__u64)(__u32)(o->kstack + 1) | ((__u64)(__u32)(o->ustack + 1) << 32);
    rec.flags |= IP_REC_STACKIDS;
    hold = offcpu_user_at_exit;
  }
  /* Counted before the insert, so a sys_exit program cannot see the entry with the count still 0.
   * NOEXIST: a span already held for this thread (none should be: switch_out flushes it) is
   * never overwritten uncounted; this one then goes out without user stacks. */
  if (hold) {
    __sync_fetch_and_add(&held_spans, 1);
    if (bpf_map_update_elem(&offcpu_done, &tid, &rec, BPF_NOEXIST) == 0) {
      bpf_map_delete_elem(&offcpu, &tid);
      return;
    }
    __sync_fetch_and_add(&held_spans, -1);
  }
  struct ip_record* r = reserve();
  if (r) {
    __builtin_memcpy(r, &rec, sizeof(rec));
    bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  }
  bpf_map_delete_elem(&offcpu, &tid);
}

/* The thread is back from the syscall it blocked in: its user registers and stack are still
 * those of the blocking call. Send the held span with them (ip/sp/bp: the user registers). */
static __always_inline int send_held(void* ctx, __u64 ip, __u64 sp, __u64 bp) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tid = (__u32)id;
  struct ip_record* d = bpf_map_lookup_elem(&offcpu_done, &tid);
  if (!d) return 0;
  struct ip_stack_record* s = stack_scratch_get();
  if (s) {
    stack_record_init(s, IP_STK_OFFCPU);
    __builtin_memcpy(&s->rec, d, sizeof(s->rec));
    capture_user(ctx, s, ip, sp, bp, id >> 32);
    if (stack_submit(s) == 0) {
      release_done(tid);
      return 0;
    }
  }
  flush_done(tid); /* stack ring full: the span without its user stacks */
  return 0;
}

/* The return of the syscalls a thread blocks in (the loader attaches this one program to
 * tracepoint/syscalls/sys_exit_<name> for each name of its list that tracefs has).
 *
 * Cost: why not one machine-wide sys_exit. Since Linux 6.11 the uretprobe return trampoline is a
 * syscall (sys_uretprobe), so a program on raw sys_exit (tp_btf) runs once per probed CUDA call
 * (measured 60-80 ns per call even when it returns at once). The classic per-syscall tracepoints
 * are dispatched by the ftrace syscall layer, which tests a per-syscall bitmap first: a syscall
 * not on the list, sys_uretprobe included, runs no program at all.
 *
 * held_spans first: spans are held only between a long block's switch-in and its syscall return
 * (microseconds), so nearly every run (a read or write that did not block) returns after one
 * load, before the per-thread map lookup. The user registers come from the current task (the
 * tracepoint's context is the trace entry, not pt_regs). */
SEC("tracepoint/syscalls/sys_exit_futex")
int offcpu_sys_exit(struct trace_event_raw_sys_exit* ctx) {
  if (!*(volatile __u64*)&held_spans) return 0;
  struct pt_regs* regs = (struct pt_regs*)bpf_task_pt_regs(bpf_get_current_task_btf());
  return send_held(ctx, BPF_CORE_READ(regs, ip), BPF_CORE_READ(regs, sp),
                   BPF_CORE_READ(regs, bp));
}

/* Fallback for kernels whose tracefs has none of the per-syscall exit tracepoints: every
 * syscall's return, sys_uretprobe's included (the per-call cost above). */
SEC("tp_btf/sys_exit")
int BPF_PROG(btf_sys_exit, struct pt_regs* regs, long ret) {
  if (!*(volatile __u64*)&held_spans) return 0;
  return send_held(ctx, BPF_CORE_READ(regs, ip), BPF_CORE_READ(regs, sp),
                   BPF_CORE_READ(regs, bp));
}

/* TASK_RUNNING at switch-out (or an explicit preemption) means the thread wanted the CPU. */
static __always_inline __u8 offcpu_state(bool preempt, __u64 st) {
  if (preempt || st == 0) return IP_STATE_PREEMPTED;
  if (st & 0x0001) return IP_STATE_SLEEPING;  /* TASK_INTERRUPTIBLE */
  if (st & 0x0002) return IP_STATE_DISKWAIT;  /* TASK_UNINTERRUPTIBLE (TASK_IDLE included) */
  return IP_STATE_OTHER;
}

/* Tasks whose command name user space has: tid -> the task's start time (a reused tid, or a task
 * that exec()ed, is named again). Bounded: an evicted task is named again when next seen. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u32);
  __type(value, __u64);
} named_tasks SEC(".maps");

/* The task that runs instead of a traced thread is named, even when it never touches the GPU (a
 * CPU hog pinned to the feeding thread's core): its pid alone may be reused or gone by the time
 * anyone asks. One small record per task, not per switch. */
static __always_inline void name_task(struct task_struct* t, __u64 now) {
  __u32 tid = t->pid;
  if (tid == 0) return; /* the idle task */
  __u64 start = t->start_time;
  /* An exec changes the name, not the start time: mix in the first bytes of the name. */
  __u64 head = 0;
  bpf_probe_read_kernel(&head, sizeof(head), t->comm);
  __u64 key = start ^ head;
  __u64* seen = bpf_map_lookup_elem(&named_tasks, &tid);
  if (seen && *seen == key) return;
  struct ip_record* r = reserve();
  if (!r) return;
  r->ts = now;
  r->pid = t->tgid;
  r->tid = tid;
  r->source = IP_SRC_HOST;
  r->op = IP_OP_TASK_NAME;
  bpf_probe_read_kernel(&r->arg0, 16, t->comm); /* arg0..arg1: 16 bytes */
  r->arg2 = start;
  bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  bpf_map_update_elem(&named_tasks, &tid, &key, BPF_ANY);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_sched_switch, bool preempt, struct task_struct* prev, struct task_struct* next,
             unsigned int prev_state) {
  __u64 now = bpf_ktime_get_ns();
  if (task_traced(prev)) {
    switch_out(ctx, prev->tgid, prev->pid, next->pid, next->tgid, offcpu_state(preempt, prev_state),
               now);
    name_task(next, now);
  }
  switch_in(next->pid, now, 0);
  return 0;
}

SEC("tracepoint/sched/sched_switch")
int tp_sched_switch(void* ctx) {
  __u64 now = bpf_ktime_get_ns();
  /* The tracepoint runs in the context of `prev`, so current gives its tgid. */
  if (current_traced()) {
    /* Classic prev_state: TASK_REPORT_MAX (0x100 and up) marks a preemption; otherwise the
     * reported state index as a bit (1 = S, 2 = D). */
    __u64 st = field(ctx, IP_OFF_SW_PREV_STATE, 8);
    __u8 s = (st & ~0xffULL) ? IP_STATE_PREEMPTED : offcpu_state(false, st & 0xff);
    switch_out(ctx, bpf_get_current_pid_tgid() >> 32, field(ctx, IP_OFF_SW_PREV_PID, 4),
               field(ctx, IP_OFF_SW_NEXT_PID, 4), 0, s, now);
  }
  switch_in(field(ctx, IP_OFF_SW_NEXT_PID, 4), now, IP_REC_CLASSIC);
  return 0;
}

/* ---- sched_wakeup ------------------------------------------------------------------------- */

static __always_inline void wakeup(__u32 tgid, __u32 tid, __u8 flags) {
  struct ip_record* r = reserve();
  if (!r) return;
  r->ts = bpf_ktime_get_ns();
  r->arg1 = (__u32)bpf_get_current_pid_tgid(); /* the waker */
  r->pid = tgid;
  r->tid = tid;
  r->source = IP_SRC_HOST;
  r->op = 2;
  r->flags = flags;
  bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(btf_sched_wakeup, struct task_struct* p) {
  if (task_traced(p)) wakeup(p->tgid, p->pid, 0);
  return 0;
}

SEC("tracepoint/sched/sched_wakeup")
int tp_sched_wakeup(void* ctx) {
  __u32 tid = field(ctx, IP_OFF_WK_PID, 4);
  /* No tgid in the classic record: only threads with an off-CPU span open are known traced. */
  struct ip_offcpu* o = bpf_map_lookup_elem(&offcpu, &tid);
  if (o) wakeup(o->tgid, tid, IP_REC_CLASSIC);
  return 0;
}

/* ---- process lifecycle -------------------------------------------------------------------- */

static __always_inline void proc_record(__u8 op, __u32 tgid, __u32 tid, __u64 a0, __u64 a1,
                                        __u8 flags) {
  if (!emit_process) return;
  struct ip_record* r = reserve();
  if (!r) return;
  r->ts = bpf_ktime_get_ns();
  r->arg0 = a0;
  r->arg1 = a1;
  r->cgroup = bpf_get_current_cgroup_id();
  r->pid = tgid;
  r->tid = tid;
  r->source = IP_SRC_HOST;
  r->op = op;
  r->flags = flags;
  bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(btf_process_fork, struct task_struct* parent, struct task_struct* child) {
  __u32 ptgid = parent->tgid, ctgid = child->tgid;
  if (ptgid == ctgid) return 0; /* a new thread: already covered by its tgid */
  if (!task_traced(parent)) return 0;
  trace_tgid(ctgid); /* children of traced processes are traced */
  proc_record(7, ptgid, parent->pid, ctgid, child->pid, 0);
  return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int tp_process_fork(void* ctx) {
  if (!current_traced()) return 0;
  __u32 child = field(ctx, IP_OFF_FORK_CHILD_PID, 4);
  /* Threads are indistinguishable here; a thread's tid in traced_tgids is harmless and is
   * removed when it exits. */
  trace_tgid(child);
  __u64 id = bpf_get_current_pid_tgid();
  proc_record(7, id >> 32, (__u32)id, child, child, IP_REC_CLASSIC);
  return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(btf_process_exec, struct task_struct* p, pid_t old_pid, struct linux_binprm* bprm) {
  if (task_traced(p)) proc_record(5, p->tgid, p->pid, old_pid, 0, 0);
  return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int tp_process_exec(void* ctx) {
  if (current_traced()) {
    __u64 id = bpf_get_current_pid_tgid();
    proc_record(5, id >> 32, (__u32)id, field(ctx, IP_OFF_EXEC_OLD_PID, 4), 0, IP_REC_CLASSIC);
  }
  return 0;
}

static __always_inline void thread_exit(__u32 tgid, __u32 tid, int exit_code, __u8 flags) {
  /* Per-thread state dies with the thread, whatever is enabled. */
  bpf_map_delete_elem(&call_stacks, &tid);
  bpf_map_delete_elem(&offcpu, &tid);
  bpf_map_delete_elem(&net_calls, &tid);
  if (offcpu_user_at_exit) flush_done(tid);
  if (tgid != tid) {
    bpf_map_delete_elem(&traced_tgids, &tid); /* classic fork may have added a thread id */
    return;
  }
  if (!tgid_traced(tgid)) return;
  proc_record(6, tgid, tid, exit_code, 0, flags);
  bpf_map_delete_elem(&traced_tgids, &tgid);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(btf_process_exit, struct task_struct* p) {
  thread_exit(p->tgid, p->pid, p->exit_code >> 8, 0);
  return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int tp_process_exit(void* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  thread_exit(id >> 32, (__u32)id, 0, IP_REC_CLASSIC);
  return 0;
}

/* ---- mm_page_alloc: aggregated in per-CPU counters, read by user space -------------------- */

SEC("tp_btf/mm_page_alloc")
int BPF_PROG(btf_page_alloc, struct page* page, unsigned int order) {
  count(IP_CNT_PAGE_BYTES, (__u64)page_size << order);
  count(IP_CNT_PAGE_COUNT, 1);
  return 0;
}

SEC("tracepoint/kmem/mm_page_alloc")
int tp_page_alloc(void* ctx) {
  count(IP_CNT_PAGE_BYTES, (__u64)page_size << (field(ctx, IP_OFF_PA_ORDER, 4) & 31));
  count(IP_CNT_PAGE_COUNT, 1);
  return 0;
}

/* ---- block I/O ---------------------------------------------------------------------------- */

static __always_inline __u8 blk_op_from_flags(__u32 cmd_flags) {
  switch (cmd_flags & 0xff) { /* REQ_OP_MASK */
    case 0: return 1;  /* REQ_OP_READ */
    case 1: return 2;  /* REQ_OP_WRITE */
    case 3: return 3;  /* REQ_OP_DISCARD */
    default: return 0; /* flush and others: not recorded */
  }
}

static __always_inline void blk_issue(__u64 key, __u8 op, __u64 bytes) {
  if (!op) return;
  __u64 id = bpf_get_current_pid_tgid();
  struct blk_start s = {.ts = bpf_ktime_get_ns(), .bytes = bytes, .pid = id >> 32,
                        .tid = (__u32)id, .op = op};
  bpf_map_update_elem(&blk_reqs, &key, &s, BPF_ANY);
}

static __always_inline void blk_complete(__u64 key, int error, __u8 flags) {
  struct blk_start* s = bpf_map_lookup_elem(&blk_reqs, &key);
  if (!s) return;
  struct ip_record* r = reserve();
  if (r) {
    r->ts = s->ts;
    r->dur = bpf_ktime_get_ns() - s->ts;
    r->arg0 = s->bytes;
    r->pid = s->pid;
    r->tid = s->tid;
    r->ret = error;
    r->source = IP_SRC_IO;
    r->op = s->op;
    r->flags = flags;
    bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  }
  bpf_map_delete_elem(&blk_reqs, &key);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(btf_block_issue, struct request* rq) {
  blk_issue((__u64)rq, blk_op_from_flags(rq->cmd_flags), rq->__data_len);
  return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_block_complete, struct request* rq, int error, unsigned int nr_bytes) {
  blk_complete((__u64)rq, error, 0);
  return 0;
}

/* rwbs: the first letter among R/W/D names the operation ("FWS" = flush + write + sync). */
static __always_inline __u8 blk_op_from_rwbs(__u64 rwbs) {
  for (int i = 0; i < 8; i++) {
    char c = (rwbs >> (8 * i)) & 0xff;
    if (c == 'R') return 1;
    if (c == 'W') return 2;
    if (c == 'D') return 3;
    if (c == 0) break;
  }
  return 0;
}

SEC("tracepoint/block/block_rq_issue")
int tp_block_issue(void* ctx) {
  __u64 key = (field(ctx, IP_OFF_BI_DEV, 4) << 44) ^ field(ctx, IP_OFF_BI_SECTOR, 8);
  blk_issue(key, blk_op_from_rwbs(field(ctx, IP_OFF_BI_RWBS, 8)), field(ctx, IP_OFF_BI_BYTES, 4));
  return 0;
}

SEC("tracepoint/block/block_rq_complete")
int tp_block_complete(void* ctx) {
  __u64 key = (field(ctx, IP_OFF_BC_DEV, 4) << 44) ^ field(ctx, IP_OFF_BC_SECTOR, 8);
  blk_complete(key, (int)field(ctx, IP_OFF_BC_ERROR, 4), IP_REC_CLASSIC);
  return 0;
}

/* ---- TCP retransmits (IPv4 and IPv6) ------------------------------------------------------ */

/* arg0 = family << 16 | remote port; arg1 = remote IPv4 address, or the first 8 bytes of the
 * IPv6 address; arg2 = its last 8 bytes. */
static __always_inline void tcp_record(__u16 family, __u16 dport_be, __u64 a1, __u64 a2, __u8 flags) {
  struct ip_record* r = reserve();
  if (!r) return;
  __u64 id = bpf_get_current_pid_tgid();
  r->ts = bpf_ktime_get_ns();
  r->arg0 = ((__u64)family << 16) | (__u16)((dport_be >> 8) | (dport_be << 8));
  r->arg1 = a1;
  r->arg2 = a2;
  r->pid = id >> 32;
  r->tid = (__u32)id;
  r->source = IP_SRC_TCP;
  r->op = 1;
  r->flags = flags;
  bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(btf_tcp_retransmit, const struct sock* sk) {
  __u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
  __u16 dport = BPF_CORE_READ(sk, __sk_common.skc_dport);
  __u64 a1 = 0, a2 = 0;
  if (family == 2 /* AF_INET */) {
    a1 = BPF_CORE_READ(sk, __sk_common.skc_daddr);
  } else if (family == 10 /* AF_INET6 */) {
    struct in6_addr d = BPF_CORE_READ(sk, __sk_common.skc_v6_daddr);
    __builtin_memcpy(&a1, &d.in6_u.u6_addr8[0], 8);
    __builtin_memcpy(&a2, &d.in6_u.u6_addr8[8], 8);
  }
  tcp_record(family, dport, a1, a2, 0);
  return 0;
}

SEC("tracepoint/tcp/tcp_retransmit_skb")
int tp_tcp_retransmit(void* ctx) {
  __u64 a1 = 0, a2 = 0;
  __u16 family = field(ctx, IP_OFF_TCP_FAMILY, 2);
  if (family == 2) {
    a1 = field(ctx, IP_OFF_TCP_DADDR, 4);
  } else {
    bpf_probe_read_kernel(&a1, 8, (char*)ctx + classic_off[IP_OFF_TCP_DADDR6]);
    bpf_probe_read_kernel(&a2, 8, (char*)ctx + classic_off[IP_OFF_TCP_DADDR6] + 8);
  }
  /* The classic record holds the port in host order already. */
  __u16 dport = field(ctx, IP_OFF_TCP_DPORT, 2);
  tcp_record(family, (__u16)((dport >> 8) | (dport << 8)), a1, a2, IP_REC_CLASSIC);
  return 0;
}

/* ---- socket send/recv syscalls (no tp_btf for syscalls: classic only) --------------------- */

static __always_inline int net_enter(struct trace_event_raw_sys_enter* ctx, __u8 op) {
  if (!current_traced()) return 0;
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  struct net_start s = {.ts = bpf_ktime_get_ns(), .fd = ctx->args[0], .op = op};
  bpf_map_update_elem(&net_calls, &tid, &s, BPF_ANY);
  return 0;
}

static __always_inline int net_exit(struct trace_event_raw_sys_exit* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tid = (__u32)id;
  struct net_start* s = bpf_map_lookup_elem(&net_calls, &tid);
  if (!s) return 0;
  struct ip_record* r = reserve();
  if (r) {
    long ret = ctx->ret;
    r->ts = s->ts;
    r->dur = bpf_ktime_get_ns() - s->ts;
    r->arg0 = ret > 0 ? ret : 0;
    r->arg1 = s->fd;
    r->ret = ret < 0 ? (__s32)ret : 0;
    r->pid = id >> 32;
    r->tid = tid;
    r->source = IP_SRC_NET;
    r->op = s->op;
    bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  }
  bpf_map_delete_elem(&net_calls, &tid);
  return 0;
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int sys_enter_sendto(struct trace_event_raw_sys_enter* ctx) { return net_enter(ctx, 1); }
SEC("tracepoint/syscalls/sys_enter_sendmsg")
int sys_enter_sendmsg(struct trace_event_raw_sys_enter* ctx) { return net_enter(ctx, 1); }
SEC("tracepoint/syscalls/sys_enter_recvfrom")
int sys_enter_recvfrom(struct trace_event_raw_sys_enter* ctx) { return net_enter(ctx, 2); }
SEC("tracepoint/syscalls/sys_enter_recvmsg")
int sys_enter_recvmsg(struct trace_event_raw_sys_enter* ctx) { return net_enter(ctx, 2); }
SEC("tracepoint/syscalls/sys_exit_sendto")
int sys_exit_sendto(struct trace_event_raw_sys_exit* ctx) { return net_exit(ctx); }
SEC("tracepoint/syscalls/sys_exit_sendmsg")
int sys_exit_sendmsg(struct trace_event_raw_sys_exit* ctx) { return net_exit(ctx); }
SEC("tracepoint/syscalls/sys_exit_recvfrom")
int sys_exit_recvfrom(struct trace_event_raw_sys_exit* ctx) { return net_exit(ctx); }
SEC("tracepoint/syscalls/sys_exit_recvmsg")
int sys_exit_recvmsg(struct trace_event_raw_sys_exit* ctx) { return net_exit(ctx); }
