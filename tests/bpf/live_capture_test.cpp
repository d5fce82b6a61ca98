// Privileged integration tests of live capture: real uprobes on libcudart (the CUDA toolkit's, and
// a fake one with controllable behaviour), real sched_switch tracepoints, the live source's
// batches, the default plan's CPU-contention chain, and replay of the written database.
// Each test skips with the reason when not root, BPF cannot be loaded, or a library is missing.
#include <cstring>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "bpf/live_source.h"
#include "bpf/tap_source.h"
#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/child_process.h"
#include "tests/util/run_command.h"
#include "tests/util/tracer.h"

extern char** environ;

using namespace ingero;
using namespace ingero::bpf;

namespace {

using ingero::test::Child;
using ingero::test::Tracer;

LiveOptions options_for(uint32_t pid, const std::string& lib) {
  LiveOptions o;
  o.probes.filter = FilterMode::kPids;
  o.probes.pids = {pid};
  // Only what these tests look at: keeps load time and noise down.
  o.probes.families.driver = o.probes.families.nccl = false;
  o.probes.families.block = o.probes.families.tcp = o.probes.families.net = false;
  o.probes.families.memory = false;
  o.discovery.explicit_paths = {lib};
  o.discovery.use_maps = o.discovery.use_ldcache = false;
  o.discovery.use_toolkit = o.discovery.use_wheels = false;
  return o;
}

struct Capture {
  std::vector<Event> events;
  uint32_t pid = 0;       // the workload's
  std::string violation;  // first broken batch invariant, if any
  LiveStats stats;
  std::vector<std::string> warnings;
};

// Pulls batches on a thread until the source ends, checking the batch contract as it goes.
class Collector {
 public:
  explicit Collector(EventSource& src) : src_(src), thread_([this] { run(); }) {}
  Capture join() {
    thread_.join();
    return std::move(cap_);
  }

 private:
  void run() {
    Batch b;
    uint64_t wm = 0;
    while (src_.next(b)) {
      for (size_t i = 0; i < b.events.size(); ++i) {
        const Event& e = b.events[i];
        // Only context intervals flagged kLate may start behind an earlier watermark.
        const bool late_ok = (e.flags & event_flags::kLate) && !is_gpu_api(e.source);
        if (cap_.violation.empty() && e.ts_ns < wm && !late_ok)
          cap_.violation = "event ts " + std::to_string(e.ts_ns) + " below earlier watermark";
        if (cap_.violation.empty() && (e.flags & event_flags::kLate) && is_gpu_api(e.source))
          cap_.violation = "a probed call flagged late";
        if (cap_.violation.empty() && i > 0 && e.ts_ns < b.events[i - 1].ts_ns) cap_.violation = "batch not sorted";
        cap_.events.push_back(e);
      }
      if (cap_.violation.empty() && b.watermark < wm) cap_.violation = "watermark went back";
      wm = b.watermark;
      if (b.final) break;
    }
  }
  EventSource& src_;
  Capture cap_;
  std::thread thread_;
};

bool skip_reason(std::string& why) {
  if (::geteuid() != 0) {
    why = "needs root (BPF uprobes and tracepoints)";
    return true;
  }
  return false;
}

// Starts the source on a spawned workload, lets it run, then drains.
bool capture(const std::vector<std::string>& args, const std::string& lib, Capture& cap, Child& child, std::string& why,
             LiveOptions* custom = nullptr) {
  if (!child.spawn(args)) {
    why = "cannot start " + args[0];
    return false;
  }
  LiveOptions o = custom ? *custom : options_for(static_cast<uint32_t>(child.pid), lib);
  if (custom) o.probes.pids = {static_cast<uint32_t>(child.pid)};
  std::string err;
  auto src = LiveSource::start(o, err);
  if (!src) {
    why = "BPF unavailable: " + err;
    return false;
  }
  if (src->stats().uprobes == 0) {
    why = "no uprobe attached to " + lib;
    for (const auto& w : src->take_warnings()) why += "; " + w;
    return false;
  }
  Collector col(*src);
  const uint32_t pid = static_cast<uint32_t>(child.pid);
  child.go();
  const int rc = child.finish();
  EXPECT_EQ(rc, 0) << child.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  src->stop();
  cap = col.join();
  cap.pid = pid;
  cap.stats = src->stats();
  cap.warnings = src->take_warnings();
  return true;
}

std::map<std::string, long> parse_tids(const std::string& out) {
  // "thread <i> tid <tid> calls <n>" -> tid -> n ; "worker tid <tid> calls <n>"
  std::map<std::string, long> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string w, idx, t, tid, c;
    long n = 0;
    l >> w;
    if (w == "thread") {
      l >> idx >> t >> tid >> c >> n;
      m["tid:" + tid] = n;
    } else if (w == "worker") {
      l >> t >> tid >> c >> n;
      m["worker"] = std::stol(tid);
      m["calls"] = n;
    }
  }
  return m;
}

}  // namespace

