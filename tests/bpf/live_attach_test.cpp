// Privileged end-to-end tests of attaching to jobs that are already running (docs/live-capture.md,
// "Attaching to running processes"):
// - a multi-threaded workload paced at a known rate, started before `trace`: after the process's
//   `attached_at`, the trace holds exactly the calls the workload logged, per thread and op;
// - the same workload started while the tracer is starting up;
// - a Python (ctypes) workload started before `trace`: its calls, on both threads, with Python
//   frames on their stacks;
// - the self-check: a probe detached mid-trace (a planted fault) is a warning and a health row
//   that names the library and how many calls were missed;
// - a task that ran instead of a traced thread, never touching the GPU, is named.
// Each test skips with the reason when not root, BPF cannot be used, or libcudart is absent.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bpf/live_source.h"
#include "model/ops.h"
#include "tests/util/child_process.h"
#include "tests/util/run_command.h"
#include "tests/util/tracer.h"

using namespace ingero;
using ingero::test::Child;

#if defined(IP_PIPELINE_BIN) && defined(IP_CUDA_WORKLOAD) && defined(IP_REAL_CUDART)
namespace {

bool skip_reason(std::string& why) {
  if (::geteuid() != 0) {
    why = "needs root (BPF uprobes and tracepoints)";
    return true;
  }
  if (::access(IP_REAL_CUDART, R_OK) != 0) {
    why = std::string(IP_REAL_CUDART) + " absent";
    return true;
  }
  return false;
}

// `ingero-pipeline trace` in the default mode (every CUDA process: no --pid), as a user attaches
// to a running job, writing a database; stderr to a file.
struct Tracer : ingero::test::Tracer {
  explicit Tracer(const std::string& name) : ingero::test::Tracer(IP_PIPELINE_BIN, "attach_" + name) {}
  void start(const std::string& duration, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--duration", duration};
    args.insert(args.end(), extra.begin(), extra.end());
    ingero::test::Tracer::start(args);
  }
};

struct Call {
  uint32_t tid;
  uint8_t op;
  uint64_t ts;
};

// The workload's own log: "<tid> launch|sync <unix ns just before the call>".
std::vector<Call> workload_calls(const std::string& path) {
  std::vector<Call> out;
  std::ifstream in(path);
  uint32_t tid;
  std::string op;
  uint64_t ts;
  while (in >> tid >> op >> ts) out.push_back({tid, op == "launch" ? op::kCudaLaunchKernel : op::kCudaStreamSync, ts});
  return out;
}

struct Db {
  sqlite3* h = nullptr;
  explicit Db(const std::string& path) { sqlite3_open_v2(path.c_str(), &h, SQLITE_OPEN_READONLY, nullptr); }
  ~Db() { sqlite3_close(h); }
  std::vector<std::vector<long long>> rows(const std::string& sql) const {
    std::vector<std::vector<long long>> out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) return out;
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::vector<long long> r;
      for (int i = 0; i < sqlite3_column_count(st); ++i) r.push_back(sqlite3_column_int64(st, i));
      out.push_back(std::move(r));
    }
    sqlite3_finalize(st);
    return out;
  }
  long long one(const std::string& sql) const {
    auto r = rows(sql);
    return r.empty() || r[0].empty() ? -1 : r[0][0];
  }
};

// The first instant at or after `t` (or before it, going down) with no call stamped within
// `margin`: a boundary where the workload's stamp (just before a call) and the probe's entry
// time (just after) cannot fall on different sides.
uint64_t quiet_instant(const std::vector<Call>& calls, uint64_t t, bool up, uint64_t margin = 20'000) {
  std::vector<uint64_t> ts;
  for (const Call& c : calls) ts.push_back(c.ts);
  std::sort(ts.begin(), ts.end());
  for (int guard = 0; guard < 100000; ++guard) {
    auto it = std::lower_bound(ts.begin(), ts.end(), t - margin);
    if (it == ts.end() || *it > t + margin) return t;
    t = up ? *it + margin + 1 : t - margin;
  }
  return t;
}

