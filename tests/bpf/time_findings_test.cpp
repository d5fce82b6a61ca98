// Privileged end-to-end acceptance tests of issue 40 ("time accounting and steps"): findings on a
// GPU-feeding thread's time, through the binary (`trace` then `explain --json`).
//
// (A) CPU contention. A thread calls the real libcudart every 200 us and spins on CPU in between
//     (ip-cuda-workload paced --busy, pinned to one CPU). ~3 s into a 16 s trace a CPU-bound
//     process named "ip-hog" (ip-cuda-workload hog) is pinned to the same CPU for 10 s.
//     - Measurement (holds today): the whole-trace accounting of the feeding thread counts as
//       preempted what the kernel counts as run-queue delay: preempted_ns is within 15% of the
//       delta of /proc/<pid>/task/<tid>/schedstat's 2nd field over the thread's accounted
//       interval [start_ns, end_ns] (sampled every 50 ms with CLOCK_REALTIME stamps, interpolated
//       at the edges), and the hog is the task that ran instead (preempted_by[0]). The calls stay
//       fast (p99 under 100 us, with or without the hog): a latency rule has nothing to see.
//     - Rule (issue 40, landing separately): exactly one MEDIUM/HIGH chain on the feeding thread
//       (tid) with category cpu_contention; its window covers >= 70% of the hog's run and extends
//       at most 2 s beyond it on either side; its `accounting` names the hog (pid and comm) first
//       in preempted_by, with preempted_ns within 15% of the schedstat delta over the window.
//     Control: the same workload without the hog: the accounting still matches schedstat (with a
//     10 ms floor: the numbers are small), and no MEDIUM/HIGH chain on the feeding thread.
// (B) Input starvation. A Python loop (tests/workloads/py_input_wait.py, ctypes on the real
//     libcudart) whose feeding (main) thread takes a batch from a loader thread through a
//     queue.Queue per step, then makes 21 CUDA calls. Starved: the loader needs 50 ms a batch, so
//     the feeding thread waits in next_batch() (a futex) ~90% of each step.
//     - Measurement (holds today): the feeding thread's accounting has blocked_ns.lock within 15%
//       of the time the script measured in next_batch(), and its off-CPU stacks carry the Python
//       frame next_batch.
//     - Rule (issue 40): a MEDIUM/HIGH chain on the feeding thread with category
//       input_starvation whose text says it waited for input, on a lock/futex, and names a Python
//       frame of the wait; its accounting has most of its wall time blocked on a lock.
//     Control: batches always ready (the loader never sleeps): little lock time, and no
//     MEDIUM/HIGH input_starvation chain on the feeding thread.
// Workloads, hog and tracer run at nice -20, each in a session of its own whose scheduler
// autogroup is at -20 too: on a shared machine (other builds), what the feeding thread loses to
// anyone but the hog stays small, so the control runs are quiet.
// Every test prints its measured figures ("[measure] ..."). Rule-part failures start with
// "[rule, issue 40]" and print the chains found. Each test skips with the reason when not root,
// with fewer than 2 CPUs, without libcudart (or python3 for B), or when BPF cannot be used.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/stack.h"
#include "tests/util/child_process.h"
#include "tests/util/run_command.h"
#include "tests/util/tracer.h"

using ingero::test::Child;
using ingero::test::Tracer;
using json = nlohmann::json;

#if defined(IP_PIPELINE_BIN) && defined(IP_CUDA_WORKLOAD) && defined(IP_REAL_CUDART)
namespace {

uint64_t unix_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_nsec);
}