TEST(LiveCapture, ExactCountsPerOpAndThreadWithRealCudart) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
#if !defined(IP_REAL_CUDART)
  GTEST_SKIP() << "no CUDA toolkit libcudart at build time";
#else
  if (::access(IP_REAL_CUDART, R_OK) != 0) GTEST_SKIP() << IP_REAL_CUDART << " absent";
  constexpr long kThreads = 4, kCalls = 300;
  Child child;
  Capture cap;
  const auto t0 = std::chrono::system_clock::now();
  if (!capture({IP_CUDA_WORKLOAD, "mixed", "--threads", std::to_string(kThreads), "--calls", std::to_string(kCalls),
                "--wait"},
               IP_REAL_CUDART, cap, child, why))
    GTEST_SKIP() << why;
  const auto t1 = std::chrono::system_clock::now();
  EXPECT_TRUE(cap.violation.empty()) << cap.violation;
  EXPECT_EQ(cap.stats.dropped[IP_RING_GPU], 0u);
  EXPECT_EQ(cap.stats.late, 0u);
  const auto tids = parse_tids(child.output);
  ASSERT_EQ(tids.size(), static_cast<size_t>(kThreads)) << child.output;

  const std::set<uint8_t> ops = {op::kCudaLaunchKernel, op::kCudaMemcpy,     op::kCudaMemcpyAsync,
                                 op::kCudaMalloc,       op::kCudaFree,       op::kCudaMallocManaged,
                                 op::kCudaStreamSync,   op::kCudaDeviceSync, op::kCudaEventSync};
  std::map<std::pair<uint32_t, uint8_t>, long> counts;
  const uint64_t lo = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
  const uint64_t hi = std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count();
  for (const Event& e : cap.events) {
    if (e.source != Source::kCuda) continue;
    EXPECT_EQ(e.pid, cap.pid);
    ASSERT_TRUE(tids.count("tid:" + std::to_string(e.tid))) << "unexpected tid " << e.tid;
    ASSERT_TRUE(ops.count(e.op)) << op_name(e.source, e.op);
    EXPECT_GT(e.dur_ns, 0u);
    EXPECT_LT(e.dur_ns, 1'000'000'000u) << op_name(e.source, e.op);
    EXPECT_GE(e.ts_ns, lo - 1'000'000);  // 1 ms of clock-offset slack
    EXPECT_LE(e.end_ns(), hi + 1'000'000);
    if (e.op == op::kCudaMalloc) {
      EXPECT_EQ(e.arg0, 4096u);
    }
    if (e.op == op::kCudaMallocManaged) {
      EXPECT_EQ(e.arg0, 8192u);
    }
    if (e.op == op::kCudaMemcpy) {
      EXPECT_EQ(e.arg0, 8u);
      EXPECT_EQ(e.arg1, 0u);  // cudaMemcpyHostToHost
    }
    if (e.op == op::kCudaMemcpyAsync) {
      EXPECT_EQ(e.arg1, 1u);  // cudaMemcpyHostToDevice
    }
    ++counts[{e.tid, e.op}];
  }
  for (const auto& [key, n] : tids)
    for (uint8_t o : ops) {
      const uint32_t tid = static_cast<uint32_t>(std::stoul(key.substr(4)));
      EXPECT_EQ((counts[{tid, o}]), n) << "tid " << tid << " " << op_name(Source::kCuda, o);
    }
#endif
}

