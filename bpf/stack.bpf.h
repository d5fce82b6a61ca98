/* Stack capture shared by gpu.bpf.c (slow calls, at the uretprobe), host.bpf.c (off-CPU spans,
 * at switch-out) and sample.bpf.c (on-CPU samples).
 *
 * Contract:
 * - Nothing here unwinds native code: it copies what user space needs to do it later, at the
 *   event: user registers (ip, sp, bp), a window of the user stack from sp upward (rodata
 *   `ustack_bytes`, <= IP_USTACK_MAX, copied in 512-byte chunks aligned to 512 so the copy stops
 *   at the first unreadable page: the top of the stack) and the frame-pointer stack
 *   (bpf_get_stack, a cheap cross-check).
 * - Python: for a process with an entry in py_procs (validated offsets, written by user space),
 *   the calling thread's PyThreadState is found through the gilstate TSS slot
 *   (fsbase + tss_base + 16*key + 8), which is set whether or not the thread holds the GIL; the
 *   frame chain is walked (bpf_loop, at most IP_PY_MAX frames, C-stack/shim/entry frames
 *   skipped), emitting (code object, instruction byte offset) per frame. The first time a
 *   (tgid, code) pair is seen, its file name, qualified name, first line and line table are read
 *   here into py_codes, so a process that exits right after its call still resolves.
 * - Every read is bpf_probe_read_user: a bad pointer ends the walk with a flag, never a fault.
 * - Rate limit: stack_rate_ok() is a per-thread GCRA bucket (rodata stack_interval_ns, burst
 *   stack_burst_ns); a refused stack is counted (IP_CNT_STACK_RATE), the event still goes out.
 * - The maps are declared in every object; the loader creates them once (host object) and hands
 *   the fds to the others (bpf_map__reuse_fd). */
#ifndef INGERO_STACK_BPF_H
#define INGERO_STACK_BPF_H

#include "common.bpf.h"

const volatile __u32 ustack_bytes = 16384;         /* user-stack window copied per stack */
const volatile __u64 stack_interval_ns = 10000000;  /* rate limit: one stack per 10 ms per thread, */
const volatile __u64 stack_burst_ns = 200000000;    /* with bursts of 20 */

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 8 << 20);
} stack_events SEC(".maps");

/* tgid -> validated CPython layout (user space fills it; absent = native stacks only). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32);
  __type(value, struct ip_py_proc);
} py_procs SEC(".maps");

/* interpreter executable (inode number, size) -> how to find _PyRuntime in a process of it (user
 * space fills it from the files; capture_python registers a process of it itself, at its first
 * stack, so a short process is not over before user space validated it). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 256);
  __type(key, struct ip_py_bin_key);
  __type(value, struct ip_py_bin);
} py_bins SEC(".maps");

/* (tgid, code object) -> strings and line table read at first sight. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, struct ip_py_code_key);
  __type(value, struct ip_py_code);
} py_codes SEC(".maps");

/* tid -> theoretical arrival time of the next allowed stack (GCRA). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, IP_MAX_THREADS);
  __type(key, __u32);
  __type(value, __u64);
} stack_tat SEC(".maps");

/* Kernel and frame-pointer user stacks of off-CPU spans, by id (user space reads them). */
struct {
  __uint(type, BPF_MAP_TYPE_STACK_TRACE);
  __uint(max_entries, 16384);
  __uint(key_size, sizeof(__u32));
  __uint(value_size, IP_KSTACK_MAX * sizeof(__u64));
} stack_ids SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ip_stack_record);
} stack_scratch SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ip_py_code);
} code_scratch SEC(".maps");

static __always_inline int stack_rate_ok(__u32 tid, __u64 now) {
  __u64* tat = bpf_map_lookup_elem(&stack_tat, &tid);
  if (!tat) {
    __u64 next = now + stack_interval_ns;
    bpf_map_update_elem(&stack_tat, &tid, &next, BPF_ANY);
    return 1;
  }
  __u64 t = *tat > now ? *tat : now;
  if (t > now + stack_burst_ns) {
    count(IP_CNT_STACK_RATE, 1);
    return 0;
  }
  *tat = t + stack_interval_ns;
  return 1;
}

static __always_inline struct ip_stack_record* stack_scratch_get(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&stack_scratch, &zero);
}

/* ---- user-stack window -------------------------------------------------------------------- */