double ms(double ns) { return ns / 1e6; }
double secs(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

// The CPUs this test may use, in ascending order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

bool skip_reason(std::string& why) {
  if (::geteuid() != 0) {
    why = "needs root (BPF uprobes and tracepoints)";
    return true;
  }
  if (::access(IP_REAL_CUDART, R_OK) != 0) {
    why = std::string(IP_REAL_CUDART) + " absent";
    return true;
  }
  if (allowed_cpus().size() < 2) {
    why = "needs 2 CPUs (the workload and the hog share one, the tracer runs on another)";
    return true;
  }
  return false;
}

// /proc/<pid>/task/<tid>/schedstat sampled on a thread of this test: (CLOCK_REALTIME stamp, run
// queue delay in ns, the 2nd field). The stamp is the middle of the read.
class SchedstatSampler {
 public:
  SchedstatSampler(pid_t pid, pid_t tid, std::chrono::milliseconds every)
      : path_("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/schedstat"), every_(every) {}
  ~SchedstatSampler() { stop(); }
  SchedstatSampler(const SchedstatSampler&) = delete;
  SchedstatSampler& operator=(const SchedstatSampler&) = delete;

  bool start() {
    if (!sample()) return false;
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        std::this_thread::sleep_for(every_);
        sample();
      }
    });
    return true;
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Run-queue delay at `t`, linear between the samples around it; nullopt outside the samples.
  std::optional<double> run_delay_at(uint64_t t) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 1; i < samples_.size(); ++i) {
      const auto& [t0, d0] = samples_[i - 1];
      const auto& [t1, d1] = samples_[i];
      if (t < t0 || t > t1) continue;
      if (t1 == t0) return static_cast<double>(d1);
      const double f = static_cast<double>(t - t0) / static_cast<double>(t1 - t0);
      return static_cast<double>(d0) + f * (static_cast<double>(d1) - static_cast<double>(d0));
    }
    return std::nullopt;
  }
  std::optional<double> delta(uint64_t from, uint64_t to) const {
    const auto a = run_delay_at(from), b = run_delay_at(to);
    if (!a || !b) return std::nullopt;
    return *b - *a;
  }
  std::string coverage() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (samples_.empty()) return "no samples of " + path_;
    return std::to_string(samples_.size()) + " samples of " + path_ + " from " +
           std::to_string(samples_.front().first) + " to " + std::to_string(samples_.back().first);
  }

 private:
  bool sample() {
    const uint64_t a = unix_ns();
    std::ifstream in(path_);
    unsigned long long on_cpu = 0, run_delay = 0;
    if (!(in >> on_cpu >> run_delay)) return false;
    const uint64_t b = unix_ns();
    std::lock_guard<std::mutex> lock(mu_);
    samples_.emplace_back(a + (b - a) / 2, static_cast<uint64_t>(run_delay));
    return true;
  }

  std::string path_;
  std::chrono::milliseconds every_;
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> samples_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// `ingero-pipeline explain --json` of a trace.
json explain(const std::string& db) {
  const std::string out = ingero::test::capture(std::string(IP_PIPELINE_BIN) + " explain --json --db " + db +
                                                " 2>/dev/null");
  return json::parse(out, nullptr, false);
}

// The whole-trace accounting entry of a thread, or null.
json accounting_of(const json& ex, uint32_t tid) {
  if (ex.contains("accounting"))
    for (const auto& a : ex["accounting"])
      if (a.value("tid", 0u) == tid) return a;
  return nullptr;
}

bool medium_or_high(const json& c) {
  const std::string s = c.value("severity", "");
  return s == "MEDIUM" || s == "HIGH";
}

std::string chain_text(const json& c) {
  return c.value("summary", "") + "\n" + c.value("root_cause", "") + "\n" + c.value("explanation", "");
}

// The chains, one line each (and the accounting when there is one), for failure messages.
std::string chains_listing(const json& ex) {
  std::ostringstream s;
  const size_t n = ex.contains("chains") ? ex["chains"].size() : 0;
  s << n << " chains:\n";
  if (!n) return s.str();
  for (const auto& c : ex["chains"]) {
    s << "  [" << c.value("severity", "") << "] " << c.value("category", "") << " rule=" << c.value("rule", "")
      << " pid=" << c.value("pid", 0u) << " tid=" << c.value("tid", 0u) << " window=["
      << c.value("window_start_ns", 0ull) << ", " << c.value("window_end_ns", 0ull) << "] " << c.value("summary", "")
      << "\n";
    if (c.contains("accounting") && !c["accounting"].is_null())
      s << "      accounting " << c["accounting"].dump() << "\n";
  }
  return s.str();
}