TEST(LiveCapture, PairsNestedAndRecursiveCalls) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  constexpr long kN = 200;
  Child child;
  Capture cap;
  if (!capture({IP_CONTENTION_WORKLOAD, "--nest", std::to_string(kN), "--wait"}, IP_FAKE_CUDART, cap, child, why))
    GTEST_SKIP() << why;
  EXPECT_TRUE(cap.violation.empty()) << cap.violation;
  EXPECT_EQ(cap.stats.unmatched, 0u);
  EXPECT_EQ(cap.stats.depth_overflow, 0u);
  std::vector<Event> launch, copy, sync;
  for (const Event& e : cap.events) {
    if (e.source != Source::kCuda) continue;
    if (e.op == op::kCudaLaunchKernel) launch.push_back(e);
    if (e.op == op::kCudaMemcpy) copy.push_back(e);
    if (e.op == op::kCudaEventSync) sync.push_back(e);
  }
  ASSERT_EQ(launch.size(), static_cast<size_t>(kN));
  ASSERT_EQ(copy.size(), static_cast<size_t>(kN));
  ASSERT_EQ(sync.size(), static_cast<size_t>(4 * kN));  // depth 3 recursion: 4 calls each
  // Every nested cudaMemcpy lies inside its cudaLaunchKernel; arguments captured at entry.
  for (size_t i = 0; i < launch.size(); ++i) {
    EXPECT_LE(launch[i].ts_ns, copy[i].ts_ns);
    EXPECT_GE(launch[i].end_ns(), copy[i].end_ns());
    EXPECT_EQ(copy[i].arg0, 64u);
    EXPECT_EQ(copy[i].arg1, 1u);
  }
  // Recursion: sorted by start, each group of 4 is strictly nested (outer first).
  for (size_t g = 0; g + 3 < sync.size(); g += 4)
    for (size_t k = 1; k < 4; ++k) {
      EXPECT_LT(sync[g + k - 1].ts_ns, sync[g + k].ts_ns);
      EXPECT_GT(sync[g + k - 1].end_ns(), sync[g + k].end_ns());
      EXPECT_EQ(sync[g + k - 1].arg1, 4 - k);  // the event argument counts the depth down
    }
}

TEST(LiveCapture, LongOffCpuSpansAreDeliveredLateNotDropped) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  // The worker spins 500 ms inside cudaStreamSynchronize, then sleeps 500 ms: each sleep is an
  // off-CPU span open longer than context_hold (250 ms). It must arrive whole, flagged late, and
  // the probed calls must still come in order.
  Child child;
  Capture cap;
  if (!capture({IP_CONTENTION_WORKLOAD, "--seconds", "2.2", "--spin-us", "500000", "--cpu", "0", "--fifo", "--wait"},
               IP_FAKE_CUDART, cap, child, why))
    GTEST_SKIP() << why;
  EXPECT_TRUE(cap.violation.empty()) << cap.violation;
  const auto ids = parse_tids(child.output);
  ASSERT_TRUE(ids.count("worker"));
  const uint32_t tid = static_cast<uint32_t>(ids.at("worker"));
  size_t long_sleeps = 0, late_flagged = 0, calls = 0;
  for (const Event& e : cap.events) {
    if (e.tid != tid) continue;
    if (e.source == Source::kCuda && e.op == op::kCudaStreamSync) ++calls;
    if (e.source != Source::kHost || e.op != op::kSchedSwitch) continue;
    if (e.dur_ns >= 400'000'000) {
      ++long_sleeps;
      EXPECT_EQ(e.prev_state, OffCpuState::kSleeping);
      if (e.flags & event_flags::kLate) ++late_flagged;
    }
  }
  EXPECT_EQ(static_cast<long>(calls), ids.at("calls"));
  EXPECT_GE(long_sleeps, 2u);
  EXPECT_EQ(late_flagged, long_sleeps);
  EXPECT_GE(cap.stats.late_delivered, long_sleeps);
  EXPECT_EQ(cap.stats.late, 0u);
}