struct copy_ctx {
  __u64 sp;
  __u32 off;     /* bytes copied so far */
  __u32 limit;   /* bytes wanted */
  int full;      /* every chunk read: the stack continues above the window */
};

static long copy_chunk(__u64 i, void* data) {
  struct copy_ctx* c = data;
  __u32 zero = 0;
  struct ip_stack_record* s = bpf_map_lookup_elem(&stack_scratch, &zero);
  if (!s) return 1;
  __u64 off = c->off;
  if (off >= c->limit || off > IP_USTACK_MAX - 512) return 1;
  /* The first chunk ends at a 512-byte boundary of the address, so later chunks (and page
   * boundaries) line up: the copy stops exactly at the first unreadable page. */
  __u64 n = 512 - ((c->sp + off) & 511);
  __u64 left = c->limit - off;
  if (n > left) n = left;
  asm volatile("" : "+r"(n)); /* keep the bound check below on the register passed on */
  if (n == 0 || n > 512) return 1;
  if (bpf_probe_read_user(&s->ustack[off], n, (void*)(c->sp + off)) != 0) {
    c->full = 0;
    return 1;
  }
  c->off = off + n;
  return 0;
}

static __always_inline void capture_ustack(struct ip_stack_record* s, __u64 sp) {
  struct copy_ctx c = {.sp = sp, .off = 0, .limit = ustack_bytes, .full = 1};
  if (c.limit > IP_USTACK_MAX) c.limit = IP_USTACK_MAX;
  s->ustack_len = 0;
  if (!sp) return;
  bpf_loop(IP_USTACK_MAX / 512 + 1, copy_chunk, &c, 0);
  s->ustack_len = c.off;
  if (c.full && c.off >= c.limit) s->flags |= IP_STKF_USTACK_FULL;
}

/* ---- Python frames ------------------------------------------------------------------------ */

static __always_inline __u64 read_u64(__u64 addr) {
  __u64 v = 0;
  if (bpf_probe_read_user(&v, sizeof(v), (void*)addr) != 0) return 0;
  return v;
}

/* A str object's raw data (compact ASCII or compact kind 1/2/4), at most max-1 bytes. */
static __always_inline void read_pystr(const struct ip_py_proc* p, __u64 obj, char* dst,
                                       __u32 max_mask, __u16* len, __u8* kind) {
  *len = 0;
  *kind = 1;
  if (!obj) return;
  __u8 state = 0;
  __s64 n = 0;
  if (bpf_probe_read_user(&state, 1, (void*)(obj + p->str_state)) != 0) return;
  if (bpf_probe_read_user(&n, sizeof(n), (void*)(obj + 16)) != 0) return; /* PyASCIIObject.length */
  __u32 k = (state >> 2) & 7;
  if (!((state >> 5) & 1) || (k != 1 && k != 2 && k != 4) || n <= 0) return;
  __u64 data = obj + (((state >> 6) & 1) ? p->str_ascii_data : p->str_compact_data);
  __u64 bytes = (__u64)n * k;
  if (bytes > max_mask) bytes = max_mask;
  asm volatile("" : "+r"(bytes));
  if (bytes > max_mask) return;
  if (bpf_probe_read_user(dst, bytes, (void*)data) != 0) return;
  *len = bytes;
  *kind = k;
}

static __always_inline void intern_code(const struct ip_py_proc* p, __u32 tgid, __u64 code) {
  struct ip_py_code_key key = {.tgid = tgid, .code = code};
  if (bpf_map_lookup_elem(&py_codes, &key)) return;
  __u32 zero = 0;
  struct ip_py_code* v = bpf_map_lookup_elem(&code_scratch, &zero);
  if (!v) return;
  v->firstlineno = 0;
  v->linetable_len = 0;
  bpf_probe_read_user(&v->firstlineno, sizeof(v->firstlineno),
                      (void*)(code + p->code_firstlineno));
  read_pystr(p, read_u64(code + p->code_filename), v->file, IP_PY_FILE_MAX - 1, &v->file_len,
             &v->file_kind);
  read_pystr(p, read_u64(code + p->code_name), v->name, IP_PY_NAME_MAX - 1, &v->name_len,
             &v->name_kind);
  __u64 lt = read_u64(code + p->code_linetable);
  if (lt) {
    __s64 n = 0;
    bpf_probe_read_user(&n, sizeof(n), (void*)(lt + p->bytes_size));
    if (n > 0) {
      __u64 m = (__u64)n;
      if (m > IP_PY_LINES_MAX - 1) m = IP_PY_LINES_MAX - 1;
      asm volatile("" : "+r"(m));
      if (m > IP_PY_LINES_MAX - 1) m = 0;
      if (bpf_probe_read_user(v->linetable, m, (void*)(lt + p->bytes_data)) == 0)
        v->linetable_len = m;
    }
  }
  bpf_map_update_elem(&py_codes, &key, v, BPF_NOEXIST);
  count(IP_CNT_PY_CODES, 1);
}