// Read-only SQLite, a single integer per query.
long long sql_int(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  long long v = -1;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return v;
}

std::string sql_text(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  std::string v;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      if (const unsigned char* t = sqlite3_column_text(st, 0)) v = reinterpret_cast<const char*>(t);
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return v;
}

// |measured - reference| <= max(rel * reference, floor_ns).
::testing::AssertionResult within(double measured, double reference, double rel, double floor_ns) {
  const double tol = std::max(rel * reference, floor_ns);
  if (std::fabs(measured - reference) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << ms(measured) << " ms vs " << ms(reference) << " ms: off by "
                                       << ms(std::fabs(measured - reference)) << " ms, more than " << ms(tol) << " ms";
}

// ---- (A) ----------------------------------------------------------------------------------------

struct HogRun {
  bool skipped = false;
  std::string skip_why;
  uint32_t pid = 0, tid = 0;  // the feeding thread
  uint32_t hog_pid = 0;
  uint64_t hog_start = 0, hog_end = 0;  // the hog's own spin interval (unix ns)
  std::string tracer_log;
  json ex;
  json ops;                                 // `stats --json`'s ops: the calls' latency
  std::unique_ptr<SchedstatSampler> sched;  // the feeding thread's, from before the trace to after it
};

// The paced busy workload pinned to `cpu`, traced 16 s; with `hog`, the hog on the same CPU from
// ~3 s for 10 s. Workload, hog and tracer run at nice -20, so neighbours at normal priority (other
// builds on a shared machine) barely take this CPU: what the thread loses, it loses to the hog.
void hog_run(bool hog, HogRun& run) {
  const int cpu = allowed_cpus().back();
  Child job;
  ASSERT_TRUE(job.spawn({IP_CUDA_WORKLOAD, "paced", "--threads", "1", "--period-us", "200", "--seconds", "40", "--busy",
                         "--cpu", std::to_string(cpu), "--nice", "-20"}))
      << "cannot start " << IP_CUDA_WORKLOAD;
  std::istringstream(job.read_line().substr(4)) >> run.tid;  // "tid <n>"
  run.pid = static_cast<uint32_t>(job.pid);
  ASSERT_GT(run.tid, 0u);
  run.sched = std::make_unique<SchedstatSampler>(job.pid, static_cast<pid_t>(run.tid), std::chrono::milliseconds(50));
  ASSERT_TRUE(run.sched->start()) << run.sched->coverage();

  const uint64_t t_start = unix_ns();
  Tracer tr(IP_PIPELINE_BIN, hog ? "time_hog" : "time_nohog");
  tr.start({"--pid", std::to_string(job.pid), "--cuda-lib", IP_REAL_CUDART, "--duration", "16s"}, -20);
  ASSERT_GT(tr.pid, 0);
  if (!tr.wait_attached()) {
    run.skipped = true;
    run.skip_why = "trace did not attach: " + tr.log();
    return;
  }
  const uint64_t t_attached = unix_ns();
  Child hog_proc;
  if (hog) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ASSERT_TRUE(hog_proc.spawn({IP_CUDA_WORKLOAD, "hog", "--seconds", "10", "--name", "ip-hog", "--cpu",
                                std::to_string(cpu), "--nice", "-20"}));
    run.hog_pid = static_cast<uint32_t>(hog_proc.pid);
    EXPECT_EQ(hog_proc.finish(), 0);
    // "spun <start unix ns> <end unix ns>"
    std::istringstream(hog_proc.output.substr(hog_proc.output.find("spun ") + 5)) >> run.hog_start >> run.hog_end;
    ASSERT_GT(run.hog_end, run.hog_start) << hog_proc.output;
  }
  const int rc = tr.wait();
  run.tracer_log = tr.log();
  run.sched->stop();
  ::kill(job.pid, SIGUSR1);
  EXPECT_EQ(job.finish(), 0);
  ASSERT_EQ(rc, 0) << run.tracer_log;
  const uint64_t t_traced = unix_ns();
  run.ex = explain(tr.db);
  ASSERT_FALSE(run.ex.is_discarded()) << "explain --json did not print JSON";
  const json stats = json::parse(ingero::test::capture(std::string(IP_PIPELINE_BIN) + " stats --json -q --db " + tr.db +
                                                       " 2>/dev/null"),
                                 nullptr, false);
  if (stats.is_object() && stats.contains("ops")) run.ops = stats["ops"];
  std::printf("[measure] attach %.1f s, trace to exit %.1f s, explain %.1f s\n", secs(t_attached - t_start),
              secs(t_traced - t_attached), secs(unix_ns() - t_traced));
}