namespace {

struct ContentionRun {
  Capture cap;
  long worker = 0, calls = 0;
  uint32_t pid = 0;
  AnalysisResult live, replay;
  std::string db;
  std::vector<std::pair<std::string, std::string>> tracepoints;  // (name, tp_btf|classic)
};

// The contention workload traced live through the engine's default plan, with a tap writing the
// database; then the database replayed through the same plan.
bool contention_run(bool contended, ContentionRun& run, std::string& why, bool classic = false) {
  Child child;
  std::vector<std::string> args = {
      IP_CONTENTION_WORKLOAD, "--seconds", "2.5", "--spin-us", "200", "--cpu", "0", "--wait"};
  if (contended) {
    args.insert(args.end(), {"--hogs", "2"});
  } else {
    args.push_back("--fifo");
  }
  if (!child.spawn(args)) {
    why = "cannot start the contention workload";
    return false;
  }
  run.pid = static_cast<uint32_t>(child.pid);
  LiveOptions o = options_for(run.pid, IP_FAKE_CUDART);
  o.probes.force_classic = classic;
  // Classic run: off-CPU stacks on too, so the held-span path (classic sys_exit_<name>) runs.
  if (classic) o.probes.stacks.offcpu_min_ns = 1'000'000;
  std::string err;
  auto src = LiveSource::start(o, err);
  if (!src) {
    why = "BPF unavailable: " + err;
    return false;
  }
  run.tracepoints = src->probes().tracepoints();
  run.db = std::string("/tmp/ip_live_") + (contended ? "busy" : "quiet") + "_" + std::to_string(::getpid()) + ".db";
  auto sink = SqliteSink::create(run.db, err);
  if (!sink) {
    why = "cannot create " + run.db + ": " + err;
    return false;
  }
  bool meta_written = false;
  TapSource tap(*src, [&](const Batch& b) {
    if (!meta_written) meta_written = sink->write_meta(src->meta());
    sink->write_events(b.events);
    for (const Event& e : b.events) run.cap.events.push_back(e);
  });
  const Plan plan = default_plan();
  EngineOptions eo;
  eo.threads = 2;
  std::thread engine([&] { run.live = run_plan(plan, tap, eo); });
  child.go();
  EXPECT_EQ(child.finish(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  src->stop();
  engine.join();
  run.cap.stats = src->stats();
  sink->write_meta(src->meta());
  sink->write_result(run.live);
  EXPECT_TRUE(sink->close(err)) << err;
  const auto ids = parse_tids(child.output);
  run.worker = ids.count("worker") ? ids.at("worker") : 0;
  run.calls = ids.count("calls") ? ids.at("calls") : 0;

  auto replay_src = open_sqlite_trace(run.db, err);
  if (!replay_src) {
    ADD_FAILURE() << "replay: " << err;
    return true;
  }
  run.replay = run_plan(plan, *replay_src, eo);
  return true;
}

std::vector<std::string> chain_keys(const AnalysisResult& r) {
  std::vector<std::string> k;
  for (const Chain& c : r.chains) k.push_back(c.id + " | " + c.summary);
  std::sort(k.begin(), k.end());
  return k;
}

bool has_contention_chain(const AnalysisResult& r, uint32_t pid) {
  for (const Chain& c : r.chains)
    if (c.category == "cpu_contention" && c.pid == pid && c.source == Source::kCuda && c.op == op::kCudaStreamSync)
      return true;
  return false;
}

}  // namespace

// The contended run's checks; `classic` runs it on the classic-tracepoint fallback (what a kernel
// without BTF for the scheduler tracepoints gets).
// The classic fallback reads tracepoint formats from tracefs, which a fresh machine may not have
// mounted: mount it the way the docs tell a user to (root), or say why the test cannot run.
bool ensure_tracefs(std::string& why) {
  for (const char* p : {"/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"})
    if (::access(p, R_OK) == 0) return true;
  if (::mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nullptr) == 0) return true;
  why = std::string("tracefs is not mounted and mounting it at /sys/kernel/tracing failed: ") + std::strerror(errno);
  return false;
}

void check_contention(bool classic) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  if (classic && !ensure_tracefs(why)) GTEST_SKIP() << why;
  ContentionRun run;
  if (!contention_run(true, run, why, classic)) GTEST_SKIP() << why;
  bool switch_kind_ok = false;
  for (const auto& [name, kind] : run.tracepoints)
    if (name == "sched_switch") switch_kind_ok = kind == (classic ? "classic" : "tp_btf");
  if (!classic && !switch_kind_ok) GTEST_SKIP() << "this kernel has no tp_btf for sched_switch";
  EXPECT_TRUE(switch_kind_ok) << "sched_switch not attached as " << (classic ? "classic" : "tp_btf");
  // --classic-tracepoints means no raw tracepoint at all: with off-CPU stacks on, held spans go
  // out through the classic sys_exit_<name> tracepoints, never the tp_btf sys_exit fallback.
  if (classic) {
    bool sys_exit = false;
    for (const auto& [name, kind] : run.tracepoints) {
      EXPECT_EQ(kind, "classic") << name;
      sys_exit |= name == "sys_exit";
    }
    if (::access("/sys/kernel/btf/vmlinux", R_OK) == 0) {  // the program reads regs via BTF
      EXPECT_TRUE(sys_exit) << "off-CPU stacks on but no syscall exit tracepoint attached";
    }
  }
  ASSERT_GT(run.worker, 0);
  const uint32_t tid = static_cast<uint32_t>(run.worker);

