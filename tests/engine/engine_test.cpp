// The engine end to end on small hand-made traces: the CPU-contention chain needs off-CPU time of
// the SAME thread inside the slow calls; results do not depend on threads or batch size.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "engine/runtime.h"
#include "model/ops.h"

namespace ingero {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;  // 10 s aligned
constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

Event call(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint64_t id) {
  Event e;
  e.source = Source::kCuda;
  e.op = op::kCudaLaunchKernel;
  e.pid = pid;
  e.tid = tid;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.id = id;
  return e;
}

Event offcpu(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint64_t id,
             OffCpuState st = OffCpuState::kPreempted) {
  Event e;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.pid = pid;
  e.tid = tid;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.id = id;
  e.prev_state = st;
  return e;
}

// 100 launches on tid 11 of pid 10, 20 us each, 5 of them 3 ms long; `where` places off-CPU spans.
enum class OffCpuWhere { kSameThreadInsideCalls, kOtherThreadInsideCalls, kSameThreadBetweenCalls, kNone };

std::vector<Event> launch_trace(OffCpuWhere where, OffCpuState st = OffCpuState::kPreempted) {
  std::vector<Event> ev;
  uint64_t id = 1, ts = kT0 + kMs;
  for (int i = 0; i < 100; ++i) {
    const bool slow = i % 20 == 7;
    const uint64_t dur = slow ? 3 * kMs : 20 * kUs;
    ev.push_back(call(10, 11, ts, dur, id++));
    if (slow) {
      switch (where) {
        case OffCpuWhere::kSameThreadInsideCalls:
          ev.push_back(offcpu(10, 11, ts + 100 * kUs, 2500 * kUs, id++, st));
          break;
        case OffCpuWhere::kOtherThreadInsideCalls:
          ev.push_back(offcpu(10, 12, ts + 100 * kUs, 2500 * kUs, id++, st));
          break;
        case OffCpuWhere::kSameThreadBetweenCalls:
          ev.push_back(offcpu(10, 11, ts + dur + 10 * kUs, 2 * kMs, id++, st));
          break;
        case OffCpuWhere::kNone: break;
      }
    }
    ts += dur + 5 * kMs;
  }
  return ev;
}

AnalysisResult analyse(std::vector<Event> ev, unsigned threads = 1, size_t batch = 4096) {
  VectorSource src(std::move(ev), batch);
  EngineOptions o;
  o.threads = threads;
  std::vector<std::string> errors;
  auto r = run_plan(default_plan(), src, o, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  return r;
}

std::vector<std::string> categories(const AnalysisResult& r) {
  std::vector<std::string> c;
  for (const auto& ch : r.chains) c.push_back(ch.category);
  return c;
}

bool has(const AnalysisResult& r, const std::string& cat) {
  const auto c = categories(r);
  return std::find(c.begin(), c.end(), cat) != c.end();
}

TEST(Engine, CpuContentionWhenSameThreadIsOffCpuInsideSlowCalls) {
  const auto r = analyse(launch_trace(OffCpuWhere::kSameThreadInsideCalls));
  ASSERT_TRUE(has(r, "cpu_contention")) << testing::PrintToString(categories(r));
  EXPECT_FALSE(has(r, "unexplained_tail"));
  const Chain& c = *std::find_if(r.chains.begin(), r.chains.end(),
                                 [](const Chain& c) { return c.category == "cpu_contention"; });
  EXPECT_EQ(c.pid, 10u);
  EXPECT_EQ(c.op, op::kCudaLaunchKernel);
  EXPECT_EQ(c.p50_ns, 20 * kUs);
  EXPECT_EQ(c.p99_ns, 3 * kMs);
  // 2.5 ms of each 3 ms slow call is covered: share 83%.
  double share = 0;
  for (const auto& [k, v] : c.values)
    if (k == "offcpu.share") share = v;
  EXPECT_NEAR(share, 2500.0 / 3000.0, 1e-9);
  EXPECT_EQ(c.severity, Severity::kHigh);  // >= 80% and p99/p50 >= 10
  // Evidence carries exemplar ids: a slow call and the off-CPU span inside it.
  bool exemplars = false;
  for (const auto& e : c.evidence)
    if (e.kind == "offcpu" && e.event_ids.size() >= 2) exemplars = true;
  EXPECT_TRUE(exemplars);
  // Provenance: the predicates it passed, with values.
  ASSERT_GE(c.predicates.size(), 3u);
  EXPECT_EQ(c.predicates.back().label, "offcpu.share >= 50%");
  EXPECT_NEAR(c.predicates.back().lhs, share, 1e-9);
}

TEST(Engine, NoCpuContentionWhenAnotherThreadIsOffCpu) {
  const auto r = analyse(launch_trace(OffCpuWhere::kOtherThreadInsideCalls));
  EXPECT_FALSE(has(r, "cpu_contention")) << "off-CPU time of tid 12 must not explain tid 11's calls";
  EXPECT_TRUE(has(r, "unexplained_tail"));
}

TEST(Engine, NoCpuContentionWhenOffCpuTimeFallsBetweenCalls) {
  const auto r = analyse(launch_trace(OffCpuWhere::kSameThreadBetweenCalls));
  EXPECT_FALSE(has(r, "cpu_contention"));
  EXPECT_TRUE(has(r, "unexplained_tail"));
  for (const auto& o : r.rules)
    if (o.rule == "cpu_contention") {
      ASSERT_TRUE(o.has_miss);
      EXPECT_EQ(o.miss.label, "offcpu.share >= 50%");
      EXPECT_DOUBLE_EQ(o.miss.lhs, 0.0);
      EXPECT_NEAR(o.miss.margin, -0.5, 1e-12);
    }
}

TEST(Engine, BlockedThreadIsBlockingNotContention) {
  const auto r = analyse(launch_trace(OffCpuWhere::kSameThreadInsideCalls, OffCpuState::kSleeping));
  EXPECT_TRUE(has(r, "blocking"));
  EXPECT_FALSE(has(r, "cpu_contention"));
}

TEST(Engine, QuietTraceHasNoChain) {
  auto ev = launch_trace(OffCpuWhere::kNone);
  for (auto& e : ev) e.dur_ns = 20 * kUs;  // no tail at all
  const auto r = analyse(ev);
  EXPECT_TRUE(r.chains.empty()) << testing::PrintToString(categories(r));
}

TEST(Engine, TraceEndingMidWindowIsNotAThroughputDrop) {
  // A steady 1,000 launches/s for 45 s: the last window is half covered, not half as busy.
  std::vector<Event> ev;
  uint64_t id = 1;
  for (uint64_t t = 0; t < 45'000; ++t) ev.push_back(call(10, 11, kT0 + t * kMs, 20 * kUs, id++));
  const auto r = analyse(ev);
  EXPECT_FALSE(has(r, "throughput_drop")) << testing::PrintToString(categories(r));
  // The same trace with the rate really cut in the last full window does fire.
  std::vector<Event> drop;
  id = 1;
  for (uint64_t t = 0; t < 50'000; ++t)
    if (t < 40'000 || t % 5 == 0) drop.push_back(call(10, 11, kT0 + t * kMs, 20 * kUs, id++));
  EXPECT_TRUE(has(analyse(drop), "throughput_drop"));
}

TEST(Engine, EmptyTrace) {
  const auto r = analyse({});
  EXPECT_TRUE(r.chains.empty());
  EXPECT_TRUE(r.ops.empty());
  EXPECT_EQ(r.counters.events_in, 0u);
}

std::string fingerprint(const AnalysisResult& r) {
  std::string s;
  for (const auto& c : r.chains) {
    s += c.id + "|" + c.category + "|" + severity_name(c.severity) + "|" + c.summary + "\n";
    for (const auto& [k, v] : c.values) s += k + "=" + std::to_string(v) + ";";
    for (const auto& e : c.evidence)
      for (auto id : e.event_ids) s += std::to_string(id) + ",";
    s += "\n";
  }
  for (const auto& o : r.ops)
    s += op_name(o.source, o.op) + ":" + std::to_string(o.count) + ":" + std::to_string(o.p50_ns) + ":" +
         std::to_string(o.p99_ns) + "\n";
  for (const auto& o : r.rules)
    s += o.rule + ":" + std::to_string(o.windows) + ":" + std::to_string(o.chains) + ":" + o.miss.label + ":" +
         o.miss_key + "\n";
  return s;
}

TEST(Engine, SameResultWithOneOrSeveralThreadsAndAnyBatchSize) {
  // Several processes so the pid shards really split the work.
  std::vector<Event> ev;
  uint64_t next_id = 1;
  for (uint32_t p = 0; p < 6; ++p) {
    auto part = launch_trace(p % 2 ? OffCpuWhere::kSameThreadInsideCalls : OffCpuWhere::kOtherThreadInsideCalls);
    for (auto& e : part) {
      e.pid += p * 100;
      e.tid += p * 100;
      e.ts_ns += p * 777 * kUs;
      e.id = next_id++;
    }
    ev.insert(ev.end(), part.begin(), part.end());
  }
  // Host-wide block I/O broadcast to every shard.
  for (int i = 0; i < 50; ++i) {
    Event io;
    io.source = Source::kIo;
    io.op = op::kBlockWrite;
    io.pid = 999;
    io.tid = 999;
    io.ts_ns = kT0 + static_cast<uint64_t>(i) * 9 * kMs;
    io.dur_ns = 4 * kMs;
    io.id = next_id++;
    ev.push_back(io);
  }
  const std::string base = fingerprint(analyse(ev, 1, 4096));
  EXPECT_FALSE(base.empty());
  for (unsigned threads : {2u, 3u, 4u})
    EXPECT_EQ(fingerprint(analyse(ev, threads, 4096)), base) << threads << " threads";
  for (size_t batch : {1u, 7u, 100u}) EXPECT_EQ(fingerprint(analyse(ev, 2, batch)), base) << "batch " << batch;
}

// A window busier than the join buffer (kMaxTailCalls) whose tail still fits in it: the buffer
// keeps the slowest calls, so the join result is exact.
std::vector<Event> busy_window(uint32_t fast, uint32_t slow_every, uint64_t fast_dur, uint64_t slow_dur, uint64_t gap) {
  std::vector<Event> ev;
  uint64_t id = 1, ts = kT0 + kMs;
  for (uint32_t i = 0; i < fast; ++i) {
    const bool slow = i % slow_every == 0;
    const uint64_t dur = slow ? slow_dur : fast_dur;
    ev.push_back(call(10, 11, ts, dur, id++));
    if (slow) ev.push_back(offcpu(10, 11, ts + dur / 10, dur / 2, id++));
    ts += dur + gap;
  }
  return ev;
}

double value(const Chain& c, const std::string& name) {
  for (const auto& [k, v] : c.values)
    if (k == name) return v;
  return -1;
}

TEST(Engine, BusyWindowWhoseTailFitsTheBufferIsExact) {
  // 150,000 calls in one 10 s window, every 50th 1 ms long with the thread off CPU for half of
  // it: 3,000 slow calls, fewer than kMaxTailCalls, among many more calls than that.
  const auto ev = busy_window(150'000, 50, 20 * kUs, 1 * kMs, 10 * kUs);
  ASSERT_GT(ev.size(), kMaxTailCalls);
  const auto r = analyse(ev);
  ASSERT_TRUE(has(r, "cpu_contention")) << testing::PrintToString(categories(r));
  const Chain& c = *std::find_if(r.chains.begin(), r.chains.end(),
                                 [](const Chain& c) { return c.category == "cpu_contention"; });
  EXPECT_EQ(value(c, "offcpu.calls"), 3000);
  EXPECT_EQ(value(c, "offcpu.hit_calls"), 3000);
  EXPECT_NEAR(value(c, "offcpu.share"), 0.5, 1e-9);
  EXPECT_GE(r.counters.tail_windows_capped, 1u);
  EXPECT_EQ(fingerprint(analyse(ev, 3, 333)), fingerprint(r));
}

TEST(Engine, TailLargerThanTheBufferIsJudgedOnItsSlowestCalls) {
  // 30% of 100,000 calls tie at the slow duration, so the tail (>= p95) holds 30,000 calls: more
  // than kMaxTailCalls. The join is judged on the kMaxTailCalls slowest and the evidence says so.
  const auto ev = busy_window(100'000, 10, 10 * kUs, 200 * kUs, 20 * kUs);
  std::vector<Event> more = ev;
  uint64_t id = ev.size() + 1, ts = ev.back().ts_ns + 30 * kUs;
  for (uint32_t i = 0; i < 20'000; ++i, ts += 230 * kUs) {  // more slow calls: 30% of all
    more.push_back(call(10, 11, ts, 200 * kUs, id++));
    more.push_back(offcpu(10, 11, ts + 20 * kUs, 100 * kUs, id++));
  }
  const auto r = analyse(more);
  ASSERT_TRUE(has(r, "cpu_contention")) << testing::PrintToString(categories(r));
  const Chain& c = *std::find_if(r.chains.begin(), r.chains.end(),
                                 [](const Chain& c) { return c.category == "cpu_contention"; });
  EXPECT_EQ(value(c, "offcpu.calls"), static_cast<double>(kMaxTailCalls));
  EXPECT_EQ(value(c, "offcpu.hit_calls"), static_cast<double>(kMaxTailCalls));
  EXPECT_NEAR(value(c, "offcpu.share"), 0.5, 1e-9);
  bool said = false;
  for (const auto& e : c.evidence)
    if (e.kind == "offcpu" &&
        e.detail.find("judged on the 16,384 slowest of the window's 120,000 calls") != std::string::npos)
      said = true;
  EXPECT_TRUE(said) << testing::PrintToString(c.evidence.size());
  EXPECT_GE(r.counters.tail_windows_capped, 1u);
}

// Like a live source: the name of a process becomes known only after its first batch.
class LateNamingSource final : public EventSource {
 public:
  explicit LateNamingSource(std::vector<Event> ev) : inner_(std::move(ev), 16) {}
  bool next(Batch& out) override {
    const bool more = inner_.next(out);
    if (more && ++batches_ == 2) meta_.process_names[10] = "train.py";
    return more;
  }
  TraceMeta& meta() override { return meta_; }

 private:
  VectorSource inner_;
  TraceMeta meta_;
  int batches_ = 0;
};

TEST(Engine, ChainsNameProcessesLearnedWhileRunning) {
  LateNamingSource src(launch_trace(OffCpuWhere::kSameThreadInsideCalls));
  std::vector<std::string> errors;
  const auto r = run_plan(default_plan(), src, EngineOptions{}, &errors);
  ASSERT_TRUE(has(r, "cpu_contention")) << testing::PrintToString(categories(r));
  for (const auto& c : r.chains) {
    EXPECT_NE(c.summary.find("train.py"), std::string::npos) << c.summary;
    EXPECT_EQ(c.summary.find("pid 10"), std::string::npos) << c.summary;
  }
}

// A job that ends while the capture goes on: its last window is short, not slow.
std::vector<Event> job_ends_mid_window(bool with_exit_event) {
  std::vector<Event> ev;
  uint64_t id = 1;
  for (uint64_t t = 0; t < 55'000 * kMs; t += 10 * kMs) {
    if (t < 35'000 * kMs) ev.push_back(call(10, 11, kT0 + t, 20 * kUs, id++));
    ev.push_back(call(99, 99, kT0 + t + kMs, 20 * kUs, id++));  // another process goes on
  }
  if (with_exit_event) {
    Event exit;
    exit.source = Source::kHost;
    exit.op = op::kProcessExit;
    exit.pid = exit.tid = 10;
    exit.ts_ns = kT0 + 35'500 * kMs;
    exit.id = id++;
    ev.push_back(exit);
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

TEST(Engine, ProcessExitingMidWindowIsNotAThroughputDrop) {
  // Without the exit event the last window of pid 10 holds 5 s of calls over 10 s: a drop to 50%
  // of its peak (what the rule must say when a process silently stops launching).
  const auto silent = analyse(job_ends_mid_window(false));
  ASSERT_TRUE(has(silent, "throughput_drop")) << testing::PrintToString(categories(silent));
  // With it, the window's rate is over the 5.5 s the process lived: 91% of its peak, no chain.
  const auto exited = analyse(job_ends_mid_window(true));
  EXPECT_FALSE(has(exited, "throughput_drop")) << testing::PrintToString(categories(exited));
}

// The same pid exits again 5.5 s later (pid reuse; some traces record every thread's exit), in
// the next window. The window the process ended in must still end at its first exit, whether the
// second one was read before that window closed (one batch of the whole trace) or after (small
// batches): the rate used to come from the latest exit seen, so the chain depended on the batch
// size (engine_parity_fuzz found it).
TEST(Engine, AProcessExitingAgainKeepsTheRateOfTheWindowItEndedIn) {
  auto ev = job_ends_mid_window(true);
  Event again = ev.back();
  for (const Event& e : ev)
    if (e.op == op::kProcessExit && e.source == Source::kHost) again = e;
  again.ts_ns = kT0 + 41'000 * kMs;
  again.id = ev.size() + 1;
  ev.insert(std::upper_bound(ev.begin(), ev.end(), again,
                             [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; }),
            again);
  for (const size_t batch : {size_t{16}, size_t{4096}, size_t{1} << 20})
    for (const unsigned threads : {1u, 2u}) {
      const auto r = analyse(ev, threads, batch);
      EXPECT_FALSE(has(r, "throughput_drop"))
          << "batch " << batch << ", " << threads << " threads: " << testing::PrintToString(categories(r));
    }
}

// 1,500 short-lived processes exit along the trace too, so the shard prunes the exits it holds
// (past 1,024, those older than every open window): the exit of pid 10's last window is still
// there when that window closes, at every batch size.
TEST(Engine, PruningExitsKeepsTheOnesOpenWindowsNeed) {
  auto ev = job_ends_mid_window(true);
  uint64_t id = ev.size() + 1;
  for (uint32_t p = 0; p < 1500; ++p) {
    Event exit;
    exit.source = Source::kHost;
    exit.op = op::kProcessExit;
    exit.pid = exit.tid = 1000 + p;
    exit.ts_ns = kT0 + p * 36 * kMs + 7 * kUs;
    exit.id = id++;
    ev.push_back(exit);
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (const size_t batch : {size_t{16}, size_t{4096}, size_t{1} << 20}) {
    const auto r = analyse(ev, 1, batch);
    EXPECT_FALSE(has(r, "throughput_drop")) << "batch " << batch << ": " << testing::PrintToString(categories(r));
  }
}

// Twelve processes (more than any shard count divides evenly) plus host-wide block I/O.
std::vector<Event> many_process_trace() {
  std::vector<Event> ev;
  uint64_t next_id = 1;
  for (uint32_t p = 0; p < 12; ++p) {
    auto part = launch_trace(p % 3 ? OffCpuWhere::kSameThreadInsideCalls : OffCpuWhere::kOtherThreadInsideCalls);
    for (auto& e : part) {
      e.pid += p * 100;
      e.tid += p * 100;
      e.ts_ns += p * 313 * kUs;
      e.id = next_id++;
    }
    ev.insert(ev.end(), part.begin(), part.end());
  }
  for (int i = 0; i < 80; ++i) {
    Event io;
    io.source = Source::kIo;
    io.op = i % 2 ? op::kBlockWrite : op::kBlockRead;
    io.pid = io.tid = 999;
    io.ts_ns = kT0 + static_cast<uint64_t>(i) * 7 * kMs;
    io.dur_ns = 3 * kMs;
    io.id = next_id++;
    ev.push_back(io);
  }
  return ev;
}

// Several pid shards per thread (two per thread, up to 16 shards at 8+ threads): the
// result is the one-thread result for every thread count and batch size, every event is counted
// once, and the chains found are not an empty match.
TEST(Engine, ManyShardsPerThreadGiveTheOneThreadResult) {
  const auto ev = many_process_trace();
  const auto one = analyse(ev, 1, 4096);
  const std::string base = fingerprint(one);
  ASSERT_TRUE(has(one, "cpu_contention")) << testing::PrintToString(categories(one));
  EXPECT_EQ(one.counters.events_in, ev.size());
  for (unsigned threads : {2u, 5u, 8u, 17u}) {
    for (size_t batch : {1u, 64u, 4096u}) {
      const auto r = analyse(ev, threads, batch);
      EXPECT_EQ(fingerprint(r), base) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.events_in, ev.size()) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.threads, threads);
      EXPECT_EQ(r.counters.node_errors, 0u);
    }
  }
}

// A source that ends without a final batch (next() returns false): the engine closes the
// windows itself, with any number of threads.
class NoFinalBatchSource final : public EventSource {
 public:
  explicit NoFinalBatchSource(std::vector<Event> ev) : inner_(std::move(ev), 50) {}
  bool next(Batch& out) override {
    if (!inner_.next(out)) return false;
    if (out.final) {
      out.final = false;  // hand the events over, but never say it was the last batch
      out.watermark = out.events.empty() ? 0 : out.events.back().ts_ns;
    }
    return true;
  }
  TraceMeta& meta() override { return inner_.meta(); }

 private:
  VectorSource inner_;
};

TEST(Engine, SourceWithoutFinalBatchStillClosesEveryWindow) {
  const auto ev = many_process_trace();
  const std::string base = fingerprint(analyse(ev, 1, 50));
  for (unsigned threads : {1u, 2u, 3u}) {
    NoFinalBatchSource src(ev);
    EngineOptions o;
    o.threads = threads;
    const auto r = run_plan(default_plan(), src, o);
    EXPECT_EQ(fingerprint(r), base) << threads << " threads";
    EXPECT_EQ(r.counters.events_in, ev.size()) << threads << " threads";
  }
}

// Progress: never goes backwards, never passes the events read, and ends at the total (every
// batch fully processed) with one or several threads and no barrier between batches.
TEST(Engine, ProgressIsMonotonicAndEndsAtTheTotal) {
  const auto ev = many_process_trace();
  for (unsigned threads : {1u, 2u, 4u}) {
    VectorSource src(ev, 16);
    EngineOptions o;
    o.threads = threads;
    std::vector<uint64_t> seen;
    o.on_progress = [&](uint64_t n) { seen.push_back(n); };
    const auto r = run_plan(default_plan(), src, o);
    ASSERT_FALSE(seen.empty()) << threads << " threads";
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end())) << threads << " threads";
    EXPECT_LE(seen.back(), ev.size());
    EXPECT_EQ(r.counters.events_in, ev.size());
    // The last call comes after the final batch was handed over; with one thread it has been
    // processed already.
    if (threads == 1) {
      EXPECT_EQ(seen.back(), ev.size());
    }
  }
}

// Chains reach on_chain once each, from one thread at a time, whatever the thread count.
TEST(Engine, OnChainSeesEveryChainOnce) {
  const auto ev = many_process_trace();
  for (unsigned threads : {1u, 3u}) {
    VectorSource src(ev, 32);
    EngineOptions o;
    o.threads = threads;
    std::vector<std::string> ids;
    o.on_chain = [&](const Chain& c) { ids.push_back(c.id); };
    const auto r = run_plan(default_plan(), src, o);
    std::vector<std::string> want;
    for (const auto& c : r.chains) want.push_back(c.id);
    std::sort(ids.begin(), ids.end());
    std::sort(want.begin(), want.end());
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(ids, want) << threads << " threads";
  }
}

// EngineOptions::max_kept_chains (agent): every chain still reaches on_chain, but the result keeps
// at most the cap, the most recent ones (an always-on capture's memory does not grow with them).
TEST(Engine, MaxKeptChainsBoundsTheResultNotTheDelivery) {
  const auto ev = many_process_trace();
  for (unsigned threads : {1u, 3u}) {
    VectorSource all_src(ev, 32);
    EngineOptions all;
    all.threads = threads;
    const auto full = run_plan(default_plan(), all_src, all);
    ASSERT_GE(full.chains.size(), 4u) << "the fixture must fire several chains";
    VectorSource src(ev, 32);
    EngineOptions o = all;
    o.max_kept_chains = 2;
    size_t delivered = 0;
    o.on_chain = [&](const Chain&) { ++delivered; };
    const auto r = run_plan(default_plan(), src, o);
    EXPECT_EQ(delivered, full.chains.size()) << threads << " threads";
    EXPECT_LE(r.chains.size(), 2u) << threads << " threads";
    EXPECT_FALSE(r.chains.empty());
  }
}

// One process stops launching mid-window while another goes on to the end of the trace: the
// first one's last window is judged up to the trace's end (a drop), whichever shard it shares
// with whom. A shard that ended windows at its own last event would see no drop.
TEST(Engine, TraceEndIsTheSameForEveryShard) {
  std::vector<Event> ev;
  uint64_t id = 1;
  for (uint64_t t = 0; t < 49'900; t += 1) {
    if (t < 45'000) ev.push_back(call(10, 11, kT0 + t * kMs, 20 * kUs, id++));
    if (t % 50 == 0) ev.push_back(call(20, 21, kT0 + t * kMs + 300 * kUs, 20 * kUs, id++));
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  const auto one = analyse(ev, 1, 4096);
  ASSERT_TRUE(has(one, "throughput_drop")) << testing::PrintToString(categories(one));
  const std::string base = fingerprint(one);
  for (unsigned threads : {2u, 3u, 4u, 8u})
    EXPECT_EQ(fingerprint(analyse(ev, threads, 4096)), base) << threads << " threads";
}

TEST(Engine, InvalidPlanIsRejectedWithMessages) {
  Plan p;
  const int scan = p.add(ScanNode{});
  WindowNode w;
  const int win = p.add(w, {scan});
  AggregateNode agg;
  agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}};
  const int a = p.add(agg, {win});
  const int req = p.add(RequireNode{ex::ge(ex::ref("no_such_name"), ex::num(1)), "x"}, {a});
  EmitNode em;
  em.rule = "r";
  p.add(em, {req});
  VectorSource src({});
  std::vector<std::string> errors;
  run_plan(p, src, {}, &errors);
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("no_such_name"), std::string::npos);
}

}  // namespace
}  // namespace ingero
