/* Uprobe/uretprobe pairs on the CUDA runtime (libcudart), the driver (libcuda), the CUDA graph
 * API and NCCL. One record per completed call: ts = entry, dur = entry to return.
 *
 * Pairing: every thread has a stack of open calls (call_stacks). Entry pushes a frame, return pops
 * frames down to the newest one of the same op, so nested calls (cudaMemcpy -> cuMemcpyHtoD) and
 * recursion pair correctly, and a return whose entry was missed (attached mid-call) is counted
 * instead of corrupting the stack. Arguments are captured at entry because the registers are gone
 * at return.
 *
 * Entries whose return never comes (a return probe missing while its entry probe is in, a thread
 * that left a call by longjmp) would fill the stack and leave the thread unpaired for good; a
 * full stack is emptied instead (its frames counted as lost), so pairing recovers at the next
 * call. The loader attaches every return probe of a library before its entry probes, so a call
 * entered while probes go in is never left without its return.
 *
 * Self-check: each link's cookie is its library's slot; entries, returns, unmatched returns, lost
 * entries and ring drops are counted per library (lib_counts) and per thread (in call_stacks). */
#include "stack.bpf.h"

/* Calls at least this long get their stacks captured (rate-limited per thread); ~0 = none. */
const volatile __u64 stack_min_ns = ~0ULL;

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 8 << 20);
} gpu_events SEC(".maps");

/* Set by the loader while it attaches a library's probes: between its return probes and its entry
 * probes going in, every return is one without its entry, expected and not a thread's miss. */
__u32 attaching = 0;

/* Per-library probe-hit counters (IP_LC_*), read by the self-check in user space. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, IP_MAX_LIBS * IP_LC_NUM);
  __type(key, __u32);
  __type(value, __u64);
} lib_counts SEC(".maps");

static __always_inline __u32 lib_slot(struct pt_regs* ctx) {
  __u64 c = bpf_get_attach_cookie(ctx);
  return c < IP_MAX_LIBS ? (__u32)c : IP_MAX_LIBS - 1;
}

static __always_inline void lib_count(__u32 lib, __u32 what, __u64 n) {
  __u32 idx = (lib & (IP_MAX_LIBS - 1)) * IP_LC_NUM + what;
  __u64* v = bpf_map_lookup_elem(&lib_counts, &idx);
  if (v) *v += n; /* per-CPU slot: no atomics needed */
}

/* Argument selectors: 0-5 = integer registers, 6.. = stack slots (7th integer argument onward,
 * or a by-value struct that went to memory), -1 = none. */
#define A_NONE -1
#define A_STACK(n) (6 + (n))

static __always_inline __u64 get_arg(struct pt_regs* ctx, int idx) {
  switch (idx) {
    case 0: return PT_REGS_PARM1(ctx);
    case 1: return PT_REGS_PARM2(ctx);
    case 2: return PT_REGS_PARM3(ctx);
    case 3: return PT_REGS_PARM4(ctx);
    case 4: return PT_REGS_PARM5(ctx);
    case 5: return ctx->r9; /* x86-64 SysV; libbpf 1.1 has no PT_REGS_PARM6 */
    case -1: return 0;
    default: {
      /* At entry [sp] holds the return address; stack argument k lives at sp + 8 * (k + 1). */
      __u64 v = 0;
      __u64 sp = PT_REGS_SP(ctx);
      bpf_probe_read_user(&v, sizeof(v), (void*)(sp + 8 * (idx - 6 + 1)));
      return v;
    }
  }
}

static __always_inline int pid_wanted(__u32 tgid) {
  if (filter_mode == IP_FILTER_CUDA) {
    if (!tgid_traced(tgid)) trace_tgid(tgid); /* sched_switch follows every CUDA process */
    return 1;
  }
  if (filter_mode == IP_FILTER_CGROUP && bpf_get_current_cgroup_id() == target_cgroup) {
    if (!tgid_traced(tgid)) trace_tgid(tgid);
    return 1;
  }
  return tgid_traced(tgid);
}

/* The thread's call stack, created empty (and owned by `tgid`) on first use; null when the map
 * is full (counted). */
static __always_inline struct ip_call_stack* thread_stack(__u32 tgid, __u32 tid) {
  struct ip_call_stack* st = bpf_map_lookup_elem(&call_stacks, &tid);
  if (st) return st;
  struct ip_call_stack fresh = {};
  fresh.tgid = tgid;
  bpf_map_update_elem(&call_stacks, &tid, &fresh, BPF_NOEXIST);
  st = bpf_map_lookup_elem(&call_stacks, &tid);
  if (!st) count(IP_CNT_NO_SLOT, 1);
  return st;
}