  std::vector<Event> calls, spans;
  for (const Event& e : run.cap.events) {
    if (e.tid != tid) continue;
    if (e.source == Source::kCuda && e.op == op::kCudaStreamSync) calls.push_back(e);
    if (e.source == Source::kHost && e.op == op::kSchedSwitch) spans.push_back(e);
  }
  EXPECT_EQ(static_cast<long>(calls.size()), run.calls);
  size_t preempted = 0;
  for (const Event& s : spans) {
    if (s.prev_state == OffCpuState::kPreempted) ++preempted;
    EXPECT_NE(s.arg1, static_cast<uint64_t>(tid));  // someone else ran instead
    EXPECT_GT(s.dur_ns, 0u);
  }
  EXPECT_GE(preempted, 10u) << "worker spans: " << spans.size();

  // A call much slower than its 200 us of work lost the CPU: preempted spans of the same thread
  // cover most of the extra time.
  size_t slow = 0, explained = 0;
  for (const Event& c : calls) {
    if (c.dur_ns < 1'200'000) continue;
    ++slow;
    uint64_t overlap = 0;
    for (const Event& s : spans) {
      if (s.prev_state != OffCpuState::kPreempted) continue;
      const uint64_t a = std::max(c.ts_ns, s.ts_ns), b = std::min(c.end_ns(), s.end_ns());
      if (b > a) overlap += b - a;
    }
    if (overlap * 2 >= c.dur_ns - 200'000) ++explained;
  }
  EXPECT_GE(slow, 5u);
  EXPECT_GE(explained * 10, slow * 9) << explained << " of " << slow << " slow calls explained";

  EXPECT_TRUE(has_contention_chain(run.live, run.pid)) << "live chains: " << run.live.chains.size();
  EXPECT_EQ(chain_keys(run.live), chain_keys(run.replay));
  ::unlink(run.db.c_str());
}

TEST(LiveCapture, OffCpuSpansLineUpWithSlowCallsAndContentionChainFires) { check_contention(false); }

TEST(LiveCapture, ClassicTracepointFallbackSeesTheSameContention) { check_contention(true); }

TEST(LiveCapture, QuietWorkloadHasNoContentionChain) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  ContentionRun run;
  if (!contention_run(false, run, why)) GTEST_SKIP() << why;
  ASSERT_GT(run.calls, 100);
  EXPECT_FALSE(has_contention_chain(run.live, run.pid));
  EXPECT_EQ(chain_keys(run.live), chain_keys(run.replay));
  ::unlink(run.db.c_str());
}

