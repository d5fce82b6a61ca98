// LiveSource: poller thread, queue, reorder buffer and watermark; see live_source.h.
#include "bpf/live_source.h"

#include <ctime>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <concurrentqueue/blockingconcurrentqueue.h>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "model/ops.h"

namespace ingero::bpf {

struct LiveSource::Queue {
  // Blocks are allocated as the queue fills and kept: the initial size is a typical backlog, the
  // bound (LiveOptions::queue_max) is enforced by the poller.
  moodycamel::BlockingConcurrentQueue<Event> q{1 << 13};
};

namespace {
bool probed_call(uint8_t source) {
  return source == IP_SRC_CUDA || source == IP_SRC_DRIVER || source == IP_SRC_GRAPH || source == IP_SRC_NCCL;
}

// When a process started, in unix ns, from /proc/<pid>/stat's starttime (clock ticks since boot);
// 0 when it cannot be read (the process is gone).
uint64_t process_start_unix(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  // Fields 3.. follow the name; starttime is field 22.
  for (int i = 3; i < 22 && rest >> field;) ++i;
  unsigned long long ticks = 0;
  if (!(rest >> ticks)) return 0;
  const long hz = ::sysconf(_SC_CLK_TCK);
  timespec boot{}, real{};
  if (hz <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 || ::clock_gettime(CLOCK_REALTIME, &real) != 0) return 0;
  const auto ns = [](const timespec& t) { return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + t.tv_nsec; };
  const uint64_t boot_unix = ns(real) - ns(boot);
  return boot_unix + ticks * (1'000'000'000ull / static_cast<uint64_t>(hz));
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string families_text(const ProbeFamilies& f) {
  std::string s;
  auto add = [&](bool on, const char* n) {
    if (on) s += (s.empty() ? "" : ",") + std::string(n);
  };
  add(f.cuda, "cuda");
  add(f.driver, "driver");
  add(f.graph, "graph");
  add(f.nccl, "nccl");
  add(f.sched, "sched");
  add(f.wakeup, "wakeup");
  add(f.process, "process");
  add(f.memory, "memory");
  add(f.block, "block");
  add(f.tcp, "tcp");
  add(f.net, "net");
  return s;
}
}  // namespace

LiveSource::LiveSource(const LiveOptions& opts)
    : opts_(opts), conv_(realtime_offset_ns()), queue_(std::make_unique<Queue>()), discovery_(opts.discovery) {}

std::unique_ptr<LiveSource> LiveSource::start(const LiveOptions& opts, std::string& error) {
  std::unique_ptr<LiveSource> s(new LiveSource(opts));
  LiveSource* self = s.get();
  s->trace_started_unix_ = s->conv_.to_unix(monotonic_ns());
  const StackOptions& so = opts.probes.stacks;
  const bool stacks = so.call_min_ns != UINT64_MAX || so.offcpu_min_ns != UINT64_MAX || so.sample_hz > 0;
  s->probes_ = BpfProbes::open(
      opts.probes,
      [self](const ip_record& r) {
        self->records_.fetch_add(1, std::memory_order_relaxed);
        if (r.source == IP_SRC_HOST && r.op == IP_OP_TASK_NAME) {  // a name, not an event
          self->note_task_name(r);
          return;
        }
        Event e;
        std::string reason;
        if (!self->conv_.convert(r, e, reason)) {
          self->unknown_.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        if ((r.flags & IP_REC_STACKIDS) && self->resolver_ && r.source == IP_SRC_HOST && r.op == op::kSchedSwitch) {
          if (!self->resolver_->noted(r.pid)) self->resolver_->note_process(r.pid);
          e.stack_id = self->resolver_->resolve_offcpu(r.pid, static_cast<uint32_t>(r.arg2),
                                                       static_cast<uint32_t>(r.arg2 >> 32));
        }
        if (r.source == IP_SRC_HOST && r.op == op::kProcessExit && r.pid == r.tid)
          self->forget_at_[r.pid] = monotonic_ns() + 5'000'000'000ull;
        if (probed_call(r.source)) {
          self->lib_received_[r.state & (IP_MAX_LIBS - 1)].fetch_add(1, std::memory_order_relaxed);
          self->note_capture(r.pid, r.state);
        }
        self->on_event(e);
      },
      error,
      [self](const ip_stack_record& r, size_t len) {
        self->records_.fetch_add(1, std::memory_order_relaxed);
        Event e;
        std::string reason;
        if (!self->conv_.convert(r.rec, e, reason)) {
          self->unknown_.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        if (self->resolver_) e.stack_id = self->resolver_->resolve(r, len);
        if (probed_call(r.rec.source)) {
          self->lib_received_[r.rec.state & (IP_MAX_LIBS - 1)].fetch_add(1, std::memory_order_relaxed);
          self->note_capture(r.rec.pid, r.rec.state);
        }
        self->on_event(e, r.comm);
      });
  if (!s->probes_) return nullptr;
  if (stacks) {
    s->resolver_ = std::make_unique<StackResolver>(*s->probes_);
    // The interpreters on this machine, before any process of theirs is seen: BPF registers such
    // a process itself at its first stack (a short job can be over before the poller sees it).
    s->resolver_->learn_interpreters();
  }
  for (auto& w : s->probes_->take_warnings()) s->warn(std::move(w));

  // Libraries: everything findable now. In --pid mode, the traced processes' own maps first so
  // their copies are attached even when the same file is known under another path.
  if (opts.probes.filter == FilterMode::kPids)
    for (uint32_t pid : opts.probes.pids) s->attach_found(s->discovery_.scan_pid(pid));
  s->attach_found(s->discovery_.initial_scan());
  if (s->resolver_ && opts.probes.filter == FilterMode::kPids)
    for (uint32_t pid : opts.probes.pids) {  // before any record: Python walks from the first call
      s->resolver_->note_process(pid);
      s->seen_pids_.insert(pid);
    }
  if (s->resolver_)
    for (auto& w : s->resolver_->take_warnings()) s->warn(std::move(w));
  const auto& f = opts.probes.families;
  auto have = [&](LibKind k) {
    for (const auto& l : s->libs_)
      if (l.kind == k) return true;
    return false;
  };
  if ((f.cuda || f.graph) && !have(LibKind::kCudart))
    s->warn(
        "libcudart not found (processes' maps, ld.so.cache, CUDA toolkit, Python wheels); "
        "CUDA runtime calls are not traced until a process loads it (or pass --cuda-lib PATH)");
  if (f.driver && !have(LibKind::kCuda))
    s->warn(
        "libcuda not found (no NVIDIA driver installed?); driver calls are not traced until "
        "a process loads it");
  if (f.nccl && !have(LibKind::kNccl))
    s->warn("libnccl not found; NCCL collectives are not traced until a process loads it");

  // Session metadata.
  TraceMeta& m = s->meta_;
  m.path = "<live>";
  m.format = "ingero-pipeline-live";
  SessionInfo si;
  si.started_at = s->trace_started_unix_;
  utsname u{};
  if (::uname(&u) == 0) si.kernel = std::string(u.sysname) + " " + u.release;
  si.os_release = read_first_line("/etc/debian_version");
  si.cpu_cores = static_cast<uint32_t>(::sysconf(_SC_NPROCESSORS_ONLN));
  struct sysinfo sinfo {};
  if (::sysinfo(&sinfo) == 0) si.mem_total_mb = sinfo.totalram * sinfo.mem_unit / (1024UL * 1024UL);
  si.tool_ver = "ingero-pipeline 0.1.0";
  switch (opts.probes.filter) {
    case FilterMode::kAllCuda: si.pid_filter = "all CUDA processes"; break;
    case FilterMode::kPids:
      for (uint32_t p : opts.probes.pids) si.pid_filter += (si.pid_filter.empty() ? "" : ",") + std::to_string(p);
      break;
    case FilterMode::kCgroup: si.pid_filter = "cgroup " + opts.probes.cgroup_path; break;
  }
  si.flags = "families=" + families_text(f);
  if (stacks) {
    auto ns = [](uint64_t v) { return v == UINT64_MAX ? std::string("off") : std::to_string(v); };
    si.flags += "; stack_min_ns=" + ns(so.call_min_ns) + "; offcpu_stack_min_ns=" + ns(so.offcpu_min_ns) +
                "; sample_hz=" + std::to_string(so.sample_hz) + "; ustack_bytes=" + std::to_string(so.ustack_bytes);
  }
  // Names of the processes known now (the engine reads them when a run starts); later ones are
  // added as their first events are delivered.
  for (uint32_t pid : opts.probes.pids) {
    const std::string comm = read_first_line("/proc/" + std::to_string(pid) + "/comm");
    if (!comm.empty()) m.process_names[pid] = comm;
  }
  m.sessions.push_back(si);

  const uint64_t now = monotonic_ns();
  s->wm_mono_.store(now > opts.lag_ns ? now - opts.lag_ns : 0);
  s->thread_ = std::thread([self] { self->poller(); });
  return s;
}

LiveSource::~LiveSource() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void LiveSource::stop() { stop_.store(true); }

void LiveSource::detach_in_background() {
  stop();
  if (thread_.joinable()) thread_.join();
  if (probes_) probes_->detach_in_background();
}

void LiveSource::warn(std::string w) {
  std::lock_guard<std::mutex> lk(mu_);
  warnings_.push_back(std::move(w));
}

std::vector<std::string> LiveSource::take_warnings() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(warnings_, {});
}

std::vector<CudaLibrary> LiveSource::libraries() const {
  std::lock_guard<std::mutex> lk(mu_);
  return libs_;
}

void LiveSource::on_event(Event& e, const char* comm16) {
  if (resolver_ && e.pid && seen_pids_.insert(e.pid).second) {
    resolver_->note_process(e.pid);
    for (auto& w : resolver_->take_warnings()) warn(std::move(w));
  }
  // Thread names: the one BPF read at the event when there is one (the thread may be gone by
  // now), else /proc once per thread.
  if (e.tid && !named_tids_.count(e.tid)) {
    std::string comm = comm16 ? std::string(comm16, strnlen(comm16, 16)) : std::string();
    if (comm.empty() && tried_tids_.insert(e.tid).second)
      comm = read_first_line("/proc/" + std::to_string(e.pid ? e.pid : e.tid) + "/task/" + std::to_string(e.tid) +
                             "/comm");
    if (!comm.empty()) {
      named_tids_.insert(e.tid);
      std::lock_guard<std::mutex> lk(mu_);
      new_threads_.emplace_back(e.tid, std::move(comm));
    }
  }
  pending_.push_back(e);
}

void LiveSource::note_task_name(const ip_record& r) {
  char comm[17] = {};
  std::memcpy(comm, &r.arg0, 16);  // arg0..arg1
  std::string name(comm, strnlen(comm, 16));
  if (name.empty()) return;
  named_tids_.insert(r.tid);  // on_event need not read /proc for it
  std::lock_guard<std::mutex> lk(mu_);
  new_task_names_.emplace_back(r.tid, std::move(name));
}

void LiveSource::request_detach(const std::string& symbol, bool retprobe) {
  std::lock_guard<std::mutex> lk(mu_);
  detach_requests_.emplace_back(symbol, retprobe);
}

void LiveSource::note_capture(uint32_t pid, uint32_t slot) {
  uint32_t& seen = capture_slots_[pid];
  const uint32_t bit = 1u << (slot & (IP_MAX_LIBS - 1));
  if (seen & bit) return;
  const bool first = seen == 0;
  seen |= bit;
  // Capture through this library is complete from the moment its probes were all in; for the
  // process, from the latest such moment of the libraries its calls came through, or its start.
  const std::vector<LibrarySlot> slots = probes_->library_slots();
  uint64_t attached_mono = 0;
  for (uint32_t i = 0; i < slots.size(); ++i)
    if (seen & (1u << i)) attached_mono = std::max(attached_mono, slots[i].attached_mono);
  if (first) started_of_[pid] = process_start_unix(pid);
  ProcessCapture c;
  c.attached_at = conv_.to_unix(attached_mono);
  c.started_at = started_of_[pid];
  c.predates = c.started_at != 0 && c.started_at < trace_started_unix_;
  if (c.started_at > c.attached_at) c.attached_at = c.started_at;
  std::lock_guard<std::mutex> lk(mu_);
  new_captures_.emplace_back(pid, c);
}

void LiveSource::self_check(uint64_t now_mono) {
  const std::vector<LibrarySlot> slots = probes_->library_slots();
  const std::vector<LibCounts> counts = probes_->lib_counts();
  std::vector<uint64_t> open(slots.size(), 0);
  const std::map<uint32_t, ProcessMisses> procs = probes_->process_misses(&open);
  std::map<std::string, uint64_t> missed;
  uint64_t total = 0;
  for (size_t i = 0; i < slots.size() && i < counts.size(); ++i) {
    const LibCounts& c = counts[i];
    const uint64_t enter = c.v[IP_LC_ENTER], ret = c.v[IP_LC_RETURN], unmatched = c.v[IP_LC_UNMATCHED];
    const uint64_t drop = c.v[IP_LC_DROP];
    const uint64_t paired = ret > unmatched ? ret - unmatched : 0;
    const uint64_t received = lib_received_[i].load(std::memory_order_relaxed);
    // Entries that neither returned nor are still open: their returns were not seen.
    const uint64_t no_return = enter > paired + open[i] ? enter - paired - open[i] : 0;
    // Returns without their entry, beyond those of calls in flight at attach (the first second).
    CheckState& cs = check_[i];
    if (!cs.based && now_mono >= slots[i].attached_mono + 1'000'000'000ull) {
      cs.based = true;
      cs.unmatched_base = unmatched;
    }
    const uint64_t no_entry = cs.based && unmatched > cs.unmatched_base ? unmatched - cs.unmatched_base : 0;
    // Paired calls whose record neither arrived nor was counted as a ring drop (the rings were
    // just drained; a few may be in flight between the counter and the ring).
    const uint64_t no_record = paired > received + drop ? paired - received - drop : 0;
    const std::string lib = std::string(lib_kind_name(slots[i].lib.kind)) + " " + slots[i].lib.path;
    // Tolerance: a call can be open on a thread that exits, a record can be in flight.
    const uint64_t slack = std::max<uint64_t>(16, enter / 10000);
    auto report = [&](uint64_t n, uint64_t& warned, const char* what) {
      if (n <= slack) return;
      missed[lib + ": " + what] = n;
      total += n;
      if (n > warned + slack) {
        warn("self-check: " + lib + ": " + std::to_string(n) + " " + what + " (kernel counted " +
             std::to_string(enter) + " entries, " + std::to_string(ret) + " returns; " + std::to_string(received) +
             " calls delivered); those calls are missing from the trace");
        warned = n;
      }
    };
    report(no_return, cs.warned_returns, "calls entered whose return was not seen");
    report(no_entry, cs.warned_entries, "returns whose entry was not seen (after the first second)");
    report(no_record, cs.warned_records, "paired calls whose record never arrived");
  }
  // Hits the kernel skipped (a BPF program already running on that CPU: an uprobe program that
  // was preempted, a tracepoint's): counted by the kernel per program, not per library.
  const uint64_t skipped = probes_->uprobe_recursion_misses();
  if (skipped > 0) {
    const std::string what = "uprobes: probe hits the kernel skipped (another BPF program was running on that CPU)";
    missed[what] = skipped;
    total += skipped;
    if (skipped > warned_skipped_ + std::max<uint64_t>(16, skipped / 100)) {
      warn("self-check: " + std::to_string(skipped) + " " + what + "; those calls' entries or returns are missing");
      warned_skipped_ = skipped;
    }
  }
  for (const auto& [pid, m] : procs) {
    const uint64_t n = m.lost_entries + m.unmatched_returns;
    if (n <= 16) continue;
    std::string name = read_first_line("/proc/" + std::to_string(pid) + "/comm");
    const std::string who = "pid " + std::to_string(pid) + (name.empty() ? "" : " (" + name + ")");
    missed[who + ": calls lost on its threads (entries without returns, returns without entries)"] = n;
    uint64_t& warned = warned_procs_[pid];
    if (n > warned + 16) {
      warn("self-check: " + who + ": " + std::to_string(m.lost_entries) + " calls entered without a return, " +
           std::to_string(m.unmatched_returns) + " returns without an entry; its calls are being missed");
      warned = n;
    }
  }
  missed_.store(total, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(mu_);
  missed_now_ = std::move(missed);
}

void LiveSource::attach_found(const std::vector<CudaLibrary>& libs) {
  for (const auto& lib : libs) {
    const int n = probes_->attach_library(lib);
    for (auto& w : probes_->take_warnings()) warn(std::move(w));
    if (n > 0 && resolver_) {
      const std::string base = lib.path.substr(lib.path.find_last_of('/') + 1);
      if (lib.kind == LibKind::kCudart) resolver_->set_module(Source::kCuda, base);
      if (lib.kind == LibKind::kCuda) resolver_->set_module(Source::kDriver, base);
      if (lib.kind == LibKind::kNccl) resolver_->set_module(Source::kNccl, base);
    }
    if (n > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      libs_.push_back(lib);
    }
  }
}

void LiveSource::poller() {
  using clock = std::chrono::steady_clock;
  auto next_scan = clock::now(), next_discovery = clock::now() + std::chrono::nanoseconds(opts_.rediscover_interval_ns);
  uint64_t page_start = monotonic_ns(), page_bytes = 0, page_count = 0;
  const uint64_t start_mono = page_start;
  {
    const ProbeCounters c0 = probes_->counters();
    page_bytes = c0.v[IP_CNT_PAGE_BYTES];
    page_count = c0.v[IP_CNT_PAGE_COUNT];
  }
  uint64_t oldest = UINT64_MAX;
  pending_.reserve(4096);
  auto flush = [&] {
    if (pending_.empty()) return;
    // Bounded: when the engine falls behind, drop here (counted) rather than grow without limit.
    if (queue_->q.size_approx() + pending_.size() > opts_.queue_max) {
      LossSpan span;
      span.start_ns = UINT64_MAX;
      for (const Event& e : pending_) {
        span.start_ns = std::min(span.start_ns, e.ts_ns);
        span.end_ns = std::max(span.end_ns, e.end_ns());
      }
      span.queue = pending_.size();
      {
        std::lock_guard<std::mutex> lk(mu_);
        losses_.add_loss(span);
        ++losses_version_;
      }
      queue_drops_.fetch_add(pending_.size(), std::memory_order_relaxed);
    } else {
      queue_->q.enqueue_bulk(pending_.data(), pending_.size());
    }
    pending_.clear();
  };
  uint64_t scan_time = 0;
  uint64_t next_check = monotonic_ns() + 1'000'000'000ull;
  for (;;) {
    const bool last = stop_.load();
    probes_->poll(last ? 0 : opts_.poll_timeout_ms);
    ProbeCounters c;
    const bool scan = last || clock::now() >= next_scan;
    if (scan) {
      // Open spans first, then the drain: a call open at the scan holds the watermark at its
      // entry; one that returned before the scan is committed before the drain below.
      next_scan = clock::now() + std::chrono::milliseconds(20);
      scan_time = monotonic_ns();
      oldest = probes_->oldest_open(scan_time, opts_.max_hold_ns, opts_.context_hold_ns);
      c = probes_->counters();
    }
    // This pass empties every ring, so all records committed before `t` are in hand.
    const uint64_t t = monotonic_ns();
    probes_->consume();
    if (resolver_) {
      // Before the events are queued: next() always finds an event's stack in meta().
      auto st = resolver_->take_new();
      if (!st.empty()) {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& x : st) new_stacks_.push_back(std::move(x));
      }
    }
    flush();

    if (scan) {
      dropped_[IP_RING_GPU].store(c.v[IP_CNT_DROP_GPU]);
      dropped_[IP_RING_HOST].store(c.v[IP_CNT_DROP_HOST]);
      depth_.store(c.v[IP_CNT_DEPTH]);
      unmatched_.store(c.v[IP_CNT_UNMATCHED]);
      no_slot_.store(c.v[IP_CNT_NO_SLOT]);
      dropped_[IP_RING_STACK].store(c.v[IP_CNT_DROP_STACK]);
      stack_records_.store(c.v[IP_CNT_STACKS]);
      stacks_rate_.store(c.v[IP_CNT_STACK_RATE]);
      samples_.store(c.v[IP_CNT_SAMPLES]);
      python_self_.store(c.v[IP_CNT_PY_SELF]);
      if (resolver_) {
        const StackResolverStats rs = resolver_->stats();
        stacks_resolved_.store(rs.resolved);
        stacks_unique_.store(rs.unique);
        python_stacks_.store(rs.python_stacks);
        python_procs_.store(rs.python_procs);
        for (auto& w : resolver_->take_warnings()) warn(std::move(w));
        // Processes that exited a while ago: their records have drained.
        for (auto it = forget_at_.begin(); it != forget_at_.end();) {
          if (it->second > scan_time) {
            ++it;
            continue;
          }
          resolver_->forget_process(it->first);
          seen_pids_.erase(it->first);
          it = forget_at_.erase(it);
        }
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        // Stack-ring overflow is not an event loss (the call still goes out, without its stack).
        // Ring drops since the last read were submitted between the two reads.
        const uint64_t gpu = c.v[IP_CNT_DROP_GPU], host = c.v[IP_CNT_DROP_HOST];
        if (gpu > loss_gpu_ || host > loss_host_) {
          LossSpan span;
          span.start_ns = conv_.to_unix(loss_scan_mono_ ? loss_scan_mono_ : start_mono);
          span.end_ns = conv_.to_unix(scan_time);
          span.gpu = gpu > loss_gpu_ ? gpu - loss_gpu_ : 0;
          span.host = host > loss_host_ ? host - loss_host_ : 0;
          losses_.add_loss(span);
          ++losses_version_;
        }
        loss_gpu_ = std::max(loss_gpu_, gpu);
        loss_host_ = std::max(loss_host_, host);
        loss_scan_mono_ = scan_time;
      }
      if (last || scan_time >= next_check) {
        self_check(scan_time);
        next_check = scan_time + 1'000'000'000ull;
      }
      if (opts_.probes.families.memory && (last || t - page_start >= opts_.page_interval_ns)) {
        // Page allocations are summed in the kernel; one host-wide event per interval.
        const uint64_t db = c.v[IP_CNT_PAGE_BYTES] - page_bytes;
        const uint64_t dc = c.v[IP_CNT_PAGE_COUNT] - page_count;
        if (dc > 0) {
          Event e;
          e.ts_ns = conv_.to_unix(page_start);
          e.dur_ns = scan_time - page_start;
          e.arg0 = db;
          e.arg1 = dc;
          e.source = Source::kHost;
          e.op = op::kPageAlloc;
          pending_.push_back(e);
          flush();
        }
        page_bytes = c.v[IP_CNT_PAGE_BYTES];
        page_count = c.v[IP_CNT_PAGE_COUNT];
        page_start = scan_time;
      }
    }
    // Nothing that started before this can still arrive, except records in flight (the lag).
    uint64_t wm = std::min({t, scan_time, oldest});
    if (opts_.probes.families.memory) wm = std::min(wm, page_start);
    wm = wm > opts_.lag_ns ? wm - opts_.lag_ns : 0;
    if (wm > wm_mono_.load(std::memory_order_relaxed)) wm_mono_.store(wm, std::memory_order_release);
    if (last) break;

    std::vector<std::pair<std::string, bool>> detach;
    {
      std::lock_guard<std::mutex> lk(mu_);
      detach.swap(detach_requests_);
    }
    for (const auto& [sym, ret] : detach)
      if (!probes_->detach_probe(sym, ret))
        warn("request_detach: no " + std::string(ret ? "return" : "entry") + " probe on " + sym);

    if (clock::now() >= next_discovery) {
      next_discovery = clock::now() + std::chrono::nanoseconds(opts_.rediscover_interval_ns);
      attach_found(discovery_.poll());
    }
  }
  poller_done_.store(true, std::memory_order_release);
}

void LiveSource::late(const Event& e) {
  if (!is_gpu_api(e.source)) {
    // A context interval open longer than context_hold: deliver it (first in the next batch).
    late_context_.push_back(e);
    late_context_.back().flags |= event_flags::kLate;
    return;
  }
  ++late_;
  meta_.health.skip(op_name(e.source, e.op) +
                    " older than the watermark already delivered (open "
                    "longer than --max-hold); dropped");
}

bool LiveSource::next(Batch& out) {
  if (finished_) return false;
  out.events.clear();
  out.final = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(opts_.batch_interval_ns);
  std::vector<Event>& buf = dequeued_;
  buf.resize(4096);
  for (;;) {
    const bool done = poller_done_.load(std::memory_order_acquire);
    const uint64_t wm_mono = wm_mono_.load(std::memory_order_acquire);
    for (;;) {
      const size_t n = queue_->q.try_dequeue_bulk(buf.data(), buf.size());
      for (size_t i = 0; i < n; ++i)
        if (!reorder_.push(buf[i])) late(buf[i]);
      if (n < buf.size()) break;
    }
    const uint64_t wm = done ? UINT64_MAX : conv_.to_unix(wm_mono);
    if (!late_context_.empty()) {
      // Behind every event still held (they start before the released watermark): sorted, they
      // go before this call's releases and keep the batch sorted.
      std::sort(late_context_.begin(), late_context_.end(),
                [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
      if (!out.events.empty() && out.events.back().ts_ns > late_context_.front().ts_ns) {
        // Events already in this batch are newer: merge to keep it sorted.
        std::vector<Event> merged;
        merged.reserve(out.events.size() + late_context_.size());
        std::merge(out.events.begin(), out.events.end(), late_context_.begin(), late_context_.end(),
                   std::back_inserter(merged), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
        out.events.swap(merged);
      } else {
        out.events.insert(out.events.end(), late_context_.begin(), late_context_.end());
      }
      late_delivered_.fetch_add(late_context_.size(), std::memory_order_relaxed);
      late_context_.clear();
    }
    reorder_.release(wm, out.events);
    reorder_size_.store(reorder_.size(), std::memory_order_relaxed);
    if (reorder_.size() > reorder_peak_.load(std::memory_order_relaxed))
      reorder_peak_.store(reorder_.size(), std::memory_order_relaxed);
    if (wm > last_wm_) last_wm_ = wm;
    if (done || out.events.size() >= opts_.batch_max || std::chrono::steady_clock::now() >= deadline) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& [id, st] : new_stacks_) meta_.stacks.emplace(id, std::move(st));
        new_stacks_.clear();
        for (auto& [tid, name] : new_threads_) meta_.thread_names.emplace(tid, std::move(name));
        new_threads_.clear();
        // Names of tasks that ran instead of traced threads: the latest wins (a reused tid).
        for (auto& [tid, name] : new_task_names_) meta_.thread_names[tid] = std::move(name);
        new_task_names_.clear();
        for (auto& [pid, c] : new_captures_) meta_.captures[pid] = c;  // a later one supersedes
        new_captures_.clear();
        meta_.health.missed = missed_now_;
      }
      for (Event& e : out.events) {
        e.id = ++next_id_;
        if (e.pid && !meta_.process_names.count(e.pid)) {
          std::string comm = read_first_line("/proc/" + std::to_string(e.pid) + "/comm");
          meta_.process_names[e.pid] = comm.empty() ? "pid " + std::to_string(e.pid) : comm;
        }
      }
      delivered_ += out.events.size();
      out.watermark = last_wm_;
      out.seq = seq_++;
      meta_.health.rows_read = delivered_;
      meta_.health.dropped_events = drops_total();
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (losses_copied_ != losses_version_) {
          meta_.health.loss_spans = losses_.loss_spans;
          losses_copied_ = losses_version_;
        }
      }
      if (!out.events.empty()) {
        if (meta_.first_ts == 0) meta_.first_ts = out.events.front().ts_ns;
        meta_.last_ts = std::max(meta_.last_ts, out.events.back().ts_ns);
      }
      if (done) {
        out.final = true;
        out.watermark = UINT64_MAX;
        finished_ = true;
        if (const uint64_t unk = unknown_.load(); unk) meta_.health.skip("BPF records with an unknown source/op", unk);
        SessionInfo& si = meta_.sessions.back();
        si.stopped_at = conv_.to_unix(monotonic_ns());
        si.flags += "; dropped_stack=" + std::to_string(dropped_[IP_RING_STACK].load()) +
                    "; dropped_gpu=" + std::to_string(dropped_[IP_RING_GPU].load()) +
                    "; dropped_host=" + std::to_string(dropped_[IP_RING_HOST].load()) +
                    "; dropped_queue=" + std::to_string(queue_drops_.load());
      }
      return true;
    }
    // Wait for records (or the next watermark step) without spinning.
    Event first;
    if (queue_->q.wait_dequeue_timed(first, std::chrono::milliseconds(5))) {
      if (!reorder_.push(first)) late(first);
    }
  }
}

LiveStats LiveSource::stats() const {
  LiveStats s;
  s.records = records_.load();
  s.delivered = delivered_;
  s.late = late_;
  s.late_delivered = late_delivered_.load();
  for (int i = 0; i < IP_NUM_RINGS; ++i) s.dropped[i] = dropped_[i].load();
  s.queue_dropped = queue_drops_.load();
  s.depth_overflow = depth_.load();
  s.unmatched = unmatched_.load();
  s.no_slot = no_slot_.load();
  s.reorder_size = reorder_size_.load();
  s.reorder_peak = reorder_peak_.load();
  s.stack_records = stack_records_.load();
  s.stacks_lost = dropped_[IP_RING_STACK].load();
  s.stacks_rate_limited = stacks_rate_.load();
  s.samples = samples_.load();
  s.stacks_resolved = stacks_resolved_.load();
  s.stacks_unique = stacks_unique_.load();
  s.python_stacks = python_stacks_.load();
  s.python_procs = python_procs_.load();
  s.python_self = python_self_.load();
  s.missed = missed_.load();
  std::lock_guard<std::mutex> lk(mu_);
  s.libraries = libs_.size();
  s.uprobes = probes_->uprobes_attached();
  return s;
}

uint64_t LiveSource::drops_total() const {
  return queue_drops_.load() + dropped_[IP_RING_GPU].load() + dropped_[IP_RING_HOST].load();
}

uint64_t LiveSource::drops_between(uint64_t t0_unix, uint64_t t1_unix) const {
  std::lock_guard<std::mutex> lk(mu_);
  return losses_.lost_between(t0_unix, t1_unix);
}

}  // namespace ingero::bpf
