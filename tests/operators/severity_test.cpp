// Severity in one place (operators/severity.h): the contract's rules one by one on decide_severity,
// and the cases issue 41 names through the chain annotator and grade_chain:
// - one slow call in a 10 s window is LOW at most, whatever the rule declared;
// - a recorded preemption costing 20% of a thread's time is HIGH, though the rule declared MEDIUM;
// - the vLLM case: one 0.6 ms cudaLaunchKernel overlapping one off-CPU span of unknown state in a
//   10 s window, declared MEDIUM cpu_contention, is LOW;
// - grading twice gives the same answer (the declaration is remembered), and a warm-up is a phase:
//   with the step period known, a chain after the first steps is not demoted for warm-up.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops.h"
#include "model/trace.h"
#include "operators/chain_annotate.h"
#include "operators/severity.h"

namespace ingero {
namespace {

constexpr uint64_t kSec = 1'000'000'000, kMs = 1'000'000, kUs = 1'000;
constexpr uint64_t kBase = 1'700'000'000 * kSec;

Event call(uint64_t ts, uint64_t dur) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = 100;
  e.tid = 101;
  e.source = Source::kCuda;
  e.op = op::kCudaLaunchKernel;
  return e;
}

Event off_cpu(uint64_t ts, uint64_t dur, OffCpuState st) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = 100;
  e.tid = 101;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.prev_state = st;
  return e;
}

// A tail chain on pid 100's launches over [kBase + 20 s, +30 s) as the pack emits it (after the
// process's warm-up: its first call is at kBase).
Chain tail_chain(const std::string& category, Severity declared) {
  Chain c;
  c.id = category + ":pid=100:" + std::to_string(kBase + 20 * kSec);
  c.rule = category;
  c.category = category;
  c.severity = declared;
  c.source = Source::kCuda;
  c.op = op::kCudaLaunchKernel;
  c.pid = 100;
  c.window_start = kBase + 20 * kSec;
  c.window_end = kBase + 30 * kSec;
  c.values = {{"p50", 10.0 * kUs}, {"p95", 12.0 * kUs}};
  c.root_cause = "declared";
  return c;
}