#ifdef IP_PIPELINE_BIN
namespace {

// Runs one SQL query returning a single integer.
long long sql_int(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  long long v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

}  // namespace

// The whole binary: `ingero-pipeline trace --pid N --db F` on the contended workload, stopped with
// Ctrl-C (SIGINT): exit 0, no drops, every call of the worker in the database (written by the
// spooling writer, indexes built at stop), and `explain --db F` replays to the chains it stored.
TEST(LiveCapture, TraceCommandStoresEveryCallAndReplaysToTheSameChains) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  Child child;
  if (!child.spawn(
          {IP_CONTENTION_WORKLOAD, "--seconds", "2.5", "--spin-us", "200", "--cpu", "0", "--hogs", "2", "--wait"}))
    GTEST_SKIP() << "cannot start the contention workload";
  Tracer tracer(IP_PIPELINE_BIN, "trace_cli");
  const std::string& db = tracer.db;
  tracer.start({"--pid", std::to_string(child.pid), "--cuda-lib", IP_FAKE_CUDART});
  ASSERT_GT(tracer.pid, 0);
  if (!tracer.wait_attached()) {
    child.go();
    child.finish();
    GTEST_SKIP() << "trace did not attach: " << tracer.log();
  }
  child.go();
  EXPECT_EQ(child.finish(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int rc = tracer.interrupt();
  const std::string log = tracer.log();
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("dropped gpu=0 host=0 queue=0, late=0"), std::string::npos) << log;
  EXPECT_NE(log.find("db: indexing"), std::string::npos) << log;

  const auto ids = parse_tids(child.output);
  ASSERT_TRUE(ids.count("worker")) << child.output;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  EXPECT_EQ(sql_int(h, "SELECT count(*) FROM events WHERE source = 1 AND op = " + std::to_string(op::kCudaStreamSync) +
                           " AND tid = " + std::to_string(ids.at("worker"))),
            ids.at("calls"));
  EXPECT_EQ(sql_int(h, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events'"), 4);
  std::vector<std::string> stored;
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT id FROM causal_chains ORDER BY id", -1, &st, nullptr), SQLITE_OK);
  while (sqlite3_step(st) == SQLITE_ROW) stored.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
  sqlite3_finalize(st);
  sqlite3_close(h);
  bool contention = false;
  // The tail rule's chain, or the finding over time it is folded into (rules/time.rules).
  for (const auto& id : stored)
    contention = contention || id.rfind("cpu_contention:", 0) == 0 || id.rfind("cpu_preempted:", 0) == 0;
  EXPECT_TRUE(contention) << testing::PrintToString(stored);

  const std::string cmd = std::string(IP_PIPELINE_BIN) + " explain --json --db " + db + " 2>/dev/null";
  const std::string out = ingero::test::capture(cmd);
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.substr(0, 500);
  std::vector<std::string> replayed;
  for (const auto& c : j["chains"]) replayed.push_back(c["id"].get<std::string>());
  std::sort(replayed.begin(), replayed.end());
  EXPECT_EQ(replayed, stored);
}
#endif