struct py_ctx {
  struct ip_py_proc p;
  __u64 frame;
  __u32 tgid;
  __u32 n;
  __u32 flags;
};

static long py_step(__u64 i, void* data) {
  struct py_ctx* c = data;
  __u64 f = c->frame;
  if (!f) return 1;
  if (c->n >= IP_PY_MAX) {
    c->flags |= IP_STKF_PY_TRUNC; /* a frame remains that did not fit */
    return 1;
  }
  __u64 back = 0;
  if (bpf_probe_read_user(&back, sizeof(back), (void*)(f + c->p.frame_back)) != 0) {
    c->flags |= IP_STKF_PY_FAULT;
    return 1;
  }
  c->frame = back;
  if (c->p.frame_owner >= 0) {
    __u8 owner = 0;
    bpf_probe_read_user(&owner, 1, (void*)(f + c->p.frame_owner));
    if (owner == 3) return 0; /* FRAME_OWNED_BY_CSTACK: 3.12 shim / 3.13 entry frame */
  }
  __u64 code = read_u64(f + c->p.frame_code);
  if (!code) {
    c->flags |= IP_STKF_PY_FAULT;
    return 1;
  }
  __u32 lasti = 0xffffffff;
  if (c->p.minor == 10) {
    __s32 l = 0;
    bpf_probe_read_user(&l, sizeof(l), (void*)(f + c->p.frame_instr));
    lasti = l < 0 ? 0 : (__u32)l * 2;
  } else {
    __u64 instr = read_u64(f + c->p.frame_instr);
    __u64 base = code + c->p.code_bytecode;
    if (instr >= base && instr - base < 0x10000000) lasti = instr - base;
  }
  __u32 zero = 0;
  struct ip_stack_record* s = bpf_map_lookup_elem(&stack_scratch, &zero);
  if (!s) return 1;
  __u32 n = c->n & (IP_PY_MAX - 1);
  s->py[n].code = code;
  s->py[n].lasti = lasti;
  s->py[n].pad = 0;
  c->n++;
  intern_code(&c->p, c->tgid, code);
  return 0;
}

/* A process user space has not registered (yet): if its executable is a known interpreter
 * (py_bins), find _PyRuntime from the load bias (and the GOT slot of Py_BytesMain for a shared
 * libpython) and check what inspect_python checks first: autoTSSkey initialised and < 32,
 * interpreters.head set, this thread's TSS slot -> a thread state of that interpreter, and on
 * 3.13 the _Py_DebugOffsets cookie. Registers the process in py_procs; null when any check fails
 * (tried again at the next stack). User space validates it again when it sees the process. */
static __always_inline struct ip_py_proc* py_self_register(__u32 tgid, struct task_struct* task, __u64 fs) {
  struct mm_struct* mm = BPF_CORE_READ(task, mm);
  if (!mm) return 0;
  struct ip_py_bin_key k = {};
  k.ino = BPF_CORE_READ(mm, exe_file, f_inode, i_ino);
  k.size = BPF_CORE_READ(mm, exe_file, f_inode, i_size);
  struct ip_py_bin* b = bpf_map_lookup_elem(&py_bins, &k);
  if (!b) return 0;
  __u64 bias = BPF_CORE_READ(mm, start_code) - b->text_vaddr;
  __u64 base = bias; /* 0 for a non-PIE executable (Debian's python3) */
  if (b->got_vaddr) {
    base = read_u64(bias + b->got_vaddr); /* Py_BytesMain in libpython */
    if (!base) return 0;
  }
  __u64 runtime = base + b->runtime_off;
  __s32 tss[2] = {0, 0};
  if (bpf_probe_read_user(tss, sizeof(tss), (void*)(runtime + b->layout.key_off - 4)) != 0) return 0;
  if (tss[0] != 1 || tss[1] < 0 || tss[1] >= 32) return 0;
  __u64 head = read_u64(runtime + b->interp_head);
  if (!head) return 0;
  __u64 tstate = read_u64(fs + b->layout.tss_base + 16 * (__u64)tss[1] + 8);
  if (!tstate || read_u64(tstate + b->tstate_interp) != head) return 0;
  if (b->layout.minor >= 13 && read_u64(runtime) != 0x7970677562656478ull) return 0; /* "xdebugpy" */
  struct ip_py_proc l = b->layout;
  l.runtime = runtime;
  if (bpf_map_update_elem(&py_procs, &tgid, &l, BPF_NOEXIST) == 0) count(IP_CNT_PY_SELF, 1);
  return bpf_map_lookup_elem(&py_procs, &tgid);
}