// 30 s of launches every 2 ms (10 us each), plus what the test adds.
std::vector<Event> loop(std::vector<Event> extra) {
  std::vector<Event> ev;
  for (uint64_t ts = kBase; ts < kBase + 30 * kSec; ts += 2 * kMs) ev.push_back(call(ts, 10 * kUs));
  for (auto& e : extra) ev.push_back(e);
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

ThreadAccounting account(uint64_t wall, uint64_t preempted, bool sched) {
  ThreadAccounting a;
  a.pid = 100;
  a.tid = 101;
  a.wall_ns = wall;
  a.preempted_ns = preempted;
  a.on_cpu_ns = wall - preempted;
  a.scheduler_data = sched;
  return a;
}

TEST(Severity, OneSlowCallInATenSecondWindowIsLowAtMost) {
  for (Severity declared : {Severity::kHigh, Severity::kMedium}) {
    ChainAnnotator a;
    const auto ev = loop({call(kBase + 25 * kSec + 1 * kMs, 50 * kMs)});
    a.add(std::span<const Event>(ev));
    Chain c = tail_chain("unexplained_tail", declared);
    a.annotate(c, TraceMeta{});
    EXPECT_EQ(c.severity, Severity::kLow) << c.root_cause;
    EXPECT_NE(c.root_cause.find("a single call stands behind it"), std::string::npos) << c.root_cause;
    // Graded again at the end (with the thread's accounting): still LOW, said once.
    c.accounting = account(10 * kSec, 0, true);
    grade_chain(c);
    EXPECT_EQ(c.severity, Severity::kLow);
    EXPECT_EQ(c.root_cause.find("[severity"), c.root_cause.rfind("[severity")) << c.root_cause;
    EXPECT_EQ(c.declared_severity, declared);
  }
}

TEST(Severity, ManySlowCallsKeepTheDeclaredSeverity) {
  // The control: 400 slow calls of 5 ms in the window (2 s lost of 10 s) are not demoted.
  std::vector<Event> slow;
  for (int i = 0; i < 400; ++i) slow.push_back(call(kBase + 20 * kSec + i * 25 * kMs + kMs, 5 * kMs));
  ChainAnnotator a;
  const auto ev = loop(slow);
  a.add(std::span<const Event>(ev));
  Chain c = tail_chain("unexplained_tail", Severity::kHigh);
  a.annotate(c, TraceMeta{});
  EXPECT_EQ(c.severity, Severity::kHigh) << c.root_cause;
  EXPECT_EQ(c.root_cause, "declared");
}

TEST(Severity, RecordedPreemptionCostingTwentyPercentIsHigh) {
  Chain c;
  c.id = "cpu_preempted:pid=100,tid=101:1";
  c.rule = "cpu_preempted";
  c.category = "cpu_contention";
  c.severity = Severity::kMedium;  // the rule: high only from 30%
  c.over_time = true;
  c.pid = 100;
  c.tid = 101;
  c.window_start = kBase;
  c.window_end = kBase + 10 * kSec;
  c.values = {{"trend.median", 0.0}};
  c.accounting = account(10 * kSec, 2 * kSec, true);
  EXPECT_EQ(grade_chain(c).reason, SeverityReason::kHighImpact);
  EXPECT_EQ(c.severity, Severity::kHigh) << c.root_cause;
  // Against a baseline of 15%, the same window lost only 5%: the rule's MEDIUM stands.
  c.values = {{"trend.median", 0.15}};
  grade_chain(c);
  EXPECT_EQ(c.severity, Severity::kMedium) << c.root_cause;
  EXPECT_EQ(c.root_cause.find("[severity"), std::string::npos) << c.root_cause;
}

TEST(Severity, VllmOneCallOverOneUnknownStateSpanIsLow) {
  // The trace records no off-CPU state (Ingero's): one 0.6 ms launch overlaps one off-CPU span.
  const uint64_t at = kBase + 24 * kSec + 1 * kMs;
  ChainAnnotator a;
  const auto ev = loop({call(at, 600 * kUs), off_cpu(at + 100 * kUs, 400 * kUs, OffCpuState::kUnknown)});
  a.add(std::span<const Event>(ev));
  Chain c = tail_chain("cpu_contention", Severity::kMedium);
  a.annotate(c, TraceMeta{});
  c.accounting = account(10 * kSec, 0, false);
  grade_chain(c);
  EXPECT_EQ(c.severity, Severity::kLow) << c.root_cause;
}

TEST(Severity, DecideFollowsTheContractInOrder) {
  SeverityFacts f;
  f.declared = Severity::kHigh;
  f.category = "throughput_drop";
  EXPECT_EQ(decide_severity(f).level, Severity::kHigh);
  f.lossy = true;
  EXPECT_EQ(decide_severity(f).reason, SeverityReason::kLossy);
  f.lossy = false;
  f.split_dominant_blocked = true;
  f.split_blocked = 0.6;
  EXPECT_EQ(decide_severity(f).level, Severity::kLow);
  f.split_blocked = 0.4;
  EXPECT_EQ(decide_severity(f).level, Severity::kMedium);
  f = SeverityFacts{};
  f.declared = Severity::kHigh;
  f.category = "implicit_sync";
  f.not_in_loop = true;
  EXPECT_EQ(decide_severity(f).reason, SeverityReason::kNotInLoop);
  // Warm-up alone: LOW, unless abnormal, or a recorded contention costing >= 5% of the thread.
  f = SeverityFacts{};
  f.declared = Severity::kHigh;
  f.category = "cpu_contention";
  f.warmup_only = true;
  EXPECT_EQ(decide_severity(f).reason, SeverityReason::kWarmup);
  f.warmup_abnormal = true;
  EXPECT_EQ(decide_severity(f).level, Severity::kHigh);
  f.warmup_abnormal = false;
  f.evidence = EvidenceStrength::kRecorded;
  f.lost_ns = 1 * kSec;
  f.base_ns = 10 * kSec;
  EXPECT_EQ(decide_severity(f).level, Severity::kHigh);
  // Unknown state caps contention at MEDIUM; negligible impact is LOW.
  f = SeverityFacts{};
  f.declared = Severity::kHigh;
  f.category = "cpu_contention";
  f.evidence = EvidenceStrength::kUnknownState;
  f.lost_ns = 2 * kSec;
  f.base_ns = 10 * kSec;
  EXPECT_EQ(decide_severity(f).reason, SeverityReason::kUnknownState);
  f.lost_ns = 10 * kMs;
  EXPECT_EQ(decide_severity(f).reason, SeverityReason::kNegligible);
  // A tail rule's declaration is an upper bound: impact never raises it.
  f = SeverityFacts{};
  f.declared = Severity::kMedium;
  f.category = "cpu_contention";
  f.evidence = EvidenceStrength::kRecorded;
  f.lost_ns = 5 * kSec;
  f.base_ns = 10 * kSec;
  EXPECT_EQ(decide_severity(f).level, Severity::kMedium);
  f.over_time = true;
  EXPECT_EQ(decide_severity(f).level, Severity::kHigh);
}

TEST(Severity, WarmupIsAPhaseOfTheProcessWhenItsStepsAreKnown) {
  Chain c = tail_chain("unexplained_tail", Severity::kHigh);
  c.window_start = kBase + 5 * kSec;  // inside the fixed 10 s warm-up
  c.window_end = kBase + 15 * kSec;
  c.values.push_back({"slow.calls", 50});
  c.values.push_back({"warmup.only", 1});
  Chain fixed = c;
  grade_chain(fixed);
  EXPECT_EQ(fixed.severity, Severity::kLow);
  // Steps of 100 ms from kBase: the warm-up (3 steps) ended at +0.3 s, long before this window.
  std::vector<ProcessSteps> steps(1);
  steps[0].pid = 100;
  steps[0].period_ns = 100 * kMs;
  steps[0].p50_ns = 100 * kMs;
  steps[0].method = "cudaStreamSynchronize x1";
  steps[0].first_ns = kBase;
  SeverityContext ctx;
  ctx.steps = &steps;
  grade_chain(fixed, ctx);
  EXPECT_EQ(fixed.severity, Severity::kHigh) << fixed.root_cause;
  EXPECT_EQ(fixed.root_cause, "declared");
}

}  // namespace
}  // namespace ingero
