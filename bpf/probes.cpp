// BpfProbes: loading, attaching and polling the BPF objects. See probes.h for the contract.
#include "bpf/probes.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/perf_event.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "bpf/gpu.skel.h"
#include "bpf/host.skel.h"
#include "bpf/sample.skel.h"

namespace ingero::bpf {
namespace {

// Which tracepoints host.bpf.c has, their family, and their two programs.
struct TracepointSpec {
  const char* category;
  const char* name;
  bool ProbeFamilies::*family;  // nullptr: always loaded (process tracking and cleanup)
  const char* btf;              // program names in host.bpf.c
  const char* classic;
};

const TracepointSpec kTracepoints[] = {
    {"sched", "sched_switch", &ProbeFamilies::sched, "btf_sched_switch", "tp_sched_switch"},
    {"sched", "sched_wakeup", &ProbeFamilies::wakeup, "btf_sched_wakeup", "tp_sched_wakeup"},
    {"sched", "sched_process_fork", nullptr, "btf_process_fork", "tp_process_fork"},
    {"sched", "sched_process_exec", &ProbeFamilies::process, "btf_process_exec", "tp_process_exec"},
    {"sched", "sched_process_exit", nullptr, "btf_process_exit", "tp_process_exit"},
    {"kmem", "mm_page_alloc", &ProbeFamilies::memory, "btf_page_alloc", "tp_page_alloc"},
    {"block", "block_rq_issue", &ProbeFamilies::block, "btf_block_issue", "tp_block_issue"},
    {"block", "block_rq_complete", &ProbeFamilies::block, "btf_block_complete", "tp_block_complete"},
    {"tcp", "tcp_retransmit_skb", &ProbeFamilies::tcp, "btf_tcp_retransmit", "tp_tcp_retransmit"},
};

// Classic fields host.bpf.c reads: (category/event, field, IP_OFF_* index).
struct ClassicField {
  const char* event;
  const char* field;
  int index;
};
const ClassicField kClassicFields[] = {
    {"sched/sched_switch", "prev_pid", IP_OFF_SW_PREV_PID},
    {"sched/sched_switch", "prev_state", IP_OFF_SW_PREV_STATE},
    {"sched/sched_switch", "next_pid", IP_OFF_SW_NEXT_PID},
    {"sched/sched_wakeup", "pid", IP_OFF_WK_PID},
    {"sched/sched_process_fork", "child_pid", IP_OFF_FORK_CHILD_PID},
    {"sched/sched_process_exec", "old_pid", IP_OFF_EXEC_OLD_PID},
    {"kmem/mm_page_alloc", "order", IP_OFF_PA_ORDER},
    {"block/block_rq_issue", "dev", IP_OFF_BI_DEV},
    {"block/block_rq_issue", "sector", IP_OFF_BI_SECTOR},
    {"block/block_rq_issue", "bytes", IP_OFF_BI_BYTES},
    {"block/block_rq_issue", "rwbs", IP_OFF_BI_RWBS},
    {"block/block_rq_complete", "dev", IP_OFF_BC_DEV},
    {"block/block_rq_complete", "sector", IP_OFF_BC_SECTOR},
    {"block/block_rq_complete", "error", IP_OFF_BC_ERROR},
    {"tcp/tcp_retransmit_skb", "family", IP_OFF_TCP_FAMILY},
    {"tcp/tcp_retransmit_skb", "dport", IP_OFF_TCP_DPORT},
    {"tcp/tcp_retransmit_skb", "daddr", IP_OFF_TCP_DADDR},
    {"tcp/tcp_retransmit_skb", "daddr_v6", IP_OFF_TCP_DADDR6},
};

// Syscalls a thread blocks in: a long blocked span that slept in one of them is sent from its
// exit tracepoint with the thread's full user stacks (host.bpf.c offcpu_sys_exit). Spans in any
// other syscall keep the frame-pointer user and kernel stacks taken at switch-out. Names missing
// from this kernel's tracefs (e.g. no futex_waitv before 5.16) are skipped and counted.
const char* const kBlockingSyscalls[] = {
    "futex",      "futex_waitv",  // locks, cond vars
    "epoll_wait", "epoll_pwait", "epoll_pwait2",    "poll",         "ppoll",           "select",
    "pselect6",   "nanosleep",   "clock_nanosleep", "pause",        "rt_sigtimedwait",  // sleeps, signals
    "read",       "readv",       "pread64",         "write",        "writev",          "pwrite64",
    "fsync",      "fdatasync",   "flock",           "recvfrom",     "recvmsg",         "sendto",
    "sendmsg",    "accept",      "accept4",         "connect",  // sockets
    "wait4",      "waitid",      "ioctl",           "io_getevents", "io_uring_enter",  "msgrcv",
    "semop",      "semtimedop",
};

// "\tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;" -> ("nr_sector", 24)
std::map<std::string, uint32_t> read_format(const std::string& path) {
  std::map<std::string, uint32_t> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t f = line.find("field:"), o = line.find("offset:");
    if (f == std::string::npos || o == std::string::npos) continue;
    std::string decl = line.substr(f + 6, line.find(';', f) - f - 6);
    if (const size_t br = decl.find('['); br != std::string::npos) decl.resize(br);
    const size_t sp = decl.find_last_of(" *");
    const std::string name = sp == std::string::npos ? decl : decl.substr(sp + 1);
    out[name] = static_cast<uint32_t>(std::strtoul(line.c_str() + o + 7, nullptr, 10));
  }
  return out;
}

std::string find_tracefs(const std::string& preferred) {
  for (const std::string& p : {preferred, std::string("/sys/kernel/tracing"), std::string("/sys/kernel/debug/tracing")})
    if (!p.empty() && ::access((p + "/events").c_str(), R_OK) == 0) return p;
  return {};
}

int on_ring_record(void* ctx, void* data, size_t size) {
  if (size < sizeof(ip_record)) return 0;
  auto* self = static_cast<BpfProbes::RecordFn*>(ctx);
  (*self)(*static_cast<const ip_record*>(data));
  return 0;
}

int on_stack_record(void* ctx, void* data, size_t size) {
  constexpr size_t kHead = offsetof(ip_stack_record, ustack);
  if (size < kHead || size > sizeof(ip_stack_record)) return 0;
  auto* fn = static_cast<BpfProbes::StackFn*>(ctx);
  if (*fn) (*fn)(*static_cast<const ip_stack_record*>(data), size);
  return 0;
}

// The rodata every object with stack.bpf.h has.
template <typename Rodata>
void set_stack_rodata(Rodata* ro, const StackOptions& so) {
  ro->ustack_bytes = std::min<uint32_t>(so.ustack_bytes, IP_USTACK_MAX);
  const uint32_t rate = std::max<uint32_t>(so.per_thread_rate, 1);
  ro->stack_interval_ns = 1'000'000'000ull / rate;
  ro->stack_burst_ns = ro->stack_interval_ns * std::max<uint32_t>(so.per_thread_burst, 1);
}

int libbpf_quiet(enum libbpf_print_level level, const char* fmt, va_list args) {
  // Verifier logs and attach failures surface through our own errors/warnings; keep libbpf's
  // debug chatter out of the terminal unless asked for.
  static const bool verbose = std::getenv("INGERO_BPF_VERBOSE") != nullptr;
  if (!verbose && level != LIBBPF_WARN) return 0;
  if (!verbose) return 0;
  return std::vfprintf(stderr, fmt, args);
}

LibKind symbol_library(const std::string& sym) {
  if (sym.rfind("nccl", 0) == 0) return LibKind::kNccl;
  if (sym.rfind("cuda", 0) == 0) return LibKind::kCudart;
  return LibKind::kCuda;
}

bool symbol_enabled(const std::string& sym, const ProbeFamilies& f) {
  if (sym.rfind("nccl", 0) == 0) return f.nccl;
  if (sym == "cudaStreamBeginCapture" || sym == "cudaStreamEndCapture" || sym == "cudaGraphInstantiate" ||
      sym == "cudaGraphLaunch")
    return f.graph;
  if (sym.rfind("cuda", 0) == 0) return f.cuda;
  return f.driver;
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + ts.tv_nsec;
}

int64_t realtime_offset_ns() {
  int64_t best_gap = INT64_MAX, offset = 0;
  for (int i = 0; i < 7; ++i) {
    timespec a{}, r{}, b{};
    ::clock_gettime(CLOCK_MONOTONIC, &a);
    ::clock_gettime(CLOCK_REALTIME, &r);
    ::clock_gettime(CLOCK_MONOTONIC, &b);
    const int64_t ma = a.tv_sec * 1'000'000'000ll + a.tv_nsec;
    const int64_t mb = b.tv_sec * 1'000'000'000ll + b.tv_nsec;
    const int64_t rr = r.tv_sec * 1'000'000'000ll + r.tv_nsec;
    if (mb - ma < best_gap) {
      best_gap = mb - ma;
      offset = rr - (ma + (mb - ma) / 2);
    }
  }
  return offset;
}

std::unique_ptr<BpfProbes> BpfProbes::open(const ProbeOptions& opts, RecordFn on_record, std::string& error,
                                           StackFn on_stack) {
  libbpf_set_print(libbpf_quiet);
  std::unique_ptr<BpfProbes> p(new BpfProbes());
  p->on_record_ = std::move(on_record);
  p->on_stack_ = std::move(on_stack);
  p->families_ = opts.families;
  if (!p->load(opts, error)) return nullptr;
  return p;
}

bool BpfProbes::load(const ProbeOptions& opts, std::string& error) {
  if (opts.filter == FilterMode::kCgroup) {
    struct stat st {};
    if (::stat(opts.cgroup_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      error = "cgroup '" + opts.cgroup_path +
              "' is not a directory (expected a cgroup v2 path "
              "such as /sys/fs/cgroup/system.slice/docker-<id>.scope)";
      return false;
    }
    cgroup_id_ = st.st_ino;  // cgroup v2 id == kernfs inode number on 64-bit kernels
  }

  host_ = ip_host_bpf__open();
  if (!host_) {
    error = std::string("cannot open the host BPF object: ") + std::strerror(errno);
    return false;
  }
  host_->rodata->filter_mode = static_cast<uint32_t>(opts.filter);
  host_->rodata->target_cgroup = cgroup_id_;
  host_->rodata->emit_process = opts.families.process;
  host_->rodata->page_size = static_cast<uint32_t>(::sysconf(_SC_PAGESIZE));
  host_->rodata->offcpu_stack_min_ns = opts.stacks.offcpu_min_ns;
  set_stack_rodata(host_->rodata, opts.stacks);

  btf* vmlinux = btf__load_vmlinux_btf();
  const std::string tracefs = find_tracefs(opts.tracefs);
  bool need_classic = false;
  std::vector<std::pair<bpf_program*, std::string>> to_attach;
  for (const auto& tp : kTracepoints) {
    bpf_program* b = bpf_object__find_program_by_name(host_->obj, tp.btf);
    bpf_program* c = bpf_object__find_program_by_name(host_->obj, tp.classic);
    const bool on = tp.family == nullptr || opts.families.*tp.family;
    const bool has_btf = vmlinux != nullptr &&
                         btf__find_by_name_kind(vmlinux, (std::string("btf_trace_") + tp.name).c_str(),
                                                BTF_KIND_TYPEDEF) >= 0;
    const bool use_btf = on && has_btf && !opts.force_classic;
    const bool use_classic = on && !use_btf;
    if (use_classic && tracefs.empty()) {
      warnings_.push_back(std::string("tracepoint ") + tp.name +
                          ": no BTF for it and no tracefs to read its classic format; not traced "
                          "(fix: mount -t tracefs nodev /sys/kernel/tracing)");
      bpf_program__set_autoload(b, false);
      bpf_program__set_autoload(c, false);
      continue;
    }
    bpf_program__set_autoload(b, use_btf);
    bpf_program__set_autoload(c, use_classic);
    need_classic |= use_classic;
    if (use_btf) to_attach.emplace_back(b, std::string(tp.name) + "=tp_btf");
    if (use_classic) to_attach.emplace_back(c, std::string(tp.name) + "=classic");
  }
  if (vmlinux) btf__free(vmlinux);

  if (need_classic) {
    std::map<std::string, std::map<std::string, uint32_t>> formats;
    for (const auto& f : kClassicFields) {
      auto& fmt = formats[f.event];
      if (fmt.empty()) fmt = read_format(tracefs + "/events/" + f.event + "/format");
      auto it = fmt.find(f.field);
      if (it != fmt.end()) host_->rodata->classic_off[f.index] = it->second;
    }
  }

  // Socket syscalls: classic tracepoints only (there is no tp_btf for individual syscalls).
  const char* net_progs[] = {"sys_enter_sendto", "sys_enter_sendmsg", "sys_enter_recvfrom", "sys_enter_recvmsg",
                             "sys_exit_sendto",  "sys_exit_sendmsg",  "sys_exit_recvfrom",  "sys_exit_recvmsg"};
  bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, host_->obj) {
    const std::string name = bpf_program__name(prog);
    if (name.rfind("sys_", 0) != 0) continue;
    bool on = opts.families.net;
    if (on && (tracefs.empty() ||
               ::access(std::string(tracefs).append("/events/syscalls/").append(name).c_str(), R_OK) != 0)) {
      if (name == net_progs[0])
        warnings_.emplace_back(
            "socket send/recv: syscall tracepoints not available "
            "(kernel without CONFIG_FTRACE_SYSCALLS or tracefs not mounted); "
            "not traced");
      on = false;
    }
    bpf_program__set_autoload(prog, on);
    if (on) to_attach.emplace_back(prog, name + "=classic");
  }

  // Blocked spans sent from the syscall return with full user stacks (host.bpf.c
  // offcpu_sys_exit): one program on the classic exit tracepoint of each syscall a thread blocks
  // in, not on raw sys_exit, which would also run on every uretprobe return (sys_uretprobe).
  // Needs vmlinux BTF (the program reads the user registers through the current task); raw
  // tp_btf sys_exit is the fallback only where tracefs has none of these tracepoints.
  std::vector<std::string> exit_syscalls;
  bool exit_fallback = false;
  {
    btf* vb = btf__load_vmlinux_btf();
    const bool has_btf = vb != nullptr;
    const bool has_raw = vb && btf__find_by_name_kind(vb, "btf_trace_sys_exit", BTF_KIND_TYPEDEF) >= 0;
    if (vb) btf__free(vb);
    const bool want = has_btf && opts.families.sched && opts.stacks.offcpu_min_ns != UINT64_MAX;
    if (want && !tracefs.empty()) {
      for (const char* name : kBlockingSyscalls) {
        if (::access((tracefs + "/events/syscalls/sys_exit_" + name).c_str(), R_OK) == 0)
          exit_syscalls.emplace_back(name);
        else ++exit_syscalls_missing_;
      }
    }
    exit_fallback = want && exit_syscalls.empty() && has_raw && !opts.force_classic;
    bpf_program__set_autoload(host_->progs.offcpu_sys_exit, !exit_syscalls.empty());
    bpf_program__set_autoload(host_->progs.btf_sys_exit, exit_fallback);
    host_->rodata->offcpu_user_at_exit = !exit_syscalls.empty() || exit_fallback;
    if (exit_fallback) to_attach.emplace_back(host_->progs.btf_sys_exit, "sys_exit=tp_btf");
  }
  bpf_map__set_max_entries(host_->maps.host_events, opts.ring_bytes);
  bpf_map__set_max_entries(host_->maps.stack_events, opts.stacks.ring_bytes);
  if (int err = ip_host_bpf__load(host_); err != 0) {
    error = std::string("cannot load the host BPF programs: ") + std::strerror(-err) +
            (err == -EPERM ? " (run as root or grant CAP_BPF and CAP_PERFMON)" : "");
    return false;
  }
  for (auto& [pr, label] : to_attach) {
    bpf_link* l = bpf_program__attach(pr);
    if (!l) {
      warnings_.push_back("tracepoint " + label.substr(0, label.find('=')) +
                          ": attach failed: " + std::strerror(errno) + "; not traced");
      continue;
    }
    links_.push_back(l);
    tps_.emplace_back(label.substr(0, label.find('=')), label.substr(label.find('=') + 1));
  }
  for (const std::string& name : exit_syscalls) {
    bpf_link* l = bpf_program__attach_tracepoint(host_->progs.offcpu_sys_exit, "syscalls",
                                                 ("sys_exit_" + name).c_str());
    if (!l) {
      ++exit_syscalls_missing_;
      continue;
    }
    links_.push_back(l);
    ++exit_syscalls_attached_;
  }
  if (!exit_syscalls.empty()) {
    if (exit_syscalls_attached_ > 0) tps_.emplace_back("sys_exit", "classic");
    else
      warnings_.emplace_back(
          "off-CPU stacks: no syscall exit tracepoint attached; long blocked "
          "spans keep their switch-out stacks (no Python frames)");
  }

  const bool any_gpu = opts.families.cuda || opts.families.driver || opts.families.graph || opts.families.nccl;
  if (any_gpu) {
    gpu_ = ip_gpu_bpf__open();
    if (!gpu_) {
      error = std::string("cannot open the GPU BPF object: ") + std::strerror(errno);
      return false;
    }
    gpu_->rodata->filter_mode = static_cast<uint32_t>(opts.filter);
    gpu_->rodata->target_cgroup = cgroup_id_;
    gpu_->rodata->stack_min_ns = opts.stacks.call_min_ns;
    set_stack_rodata(gpu_->rodata, opts.stacks);
    reuse_shared(gpu_->obj);
    bpf_object__for_each_program(prog, gpu_->obj) {
      const std::string name = bpf_program__name(prog);
      const std::string sym = name.substr(name.find('_') + 1);
      bpf_program__set_autoload(prog, symbol_enabled(sym, opts.families));
    }
    bpf_map__set_max_entries(gpu_->maps.gpu_events, opts.ring_bytes);
    if (int err = ip_gpu_bpf__load(gpu_); err != 0) {
      error = std::string("cannot load the GPU uprobe programs: ") + std::strerror(-err);
      return false;
    }
  }

  if (opts.stacks.sample_hz > 0 && !open_sampler(opts, error)) return false;

  rb_ = ring_buffer__new(bpf_map__fd(host_->maps.host_events), on_ring_record, &on_record_, nullptr);
  if (!rb_) {
    error = std::string("cannot open the host ring buffer: ") + std::strerror(errno);
    return false;
  }
  if (gpu_ && ring_buffer__add(rb_, bpf_map__fd(gpu_->maps.gpu_events), on_ring_record, &on_record_) != 0) {
    error = std::string("cannot open the GPU ring buffer: ") + std::strerror(errno);
    return false;
  }

  // Last: a pass over the rings reads the stack ring after the others.
  if (ring_buffer__add(rb_, bpf_map__fd(host_->maps.stack_events), on_stack_record, &on_stack_) != 0) {
    error = std::string("cannot open the stack ring buffer: ") + std::strerror(errno);
    return false;
  }

  if (opts.filter == FilterMode::kPids)
    for (uint32_t pid : opts.pids) trace_pid(pid);
  return true;
}

void BpfProbes::reuse_shared(bpf_object* obj) {
  // Every map both objects declare (common.bpf.h, stack.bpf.h) is the host object's.
  for (const char* name : {"traced_tgids", "call_stacks", "counters", "stack_events", "py_procs", "py_bins", "py_codes",
                           "stack_tat", "stack_ids"}) {
    bpf_map* m = bpf_object__find_map_by_name(obj, name);
    bpf_map* h = bpf_object__find_map_by_name(host_->obj, name);
    if (m && h) bpf_map__reuse_fd(m, bpf_map__fd(h));
  }
}

bool BpfProbes::open_sampler(const ProbeOptions& opts, std::string& error) {
  sample_ = ip_sample_bpf__open();
  if (!sample_) {
    error = std::string("cannot open the CPU sampler BPF object: ") + std::strerror(errno);
    return false;
  }
  set_stack_rodata(sample_->rodata, opts.stacks);
  reuse_shared(sample_->obj);
  if (int err = ip_sample_bpf__load(sample_); err != 0) {
    error = std::string("cannot load the CPU sampler: ") + std::strerror(-err);
    return false;
  }
  const int ncpu = libbpf_num_possible_cpus();
  int failed = 0, last_err = 0;
  for (int cpu = 0; cpu < ncpu; ++cpu) {
    perf_event_attr a{};
    a.size = sizeof(a);
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    // cpu-clock counts nanoseconds: a fixed period gives the rate from the first tick (frequency
    // mode would start slow and converge).
    a.sample_period = 1'000'000'000ull / opts.stacks.sample_hz;
    const int fd = static_cast<int>(::syscall(__NR_perf_event_open, &a, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) {  // an offline CPU: nothing runs there
      ++failed;
      last_err = errno;
      continue;
    }
    bpf_link* l = bpf_program__attach_perf_event(sample_->progs.on_cpu_sample, fd);
    if (!l) {
      ::close(fd);
      ++failed;
      last_err = errno;
      continue;
    }
    perf_fds_.push_back(fd);
    sample_links_.push_back(l);
  }
  if (sample_links_.empty())
    warnings_.push_back(std::string("CPU sampler: no perf event could be opened (") + std::strerror(last_err) +
                        "); no on-CPU samples");
  else if (failed > 0)
    warnings_.push_back("CPU sampler: " + std::to_string(failed) + " of " + std::to_string(ncpu) +
                        " CPUs without a perf event (offline?)");
  return true;
}

bool BpfProbes::set_python(uint32_t pid, const ip_py_proc& layout) {
  return bpf_map_update_elem(bpf_map__fd(host_->maps.py_procs), &pid, &layout, BPF_ANY) == 0;
}

bool BpfProbes::get_python(uint32_t pid, ip_py_proc& out) const {
  return bpf_map_lookup_elem(bpf_map__fd(host_->maps.py_procs), &pid, &out) == 0;
}

bool BpfProbes::set_python_binary(const ip_py_bin_key& key, const ip_py_bin& bin) {
  return bpf_map_update_elem(bpf_map__fd(host_->maps.py_bins), &key, &bin, BPF_ANY) == 0;
}

void BpfProbes::forget_python(uint32_t pid) { bpf_map_delete_elem(bpf_map__fd(host_->maps.py_procs), &pid); }

bool BpfProbes::read_code(uint32_t pid, uint64_t code, ip_py_code& out) const {
  ip_py_code_key k{};
  k.tgid = pid;
  k.code = code;
  return bpf_map_lookup_elem(bpf_map__fd(host_->maps.py_codes), &k, &out) == 0;
}

uint64_t BpfProbes::held_offcpu_spans() const {
  return host_ && host_->bss ? __atomic_load_n(&host_->bss->held_spans, __ATOMIC_RELAXED) : 0;
}

bool BpfProbes::read_stack_id(uint32_t id, std::vector<uint64_t>& ips) const {
  uint64_t v[IP_KSTACK_MAX] = {};
  if (bpf_map_lookup_elem(bpf_map__fd(host_->maps.stack_ids), &id, v) != 0) return false;
  ips.clear();
  for (uint64_t ip : v) {
    if (!ip) break;
    ips.push_back(ip);
  }
  return true;
}

bool BpfProbes::detach_in_background() {
  // Everything the child may touch is prepared here: after fork() in a threaded process it may
  // only call async-signal-safe functions (close, getppid, nanosleep, _exit).
  std::vector<int> keep;
  for (bpf_link* l : sample_links_) keep.push_back(bpf_link__fd(l));
  for (const UprobeLink& u : uprobe_links_) keep.push_back(bpf_link__fd(u.link));
  for (bpf_link* l : links_) keep.push_back(bpf_link__fd(l));
  keep.insert(keep.end(), perf_fds_.begin(), perf_fds_.end());
  std::sort(keep.begin(), keep.end());
  const int max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 16));
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child > 0) return true;
  for (int fd = 0; fd < max_fd; ++fd)
    if (!std::binary_search(keep.begin(), keep.end(), fd)) ::close(fd);
  const struct timespec tick = {0, 20'000'000};
  for (int i = 0; i < 6000 && ::getppid() == parent; ++i) ::nanosleep(&tick, nullptr);  // at most 2 min
  ::_exit(0);
}

