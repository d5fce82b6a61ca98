// Join span buffers shared between join stages (engine/runtime.cpp JoinBuffer, IntervalJoin
// "Tags"): every stage that reads the same spans the same way probes one buffer; off-CPU streams
// of one builder share one buffer of all its spans, each stage counting its own states. Sharing
// must never change a result: random traces (calls of several threads, off-CPU spans in every
// state, a state past the tag range, block I/O) run through the default rule pack and through
// plans with several off-CPU filters and duplicate joins in pipes of different windows (so one
// buffer is pruned against the calls of two window groups) give the same chains, evidence (ids
// included), outcomes and counters with sharing on as with a buffer per stage, at batch sizes
// from 1 to 4096, with pruning after every batch, by the default trigger and off. The same traces
// check that a tail read off a capped call buffer's held calls, without compacting it
// (ShardTuning::tail_from_held), is the tail of the compacted buffer, whether or not it fits the cap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/default_plans.h"
#include "engine/runtime.h"
#include "model/ops.h"
#include "operators/interval_join.h"
#include "tests/util/shard_run.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using namespace ex;

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;  // 10 s aligned
constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

// A state no tag can tell apart from another (IntervalJoin::kMaxTag): a stage filtering on it
// keeps a buffer of its own.
const auto kFarState = static_cast<OffCpuState>(70);

// CUDA calls of 3 processes x 2 threads (some slow), off-CPU spans of the calling threads in a
// random state (the four named ones, kOther and kFarState), some overlapping the calls, block I/O
// requests. On a coarse grid in some traces, so starts tie.
std::vector<Event> random_trace(std::mt19937_64& rng, size_t n, uint64_t grid) {
  auto pick = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  const OffCpuState states[] = {OffCpuState::kUnknown,  OffCpuState::kPreempted, OffCpuState::kSleeping,
                                OffCpuState::kDiskWait, OffCpuState::kOther,     kFarState};
  std::vector<Event> ev;
  const uint64_t span_ns = n * 40 * kUs;
  for (size_t i = 0; i < n; ++i) {
    Event e;
    e.ts_ns = kT0 + pick(0, span_ns / grid) * grid;
    e.pid = static_cast<uint32_t>(100 + pick(0, 2));
    e.tid = e.pid * 10 + static_cast<uint32_t>(pick(0, 1));
    const uint64_t r = pick(0, 99);
    if (r < 55) {
      e.source = Source::kCuda;
      e.op = pick(0, 3) ? op::kCudaLaunchKernel : op::kCudaStreamSync;
      e.dur_ns = pick(0, 19) == 0 ? pick(1, 8) * kMs : pick(5, 60) * kUs;
    } else if (r < 90) {
      e.source = Source::kHost;
      e.op = op::kSchedSwitch;
      e.prev_state = states[pick(0, 5)];
      e.dur_ns = pick(0, 9) == 0 ? pick(1, 6) * kMs : pick(1, 200) * kUs;
    } else {
      e.source = Source::kIo;
      e.op = 1;
      e.dur_ns = pick(1, 500) * kUs;
      e.arg0 = pick(1, 64) * 4096;
    }
    ev.push_back(e);
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
  return ev;
}

int add_join(Plan& p, int left, int right, const std::string& name, JoinKind kind, JoinKey key) {
  JoinNode j;
  j.kind = kind;
  j.key = key;
  j.name = name;
  j.within_ns = kind == JoinKind::kWithin ? 100 * kUs : 0;
  j.max_exemplars = 3;
  j.horizon_ns = 300 * kUs;  // windows close within the trace (their lateness follows the horizon)
  j.tail = ge(field(Field::kDuration), ref("p90"));
  return p.add(j, {left, right});
}

// Two pipes (windows of 5 ms and 20 ms: two window groups), each joining its tail calls with
// off-CPU spans filtered four ways (preempted; sleeping or disk wait; every state; kFarState)
// from one builder, with the same join twice, and with a second builder (a longer minimum).
Plan share_plan() {
  Plan p;
  const int scan = p.add(ScanNode{});
  const int calls = p.add(FilterNode{in(field(Field::kSource), {static_cast<double>(Source::kCuda)})}, {scan});
  const int cpu = p.add(OffCpuNode{0, {OffCpuState::kPreempted}}, {scan});
  const int blocked = p.add(OffCpuNode{0, {OffCpuState::kSleeping, OffCpuState::kDiskWait}}, {scan});
  const int all = p.add(OffCpuNode{0, {}}, {scan});
  const int far = p.add(OffCpuNode{0, {kFarState}}, {scan});
  const int longer = p.add(OffCpuNode{50 * kUs, {OffCpuState::kPreempted, OffCpuState::kOther}}, {scan});
  for (const uint64_t size : {5 * kMs, 20 * kMs}) {
    WindowNode w;
    w.kind = WindowKind::kTumbling;
    w.size_ns = w.slide_ns = size;
    w.keys = {Field::kPid, Field::kSource, Field::kOp};
    int id = p.add(w, {calls});
    AggregateNode agg;
    agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}, {"p90", AggKind::kQuantile, Field::kDuration, 0.9}};
    id = p.add(agg, {id});
    id = add_join(p, id, cpu, "cpu", JoinKind::kOverlap, JoinKey::kTid);
    id = add_join(p, id, blocked, "blocked", JoinKind::kOverlap, JoinKey::kTid);
    id = add_join(p, id, all, "all", JoinKind::kOverlap, JoinKey::kTid);
    id = add_join(p, id, all, "all_again", JoinKind::kOverlap, JoinKey::kTid);
    id = add_join(p, id, all, "all_pid", JoinKind::kOverlap, JoinKey::kPid);
    id = add_join(p, id, cpu, "cpu_near", JoinKind::kWithin, JoinKey::kTid);
    id = add_join(p, id, far, "far", JoinKind::kOverlap, JoinKey::kTid);
    id = add_join(p, id, longer, "longer", JoinKind::kOverlap, JoinKey::kTid);
    EmitNode e;
    e.rule = "share" + std::to_string(size / kMs);
    e.category = "test";
    e.summary = "{key}";
    p.add(e, {id});
  }
  return p;
}