// The workload's calls stay fast with or without the hog (the contention is in the thread's time,
// not in its calls' latency): p99 of each op under 100 us (they take ~1-3 us).
void expect_fast_calls(const HogRun& run) {
  ASSERT_TRUE(run.ops.is_array()) << "stats --json gave no ops";
  int seen = 0;
  for (const auto& o : run.ops) {
    const std::string op = o.value("op", "");
    if (op != "cudaLaunchKernel" && op != "cudaStreamSync") continue;
    ++seen;
    std::printf("[measure] %s: %s n=%llu p50=%.1f us p99=%.1f us\n", run.hog_pid ? "hog run" : "control", op.c_str(),
                o.value("count", 0ull), o.value("p50_ns", 0.0) / 1e3, o.value("p99_ns", 0.0) / 1e3);
    EXPECT_LT(o.value("p99_ns", 0.0), 100e3) << "[measure] " << op << " is not a fast call here: " << o.dump();
  }
  EXPECT_EQ(seen, 2) << run.ops.dump();
}

// Measurement: the whole-trace accounting of the feeding thread against schedstat.
void check_accounting_against_schedstat(const HogRun& run, double floor_ns) {
  const SchedstatSampler& s = *run.sched;
  const json a = accounting_of(run.ex, run.tid);
  ASSERT_FALSE(a.is_null()) << "[measure] no accounting entry for the feeding thread " << run.tid << " in "
                            << run.ex["accounting"].dump();
  EXPECT_TRUE(a.value("scheduler_data", false)) << a.dump();
  const uint64_t t0 = a.value("start_ns", 0ull), t1 = a.value("end_ns", 0ull);
  ASSERT_LT(t0, t1) << a.dump();
  EXPECT_GT(t1 - t0, 14'000'000'000ull) << "[measure] the accounting covers less than 14 s of the 16 s trace\n"
                                        << a.dump() << "\n"
                                        << run.tracer_log;
  const auto d = s.delta(t0, t1);
  ASSERT_TRUE(d.has_value()) << "[measure] schedstat does not cover [" << t0 << ", " << t1 << "]: " << s.coverage();
  const double preempted = a.value("preempted_ns", 0.0);
  std::printf(
      "[measure] %s: thread %u accounted %.3f s; schedstat run-queue delay %.1f ms, accounting preempted %.1f ms "
      "(ratio %.3f)\n",
      run.hog_pid ? "hog run" : "control", run.tid, secs(t1 - t0), ms(*d), ms(preempted),
      *d > 0 ? preempted / *d : 0.0);
  EXPECT_TRUE(within(preempted, *d, 0.15, floor_ns))
      << "[measure] accounting preempted_ns vs schedstat run-queue delay over [" << t0 << ", " << t1 << "]\n"
      << a.dump();
  if (run.hog_pid) {
    // The hog took a real share of the thread's CPU while it ran, and is the first task named.
    EXPECT_GT(preempted, 0.3 * static_cast<double>(run.hog_end - run.hog_start)) << a.dump();
    ASSERT_FALSE(a["preempted_by"].empty()) << a.dump();
    EXPECT_EQ(a["preempted_by"][0].value("pid", 0u), run.hog_pid) << a.dump();
    EXPECT_EQ(a["preempted_by"][0].value("comm", ""), "ip-hog") << a.dump();
  }
}

TEST(TimeFindings, HogOnTheFeedingThreadsCpuIsOneContentionFinding) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  HogRun run;
  hog_run(true, run);
  if (HasFatalFailure()) return;
  if (run.skipped) GTEST_SKIP() << run.skip_why;
  std::printf("[measure] hog pid %u spun [%llu, %llu] (%.3f s); feeding thread %u of pid %u\n", run.hog_pid,
              static_cast<unsigned long long>(run.hog_start), static_cast<unsigned long long>(run.hog_end),
              secs(run.hog_end - run.hog_start), run.tid, run.pid);
  check_accounting_against_schedstat(run, 10e6);
  expect_fast_calls(run);

  // ---- Rule part (issue 40) ----
  const std::string expected = "[rule, issue 40] expected exactly one MEDIUM/HIGH cpu_contention chain with tid " +
                               std::to_string(run.tid) + " covering the hog's run [" + std::to_string(run.hog_start) +
                               ", " + std::to_string(run.hog_end) + "] (pid " + std::to_string(run.hog_pid) +
                               ", comm ip-hog); found ";
  std::vector<json> found;
  for (const auto& c : run.ex["chains"])
    if (c.value("tid", 0u) == run.tid && medium_or_high(c) && c.value("category", "") == "cpu_contention")
      found.push_back(c);
  ASSERT_EQ(found.size(), 1u) << expected << found.size() << "\n" << chains_listing(run.ex);
  const json& c = found[0];
  const uint64_t w0 = c.value("window_start_ns", 0ull), w1 = c.value("window_end_ns", 0ull);
  const uint64_t hog_len = run.hog_end - run.hog_start;
  const uint64_t lo = std::max(w0, run.hog_start), hi = std::min(w1, run.hog_end);
  const double overlap = hi > lo ? static_cast<double>(hi - lo) : 0.0;
  std::printf(
      "[measure] chain window [%llu, %llu]: covers %.0f%% of the hog's run, starts %+.3f s, ends %+.3f s from it\n",
      static_cast<unsigned long long>(w0), static_cast<unsigned long long>(w1),
      100.0 * overlap / static_cast<double>(hog_len),
      (static_cast<double>(w0) - static_cast<double>(run.hog_start)) / 1e9,
      (static_cast<double>(w1) - static_cast<double>(run.hog_end)) / 1e9);
  EXPECT_GE(overlap, 0.7 * static_cast<double>(hog_len)) << "[rule, issue 40] the window covers too little of the hog\n"
                                                         << chains_listing(run.ex);
  EXPECT_LE(run.hog_start, w0 + 2'000'000'000ull) << "[rule, issue 40] window starts > 2 s before the hog";
  EXPECT_LE(w1, run.hog_end + 2'000'000'000ull) << "[rule, issue 40] window ends > 2 s after the hog";
  ASSERT_TRUE(c.contains("accounting") && c["accounting"].is_object())
      << "[rule, issue 40] the chain has no accounting object: " << c.dump();
  const json& a = c["accounting"];
  EXPECT_EQ(a.value("tid", 0u), run.tid) << a.dump();
  ASSERT_TRUE(a.contains("preempted_by") && !a["preempted_by"].empty()) << "[rule, issue 40] " << a.dump();
  EXPECT_EQ(a["preempted_by"][0].value("pid", 0u), run.hog_pid) << "[rule, issue 40] " << a.dump();
  EXPECT_EQ(a["preempted_by"][0].value("comm", ""), "ip-hog") << "[rule, issue 40] " << a.dump();
  const auto d = run.sched->delta(w0, w1);
  ASSERT_TRUE(d.has_value()) << "schedstat does not cover the chain's window: " << run.sched->coverage();
  const double preempted = a.value("preempted_ns", 0.0);
  std::printf(
      "[measure] chain window: schedstat run-queue delay %.1f ms, chain accounting preempted %.1f ms (ratio %.3f)\n",
      ms(*d), ms(preempted), *d > 0 ? preempted / *d : 0.0);
  EXPECT_TRUE(within(preempted, *d, 0.15, 0)) << "[rule, issue 40] chain accounting preempted_ns vs schedstat over its "
                                                 "window\n"
                                              << a.dump();
}

TEST(TimeFindings, SameWorkloadWithoutTheHogHasNoFinding) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  HogRun run;
  hog_run(false, run);
  if (HasFatalFailure()) return;
  if (run.skipped) GTEST_SKIP() << run.skip_why;
  check_accounting_against_schedstat(run, 10e6);
  expect_fast_calls(run);

  // ---- Rule part (issue 40) ----
  std::vector<json> found;
  for (const auto& c : run.ex["chains"])
    if (c.value("tid", 0u) == run.tid && medium_or_high(c)) found.push_back(c);
  EXPECT_TRUE(found.empty()) << "[rule, issue 40] expected no MEDIUM/HIGH chain with tid " << run.tid
                             << " (no hog); found " << found.size() << "\n"
                             << chains_listing(run.ex);
}

// ---- (B) ----------------------------------------------------------------------------------------

struct LoaderRun {
  bool skipped = false;
  std::string skip_why;
  uint32_t pid = 0, tid = 0, loader_tid = 0;  // tid: the feeding (main) thread
  long steps = 0;
  double waited_ns = 0;                   // the script's own measure of its time in next_batch()
  uint64_t loop_start = 0, loop_end = 0;  // when its loop ran (unix ns)
  std::string tracer_log;
  json ex;
  long long offcpu_with_next_batch = 0, offcpu_with_stack = 0;
  std::string python_frames;  // frames of one off-CPU stack of the feeding thread in next_batch
};

// Where autogroups are on, a session's group competes with other sessions' as a whole: the
// process (which made its own session) gets its group at `nice` too.
void autogroup_nice(pid_t pid, int nice) {
  if (::getsid(pid) != pid) return;
  if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/autogroup").c_str(), "w")) {
    std::fprintf(f, "%d\n", nice);
    std::fclose(f);
  }
}