BpfProbes::~BpfProbes() {
  for (bpf_link* l : sample_links_) bpf_link__destroy(l);
  for (int fd : perf_fds_) ::close(fd);
  if (sample_) ip_sample_bpf__destroy(sample_);
  for (const UprobeLink& u : uprobe_links_) bpf_link__destroy(u.link);
  for (bpf_link* l : links_) bpf_link__destroy(l);
  if (rb_) ring_buffer__free(rb_);
  if (gpu_) ip_gpu_bpf__destroy(gpu_);
  if (host_) ip_host_bpf__destroy(host_);
}

void BpfProbes::trace_pid(uint32_t pid) {
  const uint8_t one = 1;
  bpf_map_update_elem(bpf_map__fd(host_->maps.traced_tgids), &pid, &one, BPF_ANY);
}

int BpfProbes::attach_library(const CudaLibrary& lib) {
  if (!gpu_) return 0;
  if (!attached_.insert({lib.dev, lib.ino}).second) return 0;
  // The library's slot in lib_counts: every link of it carries the slot as its cookie. Past
  // IP_MAX_LIBS libraries, the last slot is shared (the self-check then sums them).
  const uint32_t slot = static_cast<uint32_t>(std::min<size_t>(lib_slots_.size(), IP_MAX_LIBS - 1));
  // Pair the programs by symbol: enter_X and exit_X.
  std::map<std::string, std::pair<bpf_program*, bpf_program*>> pairs;
  bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, gpu_->obj) {
    if (!bpf_program__autoload(prog)) continue;
    const std::string name = bpf_program__name(prog);
    const bool enter = name.rfind("enter_", 0) == 0;
    const std::string sym = name.substr(name.find('_') + 1);
    if (symbol_library(sym) != lib.kind) continue;
    (enter ? pairs[sym].first : pairs[sym].second) = prog;
  }
  // Every return probe goes in before any entry probe: a process already running calls these
  // functions while we attach, and an entry seen before its function's return probe is in would
  // be a frame that never pops. This order makes the worst case a return without its entry, which
  // on_exit counts (calls in flight at attach). Symbols missing from the library fail here.
  std::vector<std::string> missing;
  std::vector<std::pair<std::string, bpf_program*>> ready;  // symbol, entry program
  if (gpu_->bss) gpu_->bss->attaching = 1;  // returns without entry are expected until the entries are in
  for (auto& [sym, pr] : pairs) {
    if (!pr.first || !pr.second) continue;
    LIBBPF_OPTS(bpf_uprobe_opts, xo, .bpf_cookie = slot, .retprobe = true, .func_name = sym.c_str());
    bpf_link* x = bpf_program__attach_uprobe_opts(pr.second, -1, lib.path.c_str(), 0, &xo);
    if (!x) {
      missing.push_back(sym);
      continue;
    }
    uprobe_links_.push_back({slot, sym, true, x});
    ready.emplace_back(sym, pr.first);
  }
  int attached = 0;
  for (auto& [sym, entry] : ready) {
    LIBBPF_OPTS(bpf_uprobe_opts, eo, .bpf_cookie = slot, .retprobe = false, .func_name = sym.c_str());
    bpf_link* e = bpf_program__attach_uprobe_opts(entry, -1, lib.path.c_str(), 0, &eo);
    if (!e) {
      // A return probe without its entry only counts unmatched returns: take it out again.
      for (auto it = uprobe_links_.begin(); it != uprobe_links_.end(); ++it)
        if (it->slot == slot && it->ret && it->symbol == sym) {
          bpf_link__destroy(it->link);
          uprobe_links_.erase(it);
          break;
        }
      warnings_.push_back(std::string(lib_kind_name(lib.kind)) + " " + lib.path + ": " + sym +
                          ": uprobe attach failed: " + std::strerror(errno) + "; not traced");
      continue;
    }
    uprobe_links_.push_back({slot, sym, false, e});
    links_uprobe_ += 2;
    ++attached;
  }
  if (gpu_->bss) gpu_->bss->attaching = 0;
  if (!missing.empty()) {
    std::string w = std::string(lib_kind_name(lib.kind)) + " " + lib.path + ": symbol" +
                    (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) w += (i ? ", " : "") + missing[i];
    w += " not found; not traced";
    warnings_.push_back(w);
  }
  if (attached > 0 && lib_slots_.size() < IP_MAX_LIBS) lib_slots_.push_back({lib, monotonic_ns()});
  return attached;
}

