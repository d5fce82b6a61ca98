// Rules over time (rules/time.rules) in the default rule pack, end to end through the engine
// (engine/runtime.cpp's Account stream step, merge_window_runs): generated traces with their
// ground truth. A CPU hog that preempts a feeding thread for K seconds in a row gives exactly one
// cpu_preempted finding over those seconds naming the hog; the same trace without the hog, or
// with background preemption below the floor, gives none; the result is the same at any thread
// count and batch size. A feeding thread blocked on a futex most of every step gives an input_wait
// finding; waits whose stack is missing or names no known wait do not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/ops.h"
#include "model/stack.h"
#include "model/trace.h"
#include "rules/pack.h"
#include "tests/util/pack_run.h"

namespace ingero {
namespace {

constexpr uint64_t kSec = 1'000'000'000, kMs = 1'000'000, kUs = 1'000;
constexpr uint64_t kBase = 1'700'000'000 * kSec;  // a second boundary, as live traces' unix ns
constexpr uint32_t kHogPid = 4242, kHogTid = 4243;

Event call(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint8_t o = op::kCudaLaunchKernel) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = pid;
  e.tid = tid;
  e.source = Source::kCuda;
  e.op = o;
  return e;
}

Event switch_span(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, OffCpuState st, uint32_t ran_pid = 0,
                  uint32_t ran_tid = 0, uint64_t stack = 0) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = pid;
  e.tid = tid;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.prev_state = st;
  e.arg0 = ran_pid;  // live capture names the process that ran instead (bpf/host.bpf.c)
  e.arg1 = ran_tid;
  e.stack_id = stack;
  return e;
}

struct Trace {
  std::vector<Event> ev;
  TraceMeta meta;
};

// `seconds` of a feeding thread (pid 100, tid 101: launches every ~1 ms, a sync every ~10 ms) and
// a control feeding thread in another process (pid 200, tid 201, same loop), both with background
// preemption by short-lived tasks (pid 77) well under the 10% floor. In every second listed in
// `hog`, the hog (pid 4242, "ip-hog") preempts tid 101 for a share of the second drawn from
// [lo, hi] (by default 35..60%), in one slice every 3 ms that stays inside the second.
Trace hog_trace(std::mt19937_64& rng, uint64_t seconds, const std::vector<uint64_t>& hog, double lo = 0.35,
                double hi = 0.60) {
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  Trace t;
  t.meta.process_names[100] = "trainer";
  t.meta.process_names[200] = "control";
  t.meta.process_names[kHogPid] = "ip-hog";
  for (const auto& [pid, tid] : {std::pair<uint32_t, uint32_t>{100, 101}, {200, 201}}) {
    for (uint64_t ts = kBase + uni(0, kMs); ts < kBase + seconds * kSec; ts += uni(800 * kUs, 1200 * kUs)) {
      t.ev.push_back(call(pid, tid, ts, uni(10 * kUs, 30 * kUs)));
      if (uni(0, 9) == 0) t.ev.push_back(call(pid, tid, ts + 40 * kUs, uni(100 * kUs, 300 * kUs), op::kCudaStreamSync));
    }
    // Background: a short preemption now and then (about 2% of the time).
    for (uint64_t ts = kBase + uni(0, 50 * kMs); ts < kBase + seconds * kSec; ts += uni(20 * kMs, 60 * kMs))
      t.ev.push_back(switch_span(pid, tid, ts, uni(100 * kUs, 900 * kUs), OffCpuState::kPreempted, 77,
                                 static_cast<uint32_t>(uni(7700, 7709))));
  }
  for (uint64_t s : hog) {
    const auto slice = static_cast<uint64_t>(std::uniform_real_distribution<double>(lo, hi)(rng) * 3 * kMs);
    for (uint64_t ts = kBase + s * kSec; ts + 3 * kMs <= kBase + (s + 1) * kSec; ts += 3 * kMs)
      t.ev.push_back(
          switch_span(100, 101, ts + uni(0, 3 * kMs - slice), slice, OffCpuState::kPreempted, kHogPid, kHogTid));
  }
  std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return t;
}

AnalysisResult run_pack(const Trace& t, unsigned threads = 1, size_t batch = 4096) {
  VectorSource src(t.ev, batch, t.meta);
  return test::run_pack(src, threads);
}