// The workload's calls and the trace's, per (thread, op), in [t0, t1).
using Counts = std::map<std::pair<uint32_t, int>, long>;
Counts logged_between(const std::vector<Call>& calls, uint64_t t0, uint64_t t1) {
  Counts n;
  for (const Call& c : calls)
    if (c.ts >= t0 && c.ts < t1) ++n[{c.tid, c.op}];
  return n;
}
Counts traced_between(const Db& db, uint32_t pid, uint64_t t0, uint64_t t1) {
  Counts n;
  for (const auto& r : db.rows(
           "SELECT tid, op, count(*) FROM events WHERE source = 1 AND pid = " + std::to_string(pid) +
           " AND timestamp >= " + std::to_string(t0) + " AND timestamp < " + std::to_string(t1) + " GROUP BY tid, op"))
    n[{static_cast<uint32_t>(r[0]), static_cast<int>(r[1])}] = r[2];
  return n;
}

std::string counts_text(const Counts& c) {
  std::string s;
  for (const auto& [k, n] : c)
    s += std::to_string(k.first) + "/" + op_name(Source::kCuda, static_cast<uint8_t>(k.second)) + "=" +
         std::to_string(n) + " ";
  return s;
}

// Checks the trace against the workload's log: exact per-thread counts between the process's
// attached_at (stored in ip_process_capture) and shortly before the trace stopped.
void expect_exact_after_attach(const Tracer& tr, uint32_t pid, const std::vector<Call>& calls, long threads,
                               bool expect_predates) {
  Db db(tr.db);
  ASSERT_NE(db.h, nullptr);
  const auto cap = db.rows("SELECT attached_at, started_at, predates FROM ip_process_capture WHERE pid = " +
                           std::to_string(pid));
  ASSERT_EQ(cap.size(), 1u) << "no ip_process_capture row for pid " << pid << "\n" << tr.log();
  const uint64_t attached_at = static_cast<uint64_t>(cap[0][0]);
  EXPECT_GT(cap[0][1], 0) << "start time of the process unknown";
  EXPECT_GE(attached_at, static_cast<uint64_t>(cap[0][1]));
  if (expect_predates) {
    EXPECT_EQ(cap[0][2], 1);
  }
  const long long stopped = db.one("SELECT max(stopped_at) FROM sessions");
  ASSERT_GT(stopped, static_cast<long long>(attached_at));
  // Calls made after attached_at, up to half a second before the tracer stopped (its last drain).
  const uint64_t t0 = quiet_instant(calls, attached_at, true);
  const uint64_t t1 = quiet_instant(calls, static_cast<uint64_t>(stopped) - 500'000'000ull, false);
  ASSERT_LT(t0, t1);
  const Counts logged = logged_between(calls, t0, t1), traced = traced_between(db, pid, t0, t1);
  ASSERT_EQ(logged.size(), static_cast<size_t>(2 * threads)) << counts_text(logged);
  for (const auto& [k, n] : logged) EXPECT_GT(n, 200) << "too few calls to judge: " << counts_text(logged);
  EXPECT_EQ(counts_text(traced), counts_text(logged))
      << "attached_at " << attached_at << ", compared from " << t0 << " to " << t1 << "\n"
      << tr.log();
  // Before attached_at the trace may hold some calls (those that entered after their own
  // function's probes went in), never one the workload did not make.
  const uint64_t t_before = quiet_instant(calls, attached_at, false);
  const Counts logged_before = logged_between(calls, 0, t_before), traced_before = traced_between(db, pid, 0, t_before);
  for (const auto& [k, n] : traced_before) EXPECT_LE(n, logged_before.count(k) ? logged_before.at(k) : 0);
}

// Stops a paced workload (SIGUSR1) and waits for it.
int stop_job(Child& job) {
  ::kill(job.pid, SIGUSR1);
  return job.finish();
}

}  // namespace

