/* On-CPU samples of traced threads: a CPU-clock perf event per CPU (opened by the loader at
 * --sample-hz) runs this program; when the interrupted thread belongs to a traced process it emits
 * a HOST cpu_sample record (model/ops.h op 8: ts = the sample time, dur 0) on the stack ring with
 * the thread's user stacks (registers, stack window, frame-pointer stack, Python frames, captured
 * by stack.bpf.h) and, when the sample hit kernel code, the kernel stack. Untraced threads cost one
 * map lookup. */
#include "stack.bpf.h"

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32, tid = (__u32)id;
  if (tid == 0 || !tgid_traced(tgid)) return 0;
  count(IP_CNT_SAMPLES, 1);
  struct ip_stack_record* s = stack_scratch_get();
  if (!s) return 0;
  stack_record_init(s, IP_STK_SAMPLE);
  __builtin_memset(&s->rec, 0, sizeof(s->rec));
  s->rec.ts = bpf_ktime_get_ns();
  s->rec.cgroup = bpf_get_current_cgroup_id();
  s->rec.pid = tgid;
  s->rec.tid = tid;
  s->rec.source = IP_SRC_HOST;
  s->rec.op = 8; /* cpu_sample */
  /* The user registers: saved at kernel entry when the sample hit kernel code. */
  struct pt_regs* ur = (struct pt_regs*)bpf_task_pt_regs(bpf_get_current_task_btf());
  __u64 ip = BPF_CORE_READ(ur, ip), sp = BPF_CORE_READ(ur, sp), bp = BPF_CORE_READ(ur, bp);
  if ((__s64)ctx->regs.ip < 0) { /* interrupted in the kernel (x86-64 upper half) */
    long n = bpf_get_stack(ctx, s->kern, sizeof(s->kern), 0);
    if (n > 0) {
      s->n_kern = (__u64)n >> 3;
      s->flags |= IP_STKF_KSTACK;
    }
  }
  capture_user(ctx, s, ip, sp, bp, tgid);
  stack_submit(s);
  return 0;
}