// Measurement: the feeding thread's accounting covers the script's loop (within 0.2 s at each
// end). Once seen covering only 3.3 s of a 10 s loop, not reproduced since: on failure the trace
// is kept (copied beside the tracer's) for a look.
void expect_covers_loop(const LoaderRun& run, const std::string& db) {
  const json a = accounting_of(run.ex, run.tid);
  if (a.is_null()) return;  // the tests say so
  const uint64_t t0 = a.value("start_ns", 0ull), t1 = a.value("end_ns", 0ull);
  const bool ok = t0 <= run.loop_start + 200'000'000ull && t1 + 200'000'000ull >= run.loop_end;
  std::string kept;
  if (!ok) {
    kept = db + ".kept";
    std::error_code ec;
    std::filesystem::copy_file(db, kept, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) kept = "(not kept: " + ec.message() + ")";
  }
  EXPECT_TRUE(ok) << "[measure] the accounting of the feeding thread [" << t0 << ", " << t1
                  << "] does not cover the loop [" << run.loop_start << ", " << run.loop_end << "]; trace kept at "
                  << kept << "\n"
                  << a.dump() << "\n"
                  << run.tracer_log;
}

// py_input_wait.py in `mode` for 10 s under `trace --stack-min 0`: every off-CPU span carries its
// stack (a futex wait shorter than the default 1 ms too, so it is counted as `lock`, not `other`);
// call stacks are rate-limited per thread, off-CPU stacks are not. The script runs at nice -20 in
// its own session, and so does the tracer, for the same reason as in (A).
void loader_run(const std::string& mode, LoaderRun& run) {
  if (::access("/usr/bin/python3", X_OK) != 0 || ::access("/usr/bin/setsid", X_OK) != 0 ||
      ::access("/usr/bin/nice", X_OK) != 0) {
    run.skipped = true;
    run.skip_why = "needs /usr/bin/python3, /usr/bin/setsid and /usr/bin/nice";
    return;
  }
  Child job;
  ASSERT_TRUE(job.spawn({"/usr/bin/setsid", "/usr/bin/nice", "-n", "-20", "/usr/bin/python3",
                         std::string(IP_SOURCE_DIR) + "/tests/workloads/py_input_wait.py", IP_REAL_CUDART, mode, "10"}))
      << "cannot start py_input_wait.py";
  std::istringstream(job.read_line().substr(4)) >> run.tid >> run.loader_tid;  // "tid <main> <loader>"
  ASSERT_GT(run.tid, 0u);
  run.pid = static_cast<uint32_t>(job.pid);
  autogroup_nice(job.pid, -20);
  Tracer tr(IP_PIPELINE_BIN, "time_loader_" + mode);
  tr.start({"--pid", std::to_string(job.pid), "--cuda-lib", IP_REAL_CUDART, "--stack-min", "0"}, -20);
  ASSERT_GT(tr.pid, 0);
  if (!tr.wait_attached()) {
    run.skipped = true;
    run.skip_why = "trace did not attach: " + tr.log();
    return;
  }
  job.go();
  EXPECT_EQ(job.finish(), 0) << job.output;
  std::istringstream(job.output.substr(job.output.find("steps ") + 6)) >> run.steps;
  std::istringstream(job.output.substr(job.output.find("waited_ns ") + 10)) >> run.waited_ns;
  std::string to;
  std::istringstream(job.output.substr(job.output.find("from ") + 5)) >> run.loop_start >> to >> run.loop_end;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int rc = tr.interrupt();
  run.tracer_log = tr.log();
  ASSERT_EQ(rc, 0) << run.tracer_log;
  run.ex = explain(tr.db);
  ASSERT_FALSE(run.ex.is_discarded()) << "explain --json did not print JSON";
  const std::string spans =
      "FROM events e JOIN stack_traces s ON s.hash = e.stack_hash WHERE e.source = 3 AND e.op = 1 "
      "AND e.tid = " +
      std::to_string(run.tid);
  run.offcpu_with_stack = sql_int(tr.db, "SELECT count(*) " + spans);
  run.offcpu_with_next_batch = sql_int(tr.db, "SELECT count(*) " + spans + " AND s.frames LIKE '%next_batch%'");
  run.python_frames = sql_text(tr.db, "SELECT s.frames " + spans + " AND s.frames LIKE '%next_batch%' LIMIT 1");
  expect_covers_loop(run, tr.db);
}