std::vector<const Chain*> chains_of(const AnalysisResult& r, const std::string& rule) {
  std::vector<const Chain*> v;
  for (const auto& c : r.chains)
    if (c.rule == rule) v.push_back(&c);
  return v;
}

double value_of(const Chain& c, const std::string& name) {
  for (const auto& [k, v] : c.values)
    if (k == name) return v;
  ADD_FAILURE() << "no value " << name << " in chain " << c.id;
  return -1;
}

std::string chains_text(const AnalysisResult& r) {
  std::string s;
  for (const auto& c : r.chains)
    s += c.rule + " tid " + std::to_string(c.tid) + " [" + std::to_string((c.window_start - kBase) / kMs) + "ms, " +
         std::to_string((c.window_end - kBase) / kMs) + "ms): " + c.summary + "\n";
  return s;
}

// Runs of consecutive hog seconds, merged as merge_window_runs does: windows that fire with gaps
// of at most two windows between them are one finding.
struct Run {
  uint64_t first, last;  // seconds, inclusive
  size_t windows;
};
std::vector<Run> expected_runs(std::vector<uint64_t> hog) {
  std::sort(hog.begin(), hog.end());
  std::vector<Run> runs;
  for (uint64_t s : hog) {
    if (!runs.empty() && s <= runs.back().last + 3) {
      runs.back().last = s;
      ++runs.back().windows;
    } else {
      runs.push_back({s, s, 1});
    }
  }
  return runs;
}

void expect_findings(const AnalysisResult& r, const std::vector<uint64_t>& hog, const std::string& what) {
  SCOPED_TRACE(what);
  const auto runs = expected_runs(hog);
  const auto found = chains_of(r, "cpu_preempted");
  ASSERT_EQ(found.size(), runs.size()) << chains_text(r);
  std::vector<const Chain*> sorted = found;
  std::sort(sorted.begin(), sorted.end(),
            [](const Chain* a, const Chain* b) { return a->window_start < b->window_start; });
  for (size_t i = 0; i < runs.size(); ++i) {
    const Chain& c = *sorted[i];
    EXPECT_EQ(c.pid, 100u);
    EXPECT_EQ(c.tid, 101u);
    EXPECT_EQ(c.category, "cpu_contention");
    EXPECT_TRUE(c.over_time);
    EXPECT_EQ(c.severity, Severity::kHigh);
    EXPECT_EQ(c.window_start, kBase + runs[i].first * kSec) << chains_text(r);
    EXPECT_EQ(c.window_end, kBase + (runs[i].last + 1) * kSec) << chains_text(r);
    EXPECT_EQ(value_of(c, "windows"), static_cast<double>(runs[i].windows));
    EXPECT_EQ(value_of(c, "by"), kHogPid);
    const double share = value_of(c, "share");
    EXPECT_GE(share, 0.35);
    EXPECT_LE(share, 0.62);
    EXPECT_NE(c.summary.find("ip-hog (pid 4242) ran instead"), std::string::npos) << c.summary;
    if (runs[i].windows > 1) {
      EXPECT_NE(c.summary.find("(worst of " + std::to_string(runs[i].windows) + " windows in a row)"),
                std::string::npos)
          << c.summary;
    }
  }
}

TEST(TimeRules, AHogForKSecondsIsOneCpuPreemptedFindingOverThem) {
  std::mt19937_64 rng(42);
  for (uint64_t k : {1u, 2u, 3u, 5u}) {
    const uint64_t start = 3 + rng() % 4;  // after a few calm seconds: the thread has a baseline
    std::vector<uint64_t> hog;
    for (uint64_t s = start; s < start + k; ++s) hog.push_back(s);
    const Trace t = hog_trace(rng, start + k + 4, hog);
    const auto r = run_pack(t);
    expect_findings(r, hog, "K " + std::to_string(k) + " from +" + std::to_string(start) + "s");
  }
}