static __always_inline int on_enter(struct pt_regs* ctx, __u8 src, __u8 op, __u64 a0, __u64 a1,
                                    __u64 a2) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32, tid = (__u32)id;
  if (!pid_wanted(tgid)) return 0;
  __u32 lib = lib_slot(ctx);
  lib_count(lib, IP_LC_ENTER, 1);
  struct ip_call_stack* st = thread_stack(tgid, tid);
  if (!st) return 0;
  __u32 d = st->depth;
  if (d >= IP_MAX_DEPTH) {
    /* Full: no probed API nests this deep, so these frames lost their returns. Drop them
     * (counted, per library and per thread) and start again, rather than stay unpaired. */
    count(IP_CNT_DEPTH, 1);
#pragma unroll
    for (int i = 0; i < IP_MAX_DEPTH; i++) lib_count(st->frames[i].lib, IP_LC_LOST, 1);
    st->lost += IP_MAX_DEPTH;
    d = 0;
  }
  st->depth = d + 1;
  struct ip_frame* f = &st->frames[d & (IP_MAX_DEPTH - 1)];
  f->arg0 = a0;
  f->arg1 = a1;
  f->arg2 = a2;
  f->source = src;
  f->op = op;
  f->lib = (__u8)lib;
  f->ts = bpf_ktime_get_ns(); /* last: the entry timestamp excludes our own bookkeeping */
  return 0;
}

/* The call's record from its entry frame. */
static __always_inline void fill(struct ip_record* r, struct pt_regs* ctx, struct ip_frame* f,
                                 __u64 now, __u32 tgid, __u32 tid, __u8 src, __u8 op) {
  r->ts = f->ts;
  r->dur = now - f->ts;
  r->arg0 = f->arg0;
  r->arg1 = f->arg1;
  r->arg2 = f->arg2;
  r->cgroup = bpf_get_current_cgroup_id();
  r->pid = tgid;
  r->tid = tid;
  r->ret = (__s32)PT_REGS_RC(ctx);
  r->source = src;
  r->op = op;
  r->state = f->lib;
  r->flags = 0;
  if (src == IP_SRC_NCCL && op == 7 /* ncclCommInitRank */ && r->ret == 0 && f->arg2) {
    /* The communicator handle exists only after the call: read *comm so user space can map
     * later collectives (which pass the handle) to this rank. */
    __u64 comm = 0;
    bpf_probe_read_user(&comm, sizeof(comm), (void*)f->arg2);
    r->arg2 = comm;
  }
}

static __always_inline int on_exit(struct pt_regs* ctx, __u8 src, __u8 op) {
  __u64 now = bpf_ktime_get_ns();
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32, tid = (__u32)id;
  struct ip_call_stack* st = bpf_map_lookup_elem(&call_stacks, &tid);
  __u32 d = st ? st->depth : 0;
  if (d == 0 || d > IP_MAX_DEPTH) {
    if (filter_mode != IP_FILTER_CUDA && !tgid_traced(tgid)) return 0;
    __u32 lib = lib_slot(ctx);
    lib_count(lib, IP_LC_RETURN, 1);
    lib_count(lib, IP_LC_UNMATCHED, 1);
    count(IP_CNT_UNMATCHED, 1);
    if (attaching) return 0;
    if (!st) st = thread_stack(tgid, tid); /* so the self-check can name the thread */
    if (st) {
      st->unmatched += 1;
      if (st->depth > IP_MAX_DEPTH) st->depth = 0;
    }
    return 0;
  }
  __u32 lib = lib_slot(ctx);
  lib_count(lib, IP_LC_RETURN, 1);
  /* Pop down to the newest frame of this op; frames above it lost their returns. */
  int found = -1;
#pragma unroll
  for (int i = IP_MAX_DEPTH - 1; i >= 0; i--) {
    if (found < 0 && (__u32)i < d && st->frames[i].op == op && st->frames[i].source == src)
      found = i;
  }
  if (found < 0) {
    count(IP_CNT_UNMATCHED, 1);
    lib_count(lib, IP_LC_UNMATCHED, 1);
    st->unmatched += 1;
    return 0;
  }
  if ((__u32)found != d - 1) {
    /* The frames above lost their returns. */
    count(IP_CNT_UNMATCHED, d - 1 - found);
#pragma unroll
    for (int i = 1; i < IP_MAX_DEPTH; i++)
      if ((__u32)i > (__u32)found && (__u32)i < d) lib_count(st->frames[i].lib, IP_LC_LOST, 1);
    st->lost += d - 1 - found;
  }
  st->depth = found;
  struct ip_frame* f = &st->frames[found & (IP_MAX_DEPTH - 1)];

  /* A slow call (and the thread's stack budget allows it): the record goes out on the stack ring
   * with the caller's stacks. At a uretprobe the registers are the caller's: ip is the return
   * address into it, so the probed function itself is not on the stack (user space prepends it). */
  if (now - f->ts >= stack_min_ns && stack_rate_ok(tid, now)) {
    struct ip_stack_record* s = stack_scratch_get();
    if (s) {
      stack_record_init(s, IP_STK_CALL);
      fill(&s->rec, ctx, f, now, tgid, tid, src, op);
      capture_user(ctx, s, PT_REGS_IP(ctx), PT_REGS_SP(ctx), ctx->bp, tgid);
      if (stack_submit(s) == 0) return 0;
      /* stack ring full (counted): the call still goes out, without its stack */
    }
  }

  struct ip_record* r = bpf_ringbuf_reserve(&gpu_events, sizeof(*r), 0);
  if (!r) {
    count(IP_CNT_DROP_GPU, 1);
    lib_count(lib, IP_LC_DROP, 1);
    return 0;
  }
  fill(r, ctx, f, now, tgid, tid, src, op);
  /* No wakeup: the poller drains on a short timer. A wakeup per record (irq_work + a poller
   * context switch) would cost more than the probe itself at high call rates. */
  bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
  return 0;
}