// The Python functions (qualified names) of a stored stack, innermost first.
std::vector<std::string> python_functions(const std::string& frames) {
  std::vector<std::string> out;
  for (const auto& f : ingero::parse_stack_frames(frames).frames)
    if (f.kind == ingero::FrameKind::kPython) out.push_back(f.function);
  return out;
}

// `text` names `fn` as an identifier (not inside a longer word); a name that is also an everyday
// word ("wait", "get") counts only when written as code: "fn(", ".fn" or "fn:".
bool names_function(const std::string& text, const std::string& fn) {
  if (fn.empty()) return false;
  const bool generic = fn == "wait" || fn == "get" || fn == "put" || fn == "acquire" || fn == "run";
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t p = text.find(fn); p != std::string::npos; p = text.find(fn, p + 1)) {
    const char before = p ? text[p - 1] : ' ';
    const char after = p + fn.size() < text.size() ? text[p + fn.size()] : ' ';
    if (ident(before) || ident(after)) continue;
    if (!generic || before == '.' || after == '(' || after == ':') return true;
  }
  return false;
}

TEST(TimeFindings, FeedingThreadStarvedByItsLoaderIsAnInputFinding) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  LoaderRun run;
  loader_run("starved", run);
  if (HasFatalFailure()) return;
  if (run.skipped) GTEST_SKIP() << run.skip_why;
  ASSERT_GT(run.steps, 50) << "too few steps to judge";
  const json a = accounting_of(run.ex, run.tid);
  ASSERT_FALSE(a.is_null()) << "[measure] no accounting entry for the feeding thread " << run.tid;
  const double lock = a["blocked_ns"].value("lock", 0.0), wall = a.value("wall_ns", 0.0);
  std::printf(
      "[measure] starved: %ld steps; the script waited %.1f ms in next_batch(); accounting: lock %.1f ms "
      "(ratio %.3f), %.0f%% of wall %.1f ms; %lld of %lld off-CPU stacks in next_batch\n",
      run.steps, ms(run.waited_ns), ms(lock), run.waited_ns > 0 ? lock / run.waited_ns : 0.0, 100 * lock / wall,
      ms(wall), run.offcpu_with_next_batch, run.offcpu_with_stack);
  EXPECT_TRUE(within(lock, run.waited_ns, 0.15, 0)) << "[measure] blocked_ns.lock vs the script's wait\n" << a.dump();
  EXPECT_GT(lock, 0.7 * wall) << a.dump();
  EXPECT_GE(run.offcpu_with_next_batch, run.steps / 2) << "[measure] off-CPU stacks of the feeding thread in "
                                                          "next_batch";
  const auto py = python_functions(run.python_frames);
  std::printf("[measure] Python frames of a wait, innermost first: %s\n", testing::PrintToString(py).c_str());

  // ---- Rule part (issue 40) ----
  std::vector<json> found;
  for (const auto& c : run.ex["chains"])
    if (c.value("tid", 0u) == run.tid && medium_or_high(c) && c.value("category", "") == "input_starvation")
      found.push_back(c);
  ASSERT_FALSE(found.empty()) << "[rule, issue 40] expected a MEDIUM/HIGH input_starvation chain with tid " << run.tid
                              << " (the feeding thread waits for its loader ~90% of each step); found none\n"
                              << chains_listing(run.ex);
  for (const json& c : found) {
    const std::string text = chain_text(c);
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    EXPECT_NE(lower.find("input"), std::string::npos) << "[rule, issue 40] the finding does not say it waited for "
                                                         "input:\n"
                                                      << text;
    EXPECT_TRUE(lower.find("lock") != std::string::npos || lower.find("futex") != std::string::npos)
        << "[rule, issue 40] the finding does not say what it waited on (a lock/futex):\n"
        << text;
    if (!py.empty()) {
      bool named = false;
      for (const auto& fn : py) named = named || names_function(text, fn);
      EXPECT_TRUE(named) << "[rule, issue 40] the finding names none of the Python frames of the wait "
                         << testing::PrintToString(py) << ":\n"
                         << text;
    }
    ASSERT_TRUE(c.contains("accounting") && c["accounting"].is_object())
        << "[rule, issue 40] the chain has no accounting object: " << c.dump();
    const json& ca = c["accounting"];
    EXPECT_EQ(ca.value("tid", 0u), run.tid) << ca.dump();
    EXPECT_GT(ca["blocked_ns"].value("lock", 0.0), 0.5 * ca.value("wall_ns", 0.0))
        << "[rule, issue 40] the chain's accounting is not mostly lock wait: " << ca.dump();
  }
}