// (a) A job already running: three threads (created before the trace) each launch and
// synchronise every 250 us (~24,000 calls/s in all); `trace` attaches a second later.
TEST(LiveAttach, RunningJobIsCapturedExactlyFromAttachedAt) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  constexpr long kThreads = 3;
  const std::string log = "/tmp/ip_attach_calls_" + std::to_string(::getpid());
  Child job;
  ASSERT_TRUE(job.spawn({IP_CUDA_WORKLOAD, "paced", "--threads", std::to_string(kThreads), "--period-us", "250",
                         "--seconds", "120", "--log", log}));
  const uint32_t pid = static_cast<uint32_t>(job.pid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Tracer tr("running");
  tr.start("3s");
  ASSERT_GT(tr.pid, 0);
  const int rc = tr.wait();
  EXPECT_EQ(stop_job(job), 0);
  const std::string tlog = tr.log();
  if (rc != 0 && tlog.find("BPF") != std::string::npos) GTEST_SKIP() << "BPF unavailable: " << tlog;
  ASSERT_EQ(rc, 0) << tlog;
  EXPECT_NE(tlog.find("missed by the self-check=0,"), std::string::npos) << tlog;
  const auto calls = workload_calls(log);
  ::unlink(log.c_str());
  expect_exact_after_attach(tr, pid, calls, kThreads, true);
}

// (b) A job that starts while the tracer is loading its probes.
TEST(LiveAttach, JobStartedDuringTracerStartUpIsCaptured) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  constexpr long kThreads = 2;
  const std::string log = "/tmp/ip_attach_calls_startup_" + std::to_string(::getpid());
  Tracer tr("startup");
  tr.start("4s");
  ASSERT_GT(tr.pid, 0);
  Child job;
  ASSERT_TRUE(job.spawn({IP_CUDA_WORKLOAD, "paced", "--threads", std::to_string(kThreads), "--period-us", "250",
                         "--seconds", "120", "--log", log}));
  const uint32_t pid = static_cast<uint32_t>(job.pid);
  const int rc = tr.wait();
  EXPECT_EQ(stop_job(job), 0);
  const std::string tlog = tr.log();
  if (rc != 0 && tlog.find("BPF") != std::string::npos) GTEST_SKIP() << "BPF unavailable: " << tlog;
  ASSERT_EQ(rc, 0) << tlog;
  const auto calls = workload_calls(log);
  ::unlink(log.c_str());
  expect_exact_after_attach(tr, pid, calls, kThreads, false);
  // The job started before the probes were in: this run tested start-up.
  Db db(tr.db);
  const auto cap = db.rows("SELECT attached_at, started_at FROM ip_process_capture WHERE pid = " + std::to_string(pid));
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_GT(cap[0][0], cap[0][1]) << "the job started after the tracer had attached";
  // `stats` says from when the job is captured.
  const std::string stats = ingero::test::capture(std::string(IP_PIPELINE_BIN) + " stats --db " + tr.db + " 2>&1");
  EXPECT_NE(stats.find("note: pid " + std::to_string(pid)), std::string::npos) << stats;
  EXPECT_NE(stats.find("(attached_at)"), std::string::npos) << stats;
}

// (c) A Python job (ctypes into libcudart) already running on two threads, traced with a stack on
// every call: its calls are captured on both threads and carry its Python frames.
TEST(LiveAttach, RunningPythonJobHasItsCallsAndPythonFrames) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  Child job;
  ASSERT_TRUE(job.spawn({"/usr/bin/python3", std::string(IP_SOURCE_DIR) + "/tests/workloads/cuda_stacks.py",
                         IP_REAL_CUDART, "paced", "120"}));
  const uint32_t pid = static_cast<uint32_t>(job.pid);
  job.go();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Tracer tr("python");
  tr.start("2500ms", {"--stack-min", "0"});
  const int rc = tr.wait();
  EXPECT_EQ(stop_job(job), 0) << job.output;
  const std::string tlog = tr.log();
  if (rc != 0 && tlog.find("BPF") != std::string::npos) GTEST_SKIP() << "BPF unavailable: " << tlog;
  ASSERT_EQ(rc, 0) << tlog;
  Db db(tr.db);
  const std::string p = std::to_string(pid);
  EXPECT_EQ(db.one("SELECT predates FROM ip_process_capture WHERE pid = " + p), 1) << tlog;
  const auto per_thread = db.rows("SELECT tid, count(*) FROM events WHERE source = 1 AND pid = " + p + " GROUP BY tid");
  ASSERT_EQ(per_thread.size(), 2u) << "calls on both threads expected";
  for (const auto& r : per_thread) {
    EXPECT_GT(r[1], 100) << "thread " << r[0];
    // Python frames (stacks are rate-limited per thread: not every call has one): the functions
    // of cuda_stacks.py that make the call.
    const long long with_py = db.one(
        "SELECT count(*) FROM events e JOIN stack_traces s ON s.hash = e.stack_hash WHERE e.source = 1 AND e.tid = " +
        std::to_string(r[0]) + " AND s.frames LIKE '%pace%' AND s.frames LIKE '%step%' AND s.frames LIKE '%launch%'");
    EXPECT_GT(with_py, 10) << "thread " << r[0] << "\n" << tlog;
  }
}

