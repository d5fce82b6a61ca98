// RAII owner of the loaded BPF objects (gpu.bpf.c uprobes, host.bpf.c tracepoints), their links
// and ring buffers.
//
// Contract:
// - open() loads and attaches; failure to load is a returned error (no exception); a missing
//   library, symbol or tracepoint is a warning in warnings() and the rest keeps working.
// - Every probe family can be switched off (ProbeOptions); the programs of a disabled family are
//   not loaded at all.
// - Tracepoints use tp_btf when the kernel's BTF has the tracepoint, the classic tracepoint
//   otherwise (or always with `force_classic`); classic field offsets come from tracefs.
// - attach_library() may be called at any time (libraries found after start) from the thread that
//   calls poll(); everything else is single-threaded too: one poller thread owns this object.
// - Stacks (ProbeOptions::stacks): slow probed calls (>= stack_min_ns), long off-CPU spans and
//   CPU-clock samples come back as `ip_stack_record`s on a third ring, through StackFn; the
//   registers, stack window, frame-pointer stack and Python frames they carry are resolved in user
//   space (bpf/stack_resolver.h). Python walking needs set_python(pid, ...) with a layout that
//   inspect_python() validated; without it a process gets native stacks only.
// - Destruction detaches every link before the objects are freed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bpf/discovery.h"
#include "bpf/ingero_bpf.h"

struct ring_buffer;
struct bpf_link;
struct bpf_object;
struct ip_gpu_bpf;
struct ip_host_bpf;
struct ip_sample_bpf;

namespace ingero::bpf {

struct ProbeFamilies {
  bool cuda = true;     // libcudart
  bool driver = true;   // libcuda
  bool graph = true;    // CUDA graph API (libcudart)
  bool nccl = true;     // libnccl
  bool sched = true;    // sched_switch off-CPU spans
  bool wakeup = true;   // sched_wakeup
  bool process = true;  // fork/exec/exit records (tracking itself always runs)
  bool memory = true;   // mm_page_alloc, aggregated in the kernel
  bool block = true;    // block_rq_issue/complete
  bool tcp = true;      // tcp_retransmit_skb
  bool net = true;      // socket send/recv syscalls
};

enum class FilterMode : uint32_t { kAllCuda = IP_FILTER_CUDA, kPids = IP_FILTER_PIDS, kCgroup = IP_FILTER_CGROUP };

// What is captured with stacks, and how much (docs/live-capture.md "Stacks").
struct StackOptions {
  uint64_t call_min_ns = UINT64_MAX;    // probed calls at least this long; UINT64_MAX = none
  uint64_t offcpu_min_ns = UINT64_MAX;  // off-CPU spans at least this long; UINT64_MAX = none
  uint32_t sample_hz = 0;               // CPU-clock samples of traced threads; 0 = off
  uint32_t ustack_bytes = 16384;        // user-stack window per stack (<= IP_USTACK_MAX)
  uint32_t per_thread_rate = 100;       // stacks per second per thread at most (slow calls)
  uint32_t per_thread_burst = 20;       // ... with bursts of this many
  // The stack ring (power of two): records are rate-limited slow calls and samples (~3-20 KiB
  // each), drained every 10 ms; 2 MiB holds ~100 of them per drain. It shows in RSS twice.
  uint32_t ring_bytes = 2u << 20;
};

struct ProbeOptions {
  ProbeFamilies families;
  StackOptions stacks;
  FilterMode filter = FilterMode::kAllCuda;
  std::vector<uint32_t> pids;  // kPids: these processes and their descendants
  std::string cgroup_path;     // kCgroup: a cgroup v2 directory
  bool force_classic = false;  // classic tracepoints even where tp_btf works (tests)
  std::string tracefs;         // empty: /sys/kernel/tracing, then /sys/kernel/debug/tracing
  // Size of each ring buffer (GPU calls, host events): a power of two, at least one page. The
  // poller empties the rings every 10 ms; 4 MiB holds ~58,000 records (~0.3 s at 200k records/s)
  // of slack for a descheduled poller. The kernel maps a ring's data twice, so each ring shows in
  // the tracer's RSS at twice its size.
  uint32_t ring_bytes = 4u << 20;
};

// Sums over CPUs of the kernel-side counters (IP_CNT_*).
struct ProbeCounters {
  uint64_t v[IP_NUM_COUNTERS] = {};
};

// Sums over CPUs of one library's probe-hit counters (IP_LC_*), for the self-check.
struct LibCounts {
  uint64_t v[IP_LC_NUM] = {};
};

// A library with uprobes, by slot (its links' cookie): which file, and when its probes were all in
// (CLOCK_MONOTONIC ns): calls that start after that are captured whole.
struct LibrarySlot {
  CudaLibrary lib;
  uint64_t attached_mono = 0;
};

// Calls one process's live threads lost (from their call stacks): entries dropped because no
// return came, and returns without their entry beyond the IP_MAX_DEPTH per thread that can be
// calls in flight at attach.
struct ProcessMisses {
  uint64_t lost_entries = 0;
  uint64_t unmatched_returns = 0;
};

class BpfProbes {
 public:
  using RecordFn = std::function<void(const ip_record&)>;
  // A record from the stack ring: `len` valid bytes (the stack window is cut to what was copied).
  using StackFn = std::function<void(const ip_stack_record&, size_t len)>;