static __always_inline void capture_python(struct ip_stack_record* s, __u32 tgid,
                                           struct task_struct* task) {
  s->n_py = 0;
  __u64 fs = BPF_CORE_READ(task, thread.fsbase);
  struct ip_py_proc* pp = bpf_map_lookup_elem(&py_procs, &tgid);
  if (!pp) pp = py_self_register(tgid, task, fs);
  if (!pp || pp->minor == 0) return; /* minor 0: refused by user space */
  struct py_ctx c = {};
  c.p = *pp;
  c.tgid = tgid;
  s->flags |= IP_STKF_PY;
  __s32 key = -1;
  bpf_probe_read_user(&key, sizeof(key), (void*)(c.p.runtime + c.p.key_off));
  if (key < 0 || key >= 32) {
    s->flags |= IP_STKF_PY_FAULT;
    return;
  }
  __u64 tstate = read_u64(fs + c.p.tss_base + 16 * (__u64)key + 8);
  if (!tstate) {
    s->flags |= IP_STKF_PY_NO_TSTATE;
    return;
  }
  __u64 f = read_u64(tstate + c.p.tstate_frame);
  if (f && c.p.cframe_frame >= 0) f = read_u64(f + c.p.cframe_frame);
  c.frame = f;
  bpf_loop(IP_PY_MAX + 16, py_step, &c, 0);
  if (c.n >= IP_PY_MAX && c.frame) c.flags |= IP_STKF_PY_TRUNC;
  s->n_py = c.n;
  s->flags |= c.flags;
  if (c.flags & IP_STKF_PY_FAULT) count(IP_CNT_PY_FAULT, 1);
}

/* Everything user space needs for the user-side stacks of the current thread: registers, the
 * stack window, the frame-pointer stack and the Python frames. `ctx` is the program's context
 * (bpf_get_stack); `regs` the user registers. */
static __always_inline void capture_user(void* ctx, struct ip_stack_record* s, __u64 ip, __u64 sp,
                                         __u64 bp, __u32 tgid) {
  s->ip = ip;
  s->sp = sp;
  s->bp = bp;
  s->flags |= IP_STKF_USER_REGS;
  long n = bpf_get_stack(ctx, s->fp, sizeof(s->fp), BPF_F_USER_STACK);
  s->n_fp = n > 0 ? (__u64)n >> 3 : 0;
  capture_ustack(s, sp);
  capture_python(s, tgid, (struct task_struct*)bpf_get_current_task());
}

static __always_inline void stack_record_init(struct ip_stack_record* s, __u32 kind) {
  s->kind = kind;
  s->flags = 0;
  s->n_fp = 0;
  s->n_kern = 0;
  s->n_py = 0;
  s->pad16 = 0;
  s->ustack_len = 0;
  s->ip = s->sp = s->bp = 0;
  s->pad32 = 0;
  bpf_get_current_comm(s->comm, sizeof(s->comm));
}

/* Sends the record (only the used part of the window). 0 on success. */
static __always_inline int stack_submit(struct ip_stack_record* s) {
  __u64 u = s->ustack_len;
  asm volatile("" : "+r"(u));
  if (u > IP_USTACK_MAX) u = IP_USTACK_MAX;
  __u64 len = offsetof(struct ip_stack_record, ustack) + u;
  if (bpf_ringbuf_output(&stack_events, s, len, BPF_RB_NO_WAKEUP) != 0) {
    count(IP_CNT_DROP_STACK, 1);
    return -1;
  }
  count(IP_CNT_STACKS, 1);
  return 0;
}

#endif