TEST(TimeFindings, FeedingThreadWithBatchesAlwaysReadyHasNoInputFinding) {
  std::string why;
  if (skip_reason(why)) GTEST_SKIP() << why;
  LoaderRun run;
  loader_run("ready", run);
  if (HasFatalFailure()) return;
  if (run.skipped) GTEST_SKIP() << run.skip_why;
  ASSERT_GT(run.steps, 200) << "too few steps to judge";
  const json a = accounting_of(run.ex, run.tid);
  ASSERT_FALSE(a.is_null()) << "[measure] no accounting entry for the feeding thread " << run.tid;
  const double lock = a["blocked_ns"].value("lock", 0.0), wall = a.value("wall_ns", 0.0);
  std::printf(
      "[measure] ready: %ld steps; the script waited %.1f ms in next_batch(); accounting: lock %.1f ms, %.1f%% "
      "of wall %.1f ms\n",
      run.steps, ms(run.waited_ns), ms(lock), 100 * lock / wall, ms(wall));
  EXPECT_LT(lock, 0.15 * wall) << a.dump();

  // ---- Rule part (issue 40) ----
  std::vector<json> found;
  for (const auto& c : run.ex["chains"])
    if (c.value("tid", 0u) == run.tid && medium_or_high(c) && c.value("category", "") == "input_starvation")
      found.push_back(c);
  EXPECT_TRUE(found.empty()) << "[rule, issue 40] expected no MEDIUM/HIGH input_starvation chain with tid " << run.tid
                             << " (batches always ready); found " << found.size() << "\n"
                             << chains_listing(run.ex);
}

}  // namespace
#else
TEST(TimeFindings, Skipped) { GTEST_SKIP() << "built without the pipeline binary, ip-cuda-workload or libcudart"; }
#endif