  // Loads and attaches the tracepoints; uprobes come with attach_library(). Null and `error` on
  // failure (not root, no BPF, verifier rejection).
  static std::unique_ptr<BpfProbes> open(const ProbeOptions& opts, RecordFn on_record, std::string& error,
                                         StackFn on_stack = {});
  ~BpfProbes();
  BpfProbes(const BpfProbes&) = delete;
  BpfProbes& operator=(const BpfProbes&) = delete;

  // Attaches every enabled uprobe pair whose symbol the library exports. Returns the number of
  // functions attached; missing symbols become warnings. A library already attached (same
  // device and inode) is skipped.
  // Every return probe of the library is attached before any entry probe (see gpu.bpf.c).
  int attach_library(const CudaLibrary& lib);
  // Libraries with probes, by slot, and their probe-hit counters (same order).
  std::vector<LibrarySlot> library_slots() const;
  std::vector<LibCounts> lib_counts() const;
  // Per process (tgid), the misses its live threads counted (processes with none are left out);
  // with `open_by_slot` (sized to library_slots()), also the calls open now, per library slot.
  std::map<uint32_t, ProcessMisses> process_misses(std::vector<uint64_t>* open_by_slot = nullptr) const;
  // Probe hits the kernel did not run our uprobe programs for, because another BPF program was
  // running on that CPU (bpf_prog_info.recursion_misses, summed over the uprobe programs): each is
  // a call's entry or return lost before any counter of ours sees it.
  uint64_t uprobe_recursion_misses() const;
  // Detaches one uprobe (the entry, or the return, of `symbol` in the first library that has it).
  // For the self-check's tests: a probe lost mid-trace. False when no such link.
  bool detach_probe(const std::string& symbol, bool retprobe);

  // Waits up to `timeout_ms` (records are submitted without wakeups, so usually the whole time),
  // then consumes every ring (calls on_record for each); returns the number consumed or a
  // negative errno.
  int poll(int timeout_ms);
  // Consumes every ring now, without waiting.
  int consume();

  ProbeCounters counters() const;
  // Oldest entry timestamp (CLOCK_MONOTONIC ns) among open probed calls no older than
  // `call_max_age_ns` before `now_mono` and open context intervals (off-CPU spans, block
  // requests, socket calls) no older than `context_max_age_ns`; UINT64_MAX when none.
  uint64_t oldest_open(uint64_t now_mono, uint64_t call_max_age_ns, uint64_t context_max_age_ns) const;
  // Marks a process as traced (kPids/kCgroup seeding).
  void trace_pid(uint32_t pid);