TEST(TimeRules, WindowsThatFireWithinTwoWindowsOfEachOtherAreOneFinding) {
  std::mt19937_64 rng(43);
  // Gaps of 1 and 2 calm windows join the runs; a gap of 3 starts another finding.
  for (const auto& hog : {std::vector<uint64_t>{4, 5, 7, 8}, std::vector<uint64_t>{4, 7, 8},
                          std::vector<uint64_t>{4, 5, 9, 10}, std::vector<uint64_t>{3, 7, 11}}) {
    const Trace t = hog_trace(rng, 14, hog);
    std::string what;
    for (uint64_t s : hog) what += std::to_string(s) + " ";
    expect_findings(run_pack(t), hog, "hog seconds " + what);
  }
}

TEST(TimeRules, NoHogNoCpuPreemptedFinding) {
  std::mt19937_64 rng(44);
  for (int round = 0; round < 3; ++round) {
    const Trace t = hog_trace(rng, 12, {});
    const auto r = run_pack(t);
    EXPECT_TRUE(chains_of(r, "cpu_preempted").empty()) << chains_text(r);
    EXPECT_TRUE(chains_of(r, "input_wait").empty()) << chains_text(r);
  }
}

// Between the 10% floor and the 15% that fires whatever the history, a window fires only above the
// thread's own baseline (median + 3 MAD + 5 points of its previous 30 windows), as MEDIUM.
TEST(TimeRules, ModeratePreemptionFiresOnlyAboveTheThreadsOwnBaseline) {
  std::mt19937_64 rng(48);
  // Calm (~2%) for 6 s, then 15..20% for 2 s: above the baseline.
  Trace t = hog_trace(rng, 10, {6, 7}, 0.15, 0.20);
  auto r = run_pack(t);
  auto found = chains_of(r, "cpu_preempted");
  ASSERT_EQ(found.size(), 1u) << chains_text(r);
  EXPECT_EQ(found[0]->severity, Severity::kMedium);
  EXPECT_EQ(found[0]->window_start, kBase + 6 * kSec);
  EXPECT_EQ(found[0]->window_end, kBase + 8 * kSec);
  EXPECT_EQ(value_of(*found[0], "windows"), 2);
  EXPECT_LT(value_of(*found[0], "trend.median"), 0.05);
  EXPECT_GE(value_of(*found[0], "trend.history"), 6);
  // A share under the standing floor (15%) from the first second on is the thread's normal: never
  // above its baseline.
  std::vector<uint64_t> always;
  for (uint64_t s = 0; s < 10; ++s) always.push_back(s);
  t = hog_trace(rng, 10, always, 0.08, 0.11);
  r = run_pack(t);
  EXPECT_TRUE(chains_of(r, "cpu_preempted").empty()) << chains_text(r);
  // From the floor on, a neighbour present from the start is contention however long it has
  // lasted (`standing_preempted_share`): one finding over the whole run, naming the hog.
  t = hog_trace(rng, 10, always, 0.16, 0.20);
  r = run_pack(t);
  found = chains_of(r, "cpu_preempted");
  ASSERT_EQ(found.size(), 1u) << chains_text(r);
  EXPECT_EQ(found[0]->window_start, kBase);
  EXPECT_EQ(found[0]->window_end, kBase + 10 * kSec);
  EXPECT_NE(found[0]->summary.find("ip-hog (pid 4242) ran instead"), std::string::npos) << found[0]->summary;
}

// The whole result (chains, rule outcomes, counters) is the one-thread result at 2 and 4 threads
// and batches of 4096, 777 and 64 events; also with a third feeding thread (pid 500) that was
// sleeping and preempted by the hog for 4 s before its first GPU call (a few long spans): that
// time is not its accounting's (it was not known to feed the GPU), whatever the batches.
TEST(TimeRules, SameFindingsAtAnyThreadCountAndBatchSize) {
  std::mt19937_64 rng(45);
  const std::vector<uint64_t> hog = {4, 5, 6};
  for (bool prelude : {false, true}) {
    Trace t = hog_trace(rng, 10, hog);
    if (prelude) {
      for (uint64_t ts = kBase; ts < kBase + 4 * kSec; ts += 800 * kMs) {
        t.ev.push_back(switch_span(500, 501, ts, 700 * kMs, OffCpuState::kSleeping));
        t.ev.push_back(switch_span(500, 501, ts + 720 * kMs, 50 * kMs, OffCpuState::kPreempted, kHogPid, kHogTid));
      }
      for (uint64_t ts = kBase + 4 * kSec; ts < kBase + 10 * kSec; ts += kMs)
        t.ev.push_back(call(500, 501, ts, 20 * kUs));
      std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    }
    SCOPED_TRACE(prelude ? "with a thread's prelude" : "");
    const auto one = run_pack(t, 1, 4096);
    expect_findings(one, hog, "1 thread");
    const std::string base = test::result_text(one);
    for (unsigned threads : {1u, 2u, 4u})
      for (size_t batch : {size_t{4096}, size_t{777}, size_t{64}}) {
        const auto r = run_pack(t, threads, batch);
        EXPECT_EQ(r.counters.late_events, 0u) << threads << " threads, batch " << batch;
        // Not EXPECT_EQ on the strings: a mismatch would print two large JSON documents.
        EXPECT_TRUE(test::result_text(r) == base) << threads << " threads, batch " << batch << "\n"
                                                  << chains_text(r) << "vs\n"
                                                  << chains_text(one);
      }
  }
}

