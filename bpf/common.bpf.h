/* Maps and helpers shared by gpu.bpf.c and host.bpf.c. Both objects declare the same maps; the
 * loader creates them once (host object) and hands the fds to the other (bpf_map__reuse_fd), so
 * the traced-process set, per-thread call stacks and counters are one set of maps. */
#ifndef INGERO_COMMON_BPF_H
#define INGERO_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "ingero_bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load. */
const volatile __u32 filter_mode = IP_FILTER_CUDA;
const volatile __u64 target_cgroup = 0;

/* tgid -> 1: processes whose threads are traced. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, IP_MAX_TRACED);
  __type(key, __u32);
  __type(value, __u8);
} traced_tgids SEC(".maps");

/* tid -> stack of open probed calls (entry/return pairing survives nesting and recursion). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, IP_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct ip_call_stack);
} call_stacks SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, IP_NUM_COUNTERS);
  __type(key, __u32);
  __type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 idx, __u64 n) {
  __u64* v = bpf_map_lookup_elem(&counters, &idx);
  if (v) *v += n; /* per-CPU slot: no atomics needed */
}

static __always_inline int tgid_traced(__u32 tgid) {
  return bpf_map_lookup_elem(&traced_tgids, &tgid) != 0;
}

static __always_inline void trace_tgid(__u32 tgid) {
  __u8 one = 1;
  bpf_map_update_elem(&traced_tgids, &tgid, &one, BPF_NOEXIST);
}

#endif