  // Python walking for a process (a layout validated by inspect_python), or none.
  bool set_python(uint32_t pid, const ip_py_proc& layout);
  // The layout a process is walked with (set by user space, or by BPF itself from py_bins).
  bool get_python(uint32_t pid, ip_py_proc& out) const;
  // An interpreter executable BPF may register processes of by itself (pyintrospect PyBinary).
  bool set_python_binary(const ip_py_bin_key& key, const ip_py_bin& bin);
  void forget_python(uint32_t pid);
  // A code object's strings and line table as BPF read them; false when not (or no longer) held.
  bool read_code(uint32_t pid, uint64_t code, ip_py_code& out) const;
  // A stack of stack_ids (off-CPU spans), innermost first, zeros trimmed.
  bool read_stack_id(uint32_t id, std::vector<uint64_t>& ips) const;
  // CPU-clock sampling is running (perf events opened on every CPU).
  bool sampling() const { return !sample_links_.empty(); }
  // For a process about to exit (agent on SIGTERM): the kernel unregisters each uprobe with its own
  // RCU-tasks grace period, one at a time under a global lock (~100 ms each on a busy host: ~8 s
  // for 80 probes), in whichever process drops the last reference. A forked child keeps the
  // probes' link and perf fds (every other fd closed in it, so the listeners and files are free at
  // once), waits until this process has exited, then exits and pays that wait itself; this
  // process's own release is then only reference drops. False when the fork failed (the
  // destructor then detaches here, as usual). Call once, after the last event was read.
  bool detach_in_background();

  const std::vector<std::string>& warnings() const { return warnings_; }
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }
  // "tp_btf" or "classic" per tracepoint attached, for `check` and the docs.
  const std::vector<std::pair<std::string, std::string>>& tracepoints() const { return tps_; }
  size_t uprobes_attached() const { return links_uprobe_; }
  // host.bpf.c held_spans: an upper bound of the long off-CPU spans waiting for their thread's
  // syscall return (0 once every traced thread is gone; tests check the accounting).
  uint64_t held_offcpu_spans() const;
  // Syscall exit tracepoints carrying held off-CPU spans (probes.cpp kBlockingSyscalls):
  // attached, and skipped (not in this kernel's tracefs, or the attach failed). Both 0 when off-CPU
  // stacks are off or the raw tp_btf sys_exit fallback is used.
  size_t offcpu_exit_syscalls() const { return exit_syscalls_attached_; }
  size_t offcpu_exit_syscalls_missing() const { return exit_syscalls_missing_; }
  uint64_t target_cgroup() const { return cgroup_id_; }

 private:
  BpfProbes() = default;
  bool load(const ProbeOptions& opts, std::string& error);
  bool open_sampler(const ProbeOptions& opts, std::string& error);
  void reuse_shared(bpf_object* obj);

  ip_gpu_bpf* gpu_ = nullptr;
  ip_host_bpf* host_ = nullptr;
  ip_sample_bpf* sample_ = nullptr;
  ring_buffer* rb_ = nullptr;
  std::vector<bpf_link*> sample_links_;
  std::vector<int> perf_fds_;
  StackFn on_stack_;
  std::vector<bpf_link*> links_;  // tracepoints
  struct UprobeLink {
    uint32_t slot;
    std::string symbol;
    bool ret;
    bpf_link* link;
  };
  std::vector<UprobeLink> uprobe_links_;
  std::vector<LibrarySlot> lib_slots_;
  size_t links_uprobe_ = 0;
  size_t exit_syscalls_attached_ = 0;
  size_t exit_syscalls_missing_ = 0;
  std::set<std::pair<uint64_t, uint64_t>> attached_;  // (dev, ino)
  std::vector<std::string> warnings_;
  std::vector<std::pair<std::string, std::string>> tps_;
  ProbeFamilies families_;
  RecordFn on_record_;
  uint64_t cgroup_id_ = 0;
};

// The realtime - monotonic clock offset, measured as the tightest of a few sandwiched reads, so
// BPF's ktime stamps become unix ns.
int64_t realtime_offset_ns();
uint64_t monotonic_ns();

}  // namespace ingero::bpf