#define PAIR(name, src, op, A0, A1, A2)                                              \
  SEC("uprobe")                                                                      \
  int BPF_KPROBE(enter_##name) {                                                     \
    return on_enter(ctx, src, op, get_arg(ctx, A0), get_arg(ctx, A1), get_arg(ctx, A2)); \
  }                                                                                  \
  SEC("uretprobe")                                                                   \
  int BPF_KRETPROBE(exit_##name) { return on_exit(ctx, src, op); }

/* libcudart. arg0/arg1/arg2 as documented in docs/live-capture.md.
 * cudaLaunchKernel(func, dim3 grid (2 regs), dim3 block (2 regs), args, sharedMem, stream):
 * sharedMem and stream are the 1st and 2nd stack slots. */
PAIR(cudaLaunchKernel, IP_SRC_CUDA, 3, 0, A_STACK(1), 1)
PAIR(cudaMemcpy, IP_SRC_CUDA, 4, 2, 3, A_NONE)
PAIR(cudaMemcpyAsync, IP_SRC_CUDA, 7, 2, 3, 4)
PAIR(cudaMalloc, IP_SRC_CUDA, 1, 1, A_NONE, A_NONE)
PAIR(cudaFree, IP_SRC_CUDA, 2, 0, A_NONE, A_NONE)
PAIR(cudaMallocManaged, IP_SRC_CUDA, 8, 1, 2, A_NONE)
PAIR(cudaStreamSynchronize, IP_SRC_CUDA, 5, A_NONE, 0, A_NONE)
PAIR(cudaDeviceSynchronize, IP_SRC_CUDA, 6, A_NONE, A_NONE, A_NONE)
PAIR(cudaEventSynchronize, IP_SRC_CUDA, 9, A_NONE, 0, A_NONE)
/* CUDA graphs (source GRAPH). */
PAIR(cudaStreamBeginCapture, IP_SRC_GRAPH, 1, 1, 0, A_NONE)
PAIR(cudaStreamEndCapture, IP_SRC_GRAPH, 2, A_NONE, 0, A_NONE)
PAIR(cudaGraphInstantiate, IP_SRC_GRAPH, 3, 1, A_NONE, A_NONE)
PAIR(cudaGraphLaunch, IP_SRC_GRAPH, 4, 0, 1, A_NONE)
/* libcuda. cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, ...): stream = stack slot 2. */
PAIR(cuLaunchKernel, IP_SRC_DRIVER, 1, 0, A_STACK(2), A_NONE)
PAIR(cuMemAlloc_v2, IP_SRC_DRIVER, 5, 1, A_NONE, A_NONE)
PAIR(cuMemFree_v2, IP_SRC_DRIVER, 8, 0, A_NONE, A_NONE)
PAIR(cuMemcpyHtoD_v2, IP_SRC_DRIVER, 9, 2, A_NONE, A_NONE)
PAIR(cuMemcpyDtoH_v2, IP_SRC_DRIVER, 10, 2, A_NONE, A_NONE)
PAIR(cuMemcpyHtoDAsync_v2, IP_SRC_DRIVER, 11, 2, A_NONE, 3)
PAIR(cuMemcpyDtoHAsync_v2, IP_SRC_DRIVER, 12, 2, A_NONE, 3)
PAIR(cuCtxSynchronize, IP_SRC_DRIVER, 4, A_NONE, A_NONE, A_NONE)
PAIR(cuStreamSynchronize, IP_SRC_DRIVER, 7, A_NONE, 0, A_NONE)
/* NCCL: arg0 = element count, arg1 = datatype, arg2 = communicator (user space maps it to the
 * rank). ncclCommInitRank(comm*, nranks, ncclUniqueId (128 bytes, in memory), rank): the id goes
 * to the stack, so rank is the 3rd integer register. */
PAIR(ncclAllReduce, IP_SRC_NCCL, 1, 2, 3, 5)
PAIR(ncclAllGather, IP_SRC_NCCL, 2, 2, 3, 4)
PAIR(ncclReduceScatter, IP_SRC_NCCL, 3, 2, 3, 5)
PAIR(ncclBroadcast, IP_SRC_NCCL, 4, 2, 3, 5)
PAIR(ncclSend, IP_SRC_NCCL, 5, 1, 2, 4)
PAIR(ncclRecv, IP_SRC_NCCL, 6, 1, 2, 4)
PAIR(ncclCommInitRank, IP_SRC_NCCL, 7, 2, 1, 0)