// The self-check: a return probe detached mid-trace leaves calls entered and never returned; an
// entry probe detached leaves returns without entries. Both become warnings and health rows that
// name the library and count the calls, and neither appears before the fault.
TEST(LiveAttach, SelfCheckReportsAProbeDetachedMidTrace) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  Child job;
  ASSERT_TRUE(job.spawn({IP_CUDA_WORKLOAD, "paced", "--threads", "2", "--period-us", "500", "--seconds", "120"}));
  const pid_t job_pid = job.pid;
  bpf::LiveOptions o;
  o.probes.filter = bpf::FilterMode::kPids;
  o.probes.pids = {static_cast<uint32_t>(job.pid)};
  auto& f = o.probes.families;
  f.driver = f.nccl = f.block = f.tcp = f.net = f.memory = f.sched = f.wakeup = false;
  o.discovery.explicit_paths = {IP_REAL_CUDART};
  o.discovery.use_maps = o.discovery.use_ldcache = o.discovery.use_toolkit = o.discovery.use_wheels = false;
  std::string err;
  auto src = bpf::LiveSource::start(o, err);
  if (!src) GTEST_SKIP() << "BPF unavailable: " << err;
  std::thread drain([&] {
    Batch b;
    while (src->next(b) && !b.final) {
    }
  });
  auto self_check_warnings = [&] {
    std::vector<std::string> out;
    for (auto& w : src->take_warnings())
      if (w.find("self-check") != std::string::npos) out.push_back(w);
    return out;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(self_check_warnings().empty()) << "a warning before any fault";
  EXPECT_EQ(src->stats().missed, 0u);
  src->request_detach("cudaLaunchKernel", /*retprobe=*/true);
  src->request_detach("cudaStreamSynchronize", /*retprobe=*/false);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const auto after = self_check_warnings();
  src->stop();
  drain.join();
  EXPECT_EQ(stop_job(job), 0);
  std::string all;
  for (const auto& w : after) all += w + "\n";
  const std::string lib = "libcudart " + std::filesystem::canonical(IP_REAL_CUDART).string();
  const std::string lib_other = "libcudart " + std::string(IP_REAL_CUDART);
  auto names_lib = [&](const std::string& text) {
    return text.find(lib + ": ") != std::string::npos || text.find(lib_other + ": ") != std::string::npos;
  };
  EXPECT_TRUE(names_lib(all)) << all;
  EXPECT_NE(all.find("calls entered whose return was not seen"), std::string::npos) << all;
  EXPECT_NE(all.find("returns whose entry was not seen"), std::string::npos) << all;
  EXPECT_NE(all.find("pid " + std::to_string(job_pid)), std::string::npos) << all;
  // The health rows: which library, and how many. Two threads call each function every 0.5 ms
  // (at most 4,000 calls/s each; less when this machine is busy) for 2.5 s after the fault.
  const auto& missed = src->meta().health.missed;
  uint64_t no_return = 0, no_entry = 0;
  for (const auto& [reason, n] : missed) {
    if (!names_lib(reason)) continue;
    if (reason.find("return was not seen") != std::string::npos) no_return = n;
    if (reason.find("entry was not seen") != std::string::npos) no_entry = n;
  }
  EXPECT_GT(no_return, 500u) << testing::PrintToString(missed);
  EXPECT_GT(no_entry, 500u) << testing::PrintToString(missed);
  EXPECT_GE(src->stats().missed, no_return + no_entry);
}
// The task that ran instead of a traced thread is named, though it never touches the GPU: a CPU
// hog pinned to the feeding thread's CPU appears in its preempted off-CPU spans by pid (arg0), tid
// (arg1) and command name (meta().thread_names).
TEST(LiveNames, AHogThatNeverCallsCudaIsNamed) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  const pid_t hog = ::fork();
  ASSERT_GE(hog, 0);
  if (hog == 0) {
    ::prctl(PR_SET_NAME, "ip-hog-named", 0, 0, 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ::sched_setaffinity(0, sizeof(one), &one);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < end) x = x + 1;
    ::_exit(0);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{hog};
  Child job;
  if (::access("/usr/bin/taskset", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/taskset";
  // The job, every thread of it from its start, on the hog's CPU (taskset execs it: same pid).
  ASSERT_TRUE(job.spawn({"/usr/bin/taskset", "-c", "0", IP_CUDA_WORKLOAD, "paced", "--threads", "1", "--period-us", "0",
                         "--seconds", "120"}));
  bpf::LiveOptions o;
  o.probes.filter = bpf::FilterMode::kPids;
  o.probes.pids = {static_cast<uint32_t>(job.pid)};
  auto& f = o.probes.families;
  f.driver = f.nccl = f.block = f.tcp = f.net = f.memory = f.wakeup = false;
  o.discovery.explicit_paths = {IP_REAL_CUDART};
  o.discovery.use_maps = o.discovery.use_ldcache = o.discovery.use_toolkit = o.discovery.use_wheels = false;
  std::string err;
  auto src = bpf::LiveSource::start(o, err);
  if (!src) GTEST_SKIP() << "BPF unavailable: " << err;
  std::vector<Event> spans;
  std::atomic<long> hog_spans{0};
  std::thread drain([&] {
    Batch b;
    while (src->next(b)) {
      for (const Event& e : b.events)
        if (e.source == Source::kHost && e.op == op::kSchedSwitch) {
          spans.push_back(e);
          if (e.arg1 == static_cast<uint64_t>(hog)) hog_spans.fetch_add(1);
        }
      if (b.final) break;
    }
  });
  // Until the hog has displaced the job's thread a few times (at once on a quiet machine; beside
  // other builds the scheduler may pick other tasks first), at most 10 s.
  for (int i = 0; i < 100 && hog_spans.load() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  src->stop();
  drain.join();
  EXPECT_EQ(stop_job(job), 0);
  long by_hog = 0;
  for (const Event& e : spans)
    if (e.prev_state == OffCpuState::kPreempted && e.arg1 == static_cast<uint64_t>(hog)) {
      ++by_hog;
      EXPECT_EQ(e.arg0, static_cast<uint64_t>(hog)) << "the process that ran instead";
    }
  // On a quiet machine most preemptions are the hog's; beside other builds, a few suffice.
  std::map<uint64_t, long> by_task;
  for (const Event& e : spans)
    if (e.prev_state == OffCpuState::kPreempted) ++by_task[e.arg1];
  ASSERT_GT(by_hog, 0) << spans.size() << " off-CPU spans, none by the hog (pid " << hog
                       << "); preempted by (tid: spans): " << testing::PrintToString(by_task);
  const auto& names = src->meta().thread_names;
  ASSERT_TRUE(names.count(static_cast<uint32_t>(hog)));
  EXPECT_EQ(names.at(static_cast<uint32_t>(hog)), "ip-hog-named");
}
#else
TEST(LiveAttach, Skipped) { GTEST_SKIP() << "built without the pipeline binary, ip-cuda-workload or libcudart"; }
#endif