std::vector<LibrarySlot> BpfProbes::library_slots() const { return lib_slots_; }

std::vector<LibCounts> BpfProbes::lib_counts() const {
  std::vector<LibCounts> out(lib_slots_.size());
  if (!gpu_ || out.empty()) return out;
  const int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return out;
  std::vector<uint64_t> vals(static_cast<size_t>(ncpu));
  const int fd = bpf_map__fd(gpu_->maps.lib_counts);
  for (uint32_t slot = 0; slot < out.size(); ++slot)
    for (uint32_t k = 0; k < IP_LC_NUM; ++k) {
      const uint32_t idx = slot * IP_LC_NUM + k;
      if (bpf_map_lookup_elem(fd, &idx, vals.data()) != 0) continue;
      for (uint64_t v : vals) out[slot].v[k] += v;
    }
  return out;
}

uint64_t BpfProbes::uprobe_recursion_misses() const {
  uint64_t n = 0;
  if (!gpu_) return n;
  bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, gpu_->obj) {
    const int fd = bpf_program__fd(prog);
    if (fd < 0) continue;
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) n += info.recursion_misses;
  }
  return n;
}

bool BpfProbes::detach_probe(const std::string& symbol, bool retprobe) {
  for (auto it = uprobe_links_.begin(); it != uprobe_links_.end(); ++it)
    if (it->symbol == symbol && it->ret == retprobe) {
      bpf_link__destroy(it->link);
      uprobe_links_.erase(it);
      return true;
    }
  return false;
}