uint64_t g_pruned = 0;  // spans the runs pruned (the comparison must cover pruning)

// The trace through one shard of the plan's tier in batches of `batch` events (watermark: the
// batch's last start, the Batch contract).
std::string run(const CompiledPlan& cp, bool global, const std::vector<Event>& ev, size_t batch,
                const ShardTuning& tuning) {
  Shard shard(cp, global, false, tuning);
  std::vector<ShardOutput> outs;
  test::for_each_batch(ev, batch, [&](const ShardInput& in) {
    outs.push_back(shard.process(in));
    g_pruned += outs.back().pruned_spans;
  });
  return test::shard_text(outs);  // everything but the span counters (a shared span is let go of once)
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Sharing on vs off for one plan, over random traces, batch sizes and prune settings. Returns the
// chains seen (so the caller can check the comparison bit).
size_t compare_sharing(const Plan& plan, uint64_t seed, int traces) {
  std::vector<std::string> errors;
  const auto cp = compile_plan(plan, errors);
  EXPECT_TRUE(cp) << (errors.empty() ? "" : errors.front());
  if (!cp) return 0;
  std::mt19937_64 rng(seed);
  size_t chains = 0;
  for (int t = 0; t < traces; ++t) {
    const auto ev = random_trace(rng, 1500 + rng() % 2500, t % 2 ? 50 * kUs : 1);
    for (const size_t batch : {size_t{1}, size_t{7}, size_t{64}, size_t{4096}}) {
      for (int prune = 0; prune < 3; ++prune) {
        SCOPED_TRACE("trace " + std::to_string(t) + " batch " + std::to_string(batch) + " prune " +
                     std::to_string(prune));
        ShardTuning shared, apart;
        shared.max_tail_calls = apart.max_tail_calls = 16;  // calls displaced: candidates change
        shared.prune_spans = apart.prune_spans = prune != 0;
        shared.prune_every_batch = apart.prune_every_batch = prune == 1;
        shared.prune_min_spans = apart.prune_min_spans = prune == 1 ? 0 : 64;
        apart.share_join_buffers = false;
        const std::string a = run(*cp, false, ev, batch, apart);
        const std::string b = run(*cp, false, ev, batch, shared);
        EXPECT_EQ(a, b);
        if (a != b) return chains;  // one diff is enough to read
        chains += count_of(a, " ev ");
      }
    }
  }
  return chains;
}

TEST(JoinShare, SharedBuffersGiveWhatABufferPerStageGives) {
  const size_t evidence = compare_sharing(share_plan(), 20261124, 6);
  EXPECT_GT(evidence, 100u);   // joins produced evidence to compare
  EXPECT_GT(g_pruned, 1000u);  // and the runs pruned spans (against the calls of both groups)
}

TEST(JoinShare, DefaultPackGivesWhatABufferPerStageGives) {
  const size_t evidence = compare_sharing(default_plan(), 7, 4);
  EXPECT_GT(evidence, 0u);
}

// Tails read without compacting (the default) against tails of the compacted buffer, at caps from
// 1 (most tails overflow it: the compacted path) to 64 (every tail fits), on traces whose
// durations tie on a coarse grid (calls equal to the bound, and to each other at the cut).
TEST(JoinShare, TailFromHeldCallsIsTheCompactedTail) {
  std::vector<std::string> errors;
  for (const Plan& plan : {share_plan(), default_plan()}) {
    const auto cp = compile_plan(plan, errors);
    ASSERT_TRUE(cp) << (errors.empty() ? "" : errors.front());
    std::mt19937_64 rng(20261128);
    size_t evidence = 0;
    for (int t = 0; t < 4; ++t) {
      auto ev = random_trace(rng, 2000 + rng() % 2000, t % 2 ? 50 * kUs : 1);
      if (t >= 2)  // durations on a 20 us grid: ties at the bound and at the cap's cut
        for (auto& e : ev) e.dur_ns = std::max<uint64_t>(e.dur_ns / (20 * kUs), 1) * 20 * kUs;
      for (const size_t cap : {size_t{1}, size_t{2}, size_t{3}, size_t{8}, size_t{64}})
        for (const size_t batch : {size_t{1}, size_t{64}, size_t{4096}}) {
          SCOPED_TRACE("trace " + std::to_string(t) + " cap " + std::to_string(cap) + " batch " +
                       std::to_string(batch));
          ShardTuning held, compacted;
          held.max_tail_calls = compacted.max_tail_calls = cap;
          compacted.tail_from_held = false;
          const std::string a = run(*cp, false, ev, batch, compacted);
          const std::string b = run(*cp, false, ev, batch, held);
          ASSERT_EQ(a, b);
          evidence += count_of(a, " ev ");
        }
    }
    EXPECT_GT(evidence, 0u);
  }
}

// Each filter of a shared off-CPU buffer counts its own states only: a call overlapped by one
// preempted and one sleeping span sees the first through "cpu", the second through "blocked",
// both through "all", and the kFarState span only through "far".
TEST(JoinShare, TagsSelectEachStagesStates) {
  IntervalJoin j(JoinKind::kOverlap, 0, true);
  auto span = [](uint64_t ts, uint64_t dur, uint64_t id, OffCpuState st) {
    Event e = test::span_event(ts, dur, id);
    e.prev_state = st;
    return e;
  };
  j.add_right(1, span(100, 10, 1, OffCpuState::kPreempted));
  j.add_right(1, span(105, 20, 2, OffCpuState::kSleeping));
  j.add_right(1, span(130, 5, 3, kFarState));
  j.add_right(1, span(140, 5, 4, OffCpuState::kUnknown));
  auto bit = [](OffCpuState s) { return uint64_t{1} << static_cast<unsigned>(s); };
  const auto cpu = j.probe(1, 0, 200, bit(OffCpuState::kPreempted));
  EXPECT_EQ(cpu.right_ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(cpu.overlap_ns, 10u);
  const auto blocked = j.probe(1, 0, 200, bit(OffCpuState::kSleeping) | bit(OffCpuState::kDiskWait));
  EXPECT_EQ(blocked.right_ids, (std::vector<uint64_t>{2}));
  EXPECT_EQ(blocked.overlap_ns, 20u);
  const auto all = j.probe(1, 0, 200);
  EXPECT_EQ(all.right_ids, (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(all.overlap_ns, 25u + 5 + 5);  // [100, 125) united, [130, 135), [140, 145)
  const auto far = j.probe(1, 0, 200, uint64_t{1} << IntervalJoin::kMaxTag);
  EXPECT_EQ(far.right_ids, (std::vector<uint64_t>{3}));
  const auto unknown = j.probe(1, 0, 200, bit(OffCpuState::kUnknown));
  EXPECT_EQ(unknown.right_ids, (std::vector<uint64_t>{4}));
  // An untagged join keeps no tags: every span is tag 0.
  IntervalJoin plain(JoinKind::kOverlap, 0);
  plain.add_right(1, span(100, 10, 1, OffCpuState::kPreempted));
  EXPECT_EQ(plain.probe(1, 0, 200, bit(OffCpuState::kUnknown)).right_ids, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(plain.probe(1, 0, 200, bit(OffCpuState::kPreempted)).right_ids.empty());
}

}  // namespace
}  // namespace ingero