// --- input_wait ---------------------------------------------------------------------------------

StackTrace kernel_stack(std::initializer_list<const char*> frames) {
  ParsedStack p;
  for (const char* f : frames) {
    StackFrame fr;
    fr.kind = FrameKind::kKernel;
    fr.function = f;
    p.frames.push_back(fr);
  }
  return encode_stack(p);
}

// A feeding thread (pid 300, tid 301) whose step is ~50 ms: a launch, then a wait of `wait` per
// step (sleeping, with the switch-out stack `stack`, 0 for none), for `seconds`.
Trace wait_trace(std::mt19937_64& rng, uint64_t seconds, uint64_t wait, uint64_t stack) {
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  Trace t;
  t.meta.process_names[300] = "loader";
  t.meta.stacks[11] = kernel_stack({"futex_wait_queue", "futex_wait", "do_futex"});
  t.meta.stacks[12] = kernel_stack({"do_epoll_wait", "ep_poll"});
  for (uint64_t ts = kBase + uni(0, kMs); ts < kBase + seconds * kSec; ts += uni(48 * kMs, 52 * kMs)) {
    t.ev.push_back(call(300, 301, ts, uni(80 * kUs, 120 * kUs)));
    t.ev.push_back(switch_span(300, 301, ts + kMs, wait, OffCpuState::kSleeping, 0, 0, stack));
  }
  std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return t;
}

TEST(TimeRules, BlockedOnAFutexMostOfEveryStepIsInputWait) {
  std::mt19937_64 rng(46);
  const Trace t = wait_trace(rng, 6, 45 * kMs, 11);
  const auto r = run_pack(t);
  const auto found = chains_of(r, "input_wait");
  ASSERT_EQ(found.size(), 1u) << chains_text(r);
  const Chain& c = *found[0];
  EXPECT_EQ(c.tid, 301u);
  EXPECT_EQ(c.category, "input_starvation");
  EXPECT_EQ(c.severity, Severity::kHigh);  // ~90% of every window
  EXPECT_EQ(c.window_start, kBase);
  EXPECT_EQ(c.window_end, kBase + 6 * kSec);
  EXPECT_EQ(value_of(c, "windows"), 6);
  EXPECT_GE(value_of(c, "lock"), 0.85 * 1e9);
  EXPECT_EQ(value_of(c, "other"), 0);
  EXPECT_TRUE(chains_of(r, "cpu_preempted").empty()) << chains_text(r);
  // The same at another thread count and batch size.
  VectorSource src(t.ev, 333, t.meta);
  EXPECT_TRUE(test::result_text(test::run_pack(src, 2)) == test::result_text(r));
}

TEST(TimeRules, UnrecognisedOrShortWaitsAreNotInputWait) {
  std::mt19937_64 rng(47);
  struct Case {
    const char* what;
    uint64_t wait, stack;
  };
  for (const Case& k : {Case{"no stack", 45 * kMs, 0}, Case{"a stack the trace does not hold", 45 * kMs, 99},
                        Case{"epoll: no known wait", 45 * kMs, 12}, Case{"futex, 30% of the step", 15 * kMs, 11}}) {
    const Trace t = wait_trace(rng, 6, k.wait, k.stack);
    const auto r = run_pack(t);
    EXPECT_TRUE(chains_of(r, "input_wait").empty()) << k.what << "\n" << chains_text(r);
  }
}

}  // namespace
}  // namespace ingero