int BpfProbes::poll(int timeout_ms) {
  // Records are submitted without wakeups, so epoll mostly just waits out the timeout; the
  // consume pass is what reads the rings.
  const int n = ring_buffer__poll(rb_, timeout_ms);
  const int m = ring_buffer__consume(rb_);
  return n < 0 ? n : (m < 0 ? m : n + m);
}

int BpfProbes::consume() { return ring_buffer__consume(rb_); }

ProbeCounters BpfProbes::counters() const {
  ProbeCounters c;
  const int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return c;
  std::vector<uint64_t> vals(static_cast<size_t>(ncpu));
  const int fd = bpf_map__fd(host_->maps.counters);
  for (uint32_t k = 0; k < IP_NUM_COUNTERS; ++k) {
    if (bpf_map_lookup_elem(fd, &k, vals.data()) != 0) continue;
    for (uint64_t v : vals) c.v[k] += v;
  }
  return c;
}

namespace {
// Visits every value of a hash map (batched lookups: one syscall per 256 entries).
template <typename F>
void scan_map(const bpf_map* m, F&& visit) {
  constexpr uint32_t kChunk = 256;
  const int fd = bpf_map__fd(m);
  const size_t value_size = bpf_map__value_size(m);
  std::vector<uint8_t> keys(static_cast<size_t>(kChunk) * bpf_map__key_size(m));
  std::vector<uint8_t> vals(kChunk * value_size);
  uint32_t in_batch = 0, out_batch = 0;
  bool first = true;
  for (int guard = 0; guard < 1024; ++guard) {
    uint32_t n = kChunk;
    LIBBPF_OPTS(bpf_map_batch_opts, bo);
    const int rc = bpf_map_lookup_batch(fd, first ? nullptr : &in_batch, &out_batch, keys.data(), vals.data(), &n, &bo);
    const int err = rc ? errno : 0;
    for (uint32_t i = 0; i < n; ++i) visit(vals.data() + i * value_size);
    if (rc != 0 && err != ENOSPC) break;  // ENOENT: done
    in_batch = out_batch;
    first = false;
  }
}
}  // namespace

uint64_t BpfProbes::oldest_open(uint64_t now_mono, uint64_t call_max_age_ns, uint64_t context_max_age_ns) const {
  uint64_t oldest = UINT64_MAX;
  uint64_t floor = now_mono > call_max_age_ns ? now_mono - call_max_age_ns : 0;
  auto consider = [&](uint64_t ts) {
    if (ts >= floor && ts < oldest) oldest = ts;
  };
  if (gpu_)
    scan_map(host_->maps.call_stacks, [&](const uint8_t* p) {
      ip_call_stack s;
      std::memcpy(&s, p, sizeof(s));
      const uint32_t d = s.depth < IP_MAX_DEPTH ? s.depth : IP_MAX_DEPTH;
      for (uint32_t i = 0; i < d; ++i) consider(s.frames[i].ts);
    });
  // Every other map of open intervals (off-CPU, block requests, socket calls) starts its value
  // with the entry timestamp.
  auto scan_ts = [&](bpf_map* m) {
    scan_map(m, [&](const uint8_t* p) {
      uint64_t ts;
      std::memcpy(&ts, p, sizeof(ts));
      consider(ts);
    });
  };
  floor = now_mono > context_max_age_ns ? now_mono - context_max_age_ns : 0;
  if (families_.sched) {
    scan_ts(host_->maps.offcpu);
    scan_ts(host_->maps.offcpu_done);  // ended spans waiting for their syscall return
  }
  if (families_.block) scan_ts(host_->maps.blk_reqs);
  if (families_.net) scan_ts(host_->maps.net_calls);
  return oldest;
}

std::map<uint32_t, ProcessMisses> BpfProbes::process_misses(std::vector<uint64_t>* open_by_slot) const {
  std::map<uint32_t, ProcessMisses> out;
  if (!gpu_) return out;
  scan_map(host_->maps.call_stacks, [&](const uint8_t* p) {
    ip_call_stack s;
    std::memcpy(&s, p, sizeof(s));
    if (open_by_slot)
      for (uint32_t i = 0; i < s.depth && i < IP_MAX_DEPTH; ++i)
        if (s.frames[i].lib < open_by_slot->size()) ++(*open_by_slot)[s.frames[i].lib];
    const uint64_t excess = s.unmatched > IP_MAX_DEPTH ? s.unmatched - IP_MAX_DEPTH : 0;
    if (s.lost == 0 && excess == 0) return;
    ProcessMisses& m = out[s.tgid];
    m.lost_entries += s.lost;
    m.unmatched_returns += excess;
  });
  return out;
}

}  // namespace ingero::bpf
