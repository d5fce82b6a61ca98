// Join span pruning (ShardTuning, IntervalJoin::prune) never changes a result: random traces run
// through plans with interval joins (overlap and within; on tid, pid and host; instants, long
// spans, zero-length calls; one window and tumbling windows; a small call-buffer cap so calls are
// displaced) give the same chains, evidence and outcomes with pruning after every batch as with
// pruning off (also with the prune's candidates built one slice of the join keys at a time), and
// pruning does drop spans on them. The same runs with full-size call buffers
// (ShardTuning::narrow_calls off; calls of two pids in one window, calls past 2^32 ns) give the
// same results as the narrow ones. Plus IntervalJoin::prune's own contract on hand-made cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "model/ops.h"
#include "operators/interval_join.h"
#include "tests/util/shard_run.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using namespace ex;

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;  // 10 s aligned
constexpr uint64_t kUs = 1000;

struct Shape {
  bool whole = false;       // one window over the trace, else tumbling windows
  uint64_t window_ns = 0;   // tumbling size
  bool by_op_only = false;  // keyed by (source, op): runs in the global shard
  uint64_t horizon_ns = 0;  // joins' horizon (windows' lateness follows)
  uint64_t within_ns = 0;   // the kWithin joins' reach
  int tail = 0;             // 0: every call, 1: duration >= p50, 2: a condition evaluated per call
  size_t cap = 0;           // call-buffer cap (ShardTuning::max_tail_calls)
};

int add_join(Plan& p, int left, int right, const std::string& name, JoinKind kind, JoinKey key, const Shape& s) {
  JoinNode j;
  j.kind = kind;
  j.key = key;
  j.name = name;
  j.within_ns = kind == JoinKind::kWithin ? s.within_ns : 0;
  j.horizon_ns = s.horizon_ns;
  j.max_exemplars = 3;
  switch (s.tail) {
    case 0: j.tail = ge(field(Field::kDuration), num(0)); break;
    case 1: j.tail = ge(field(Field::kDuration), ref("p50")); break;
    default: j.tail = lor(ge(field(Field::kDuration), ref("p50")), eq(field(Field::kTid), num(2))); break;
  }
  return p.add(j, {left, right});
}

Plan join_plan(const Shape& s) {
  Plan p;
  const int scan = p.add(ScanNode{});
  const int calls = p.add(FilterNode{in(field(Field::kSource), {static_cast<double>(Source::kCuda)})}, {scan});
  const int offcpu = p.add(OffCpuNode{0, {}}, {scan});
  const int io = p.add(FilterNode{eq(field(Field::kSource), num(static_cast<double>(Source::kIo)))}, {scan});
  const int mem = p.add(FilterNode{land(eq(field(Field::kSource), num(static_cast<double>(Source::kHost))),
                                        eq(field(Field::kOp), num(op::kPageAlloc)))},
                        {scan});
  WindowNode w;
  w.kind = s.whole ? WindowKind::kWhole : WindowKind::kTumbling;
  w.size_ns = w.slide_ns = s.whole ? 10'000'000'000ull : s.window_ns;
  w.keys = s.by_op_only ? std::vector<Field>{Field::kSource, Field::kOp}
                        : std::vector<Field>{Field::kPid, Field::kSource, Field::kOp};
  int id = p.add(w, {calls});
  AggregateNode agg;
  agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}, {"p50", AggKind::kQuantile, Field::kDuration, 0.5}};
  id = p.add(agg, {id});
  id = add_join(p, id, offcpu, "off_tid", JoinKind::kOverlap, JoinKey::kTid, s);
  id = add_join(p, id, offcpu, "off_pid", JoinKind::kOverlap, JoinKey::kPid, s);
  id = add_join(p, id, io, "io_host", JoinKind::kOverlap, JoinKey::kNone, s);
  id = add_join(p, id, io, "io_within", JoinKind::kWithin, JoinKey::kPid, s);
  id = add_join(p, id, mem, "mem_within", JoinKind::kWithin, JoinKey::kNone, s);
  id = add_join(p, id, offcpu, "off_within", JoinKind::kWithin, JoinKey::kTid, s);
  EmitNode e;
  e.rule = "joins";
  e.category = "test";
  e.summary = "{key}";
  p.add(e, {id});
  return p;
}

// A random trace on a coarse time grid (so calls and spans often start or end at the same
// nanosecond): CUDA calls of 2 processes x 2 threads (some zero-length, some long), off-CPU
// spans (some very long), block I/O requests and instants (some with bytes in arg0, so a join
// buffer starts keeping arg0 midway), page-allocation instants.
std::vector<Event> random_trace(std::mt19937_64& rng, size_t n, uint64_t span_ns, uint64_t grid = 50) {
  auto pick = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  std::vector<Event> ev;
  for (size_t i = 0; i < n; ++i) {
    Event e;
    e.ts_ns = kT0 + pick(0, span_ns / grid) * grid;
    e.tid = static_cast<uint32_t>(pick(1, 4));
    e.pid = e.tid <= 2 ? 1 : 2;
    const uint64_t r = pick(0, 99);
    if (r < 55) {
      e.source = Source::kCuda;
      e.op = pick(0, 2) ? op::kCudaLaunchKernel : op::kCudaStreamSync;
      const uint64_t k = pick(0, 199);
      // A few calls last longer than 2^32 ns (the call buffer then keeps full-size calls).
      e.dur_ns = k == 0    ? 5'000'000'000ull + pick(0, 9)
                 : k < 10  ? 0
                 : k < 160 ? pick(1, 20) * grid
                           : pick(20, 400) * grid;
    } else if (r < 80) {
      e.source = Source::kHost;
      e.op = op::kSchedSwitch;
      e.prev_state = OffCpuState::kPreempted;
      const uint64_t k = pick(0, 29);
      e.dur_ns = k == 0 ? pick(1000, 4000) * grid : pick(1, 40) * grid;
    } else if (r < 93) {
      e.source = Source::kIo;
      e.op = 1;
      e.dur_ns = pick(0, 2) == 0 ? 0 : pick(1, 60) * grid;
      if (pick(0, 3) == 0) e.arg0 = pick(1, 64) * 4096;  // bytes, for some requests only
    } else {
      e.source = Source::kHost;
      e.op = op::kPageAlloc;
      e.dur_ns = 0;
      e.arg0 = pick(1, 1000) * 4096;
    }
    ev.push_back(e);
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
  return ev;
}

// The text of everything but evicted_spans, which counts pruned spans too (interval_join.h): with
// pruning it is at least what it is without, by the spans pruned before reaching the horizon.
struct RunResult {
  std::string text;
  uint64_t pruned = 0;
  uint64_t evicted = 0;
  uint64_t spilled_blocks = 0;  // join span blocks that went to the spill file (join_resident_bytes)
};

// Runs the trace through one shard of the plan's tier in batches of `batch` events, watermark =
// the batch's last start (the Batch contract), like a replay source.
RunResult run(const CompiledPlan& cp, bool global, const std::vector<Event>& ev, size_t batch,
              const ShardTuning& tuning) {
  Shard shard(cp, global, false, tuning);
  std::vector<ShardOutput> outs;
  RunResult r;
  test::for_each_batch(ev, batch, [&](const ShardInput& in) {
    auto out = shard.process(in);
    r.pruned += out.pruned_spans;
    if (in.final) {
      r.evicted = out.counters.evicted_spans;
      r.spilled_blocks = out.counters.join_spilled_blocks;
      EXPECT_EQ(out.counters.join_spill_errors + out.counters.join_spill_read_errors, 0u);
    }
    outs.push_back(std::move(out));
  });
  r.text = test::shard_text(outs);
  return r;
}

TEST(JoinPrune, RandomPlansGiveIdenticalResultsWithAndWithoutPruning) {
  std::mt19937_64 rng(20261123);
  uint64_t pruned_total = 0, chains_seen = 0;
  for (int round = 0; round < 48; ++round) {
    Shape s;
    s.whole = round % 3 == 0;
    s.window_ns = (50 + rng() % 400) * kUs;
    s.by_op_only = round % 4 == 1;
    s.horizon_ns = (rng() % 4) * 20 * kUs;
    s.within_ns = (rng() % 3) * 5 * kUs;
    s.tail = static_cast<int>(rng() % 3);
    s.cap = round % 2 ? 4 + rng() % 12 : 64;
    const size_t n = 400 + rng() % 1600;
    // A coarse grid in some rounds: many events share a start, also across batch boundaries (a
    // call in the next batch may start exactly at this batch's watermark).
    const uint64_t grid = round % 3 == 2 ? 5000 : 50;
    const auto ev = random_trace(rng, n, (200 + rng() % 3000) * kUs, grid);
    std::vector<std::string> errors;
    const auto cp = compile_plan(join_plan(s), errors);
    ASSERT_TRUE(cp) << errors.front();
    const size_t batch = 1 + rng() % 64;
    SCOPED_TRACE("round " + std::to_string(round) + " events " + std::to_string(n) + " batch " + std::to_string(batch) +
                 " cap " + std::to_string(s.cap) + (s.whole ? " whole" : " tumbling"));
    ShardTuning off, every;
    off.max_tail_calls = every.max_tail_calls = s.cap;
    off.prune_spans = false;
    every.prune_every_batch = true;
    every.prune_min_spans = 0;
    ShardTuning wide = off;  // call buffers in full form from the start (no narrow calls)
    wide.narrow_calls = false;
    const auto a = run(*cp, s.by_op_only, ev, batch, off);
    const auto b = run(*cp, s.by_op_only, ev, batch, every);
    EXPECT_EQ(a.pruned, 0u);
    ASSERT_EQ(a.text, b.text);
    // Pruning only takes spans out earlier: at least the unpruned count, at most it plus the pruned.
    EXPECT_GE(b.evicted, a.evicted);
    EXPECT_LE(b.evicted, a.evicted + b.pruned);
    const auto c = run(*cp, s.by_op_only, ev, batch, wide);
    ASSERT_EQ(c.text, a.text);
    EXPECT_EQ(c.evicted, a.evicted);
    // The candidates built and pruned one slice of the join keys at a time (as with millions of
    // held calls): the same spans dropped as by one prune with every candidate.
    ShardTuning sliced = every;
    sliced.prune_candidates_per_pass = 1 + rng() % 3;
    const auto d = run(*cp, s.by_op_only, ev, batch, sliced);
    ASSERT_EQ(d.text, a.text);
    EXPECT_EQ(d.pruned, b.pruned);
    EXPECT_EQ(d.evicted, b.evicted);
    pruned_total += b.pruned;
    chains_seen += static_cast<uint64_t>(std::count(a.text.begin(), a.text.end(), '\n'));
  }
  // Not vacuous: pruning dropped spans, and the runs produced chains to compare.
  EXPECT_GT(pruned_total, 1000u);
  EXPECT_GT(chains_seen, 100u);
}

// The default trigger (prune once a join holds prune_min_spans, 1.5 x what the last prune left and
// more spans than calls held) on a longer trace in one window: identical results, spans pruned.
TEST(JoinPrune, DefaultTriggerGivesIdenticalResults) {
  std::mt19937_64 rng(7);
  Shape s;
  s.whole = true;
  s.horizon_ns = 100'000 * kUs;  // longer than the trace: eviction never drops a span
  s.within_ns = 10 * kUs;
  s.tail = 1;
  const auto ev = random_trace(rng, 60'000, 40'000 * kUs);
  std::vector<std::string> errors;
  const auto cp = compile_plan(join_plan(s), errors);
  ASSERT_TRUE(cp) << errors.front();
  ShardTuning off, def;
  off.max_tail_calls = def.max_tail_calls = 256;  // spans outnumber the held calls
  off.prune_spans = false;
  def.prune_min_spans = 1024;
  const auto a = run(*cp, false, ev, 4096, off);
  const auto b = run(*cp, false, ev, 4096, def);
  ASSERT_EQ(a.text, b.text);
  EXPECT_GT(b.pruned, 0u);
  EXPECT_EQ(a.evicted, 0u);  // nothing reaches the horizon
  EXPECT_EQ(b.evicted, b.pruned);
}

// Join span blocks in a spill file (ShardTuning::join_resident_bytes; IntervalJoin "Spill") change
// nothing: longer traces (so keys fill many 256-span blocks) through one window with pruning, and
// tumbling windows whose evictions drop spilled blocks whole or bring them back to drop some spans,
// with pruning and without, keyed per pid and per op, give the same results and counts with every
// sealed block spilled (a budget of one byte) or past a budget of a few blocks.
TEST(JoinPrune, SpilledSpanBlocksGiveIdenticalResults) {
  std::mt19937_64 rng(20261124);
  uint64_t spilled_total = 0;
  for (int round = 0; round < 8; ++round) {
    Shape s;
    s.whole = round < 3;
    s.window_ns = (2'000 + rng() % 3'000) * kUs;
    s.by_op_only = round % 4 == 3;
    s.horizon_ns = s.whole ? 100'000 * kUs : (rng() % 3) * 500 * kUs;
    s.within_ns = (rng() % 3) * 5 * kUs;
    s.tail = round % 3;
    const auto ev = random_trace(rng, 12'000 + rng() % 8'000, 20'000 * kUs);
    std::vector<std::string> errors;
    const auto cp = compile_plan(join_plan(s), errors);
    ASSERT_TRUE(cp) << errors.front();
    const size_t batch = 1 + rng() % 512;
    SCOPED_TRACE("round " + std::to_string(round) + " batch " + std::to_string(batch));
    ShardTuning base;
    base.max_tail_calls = 512;
    base.prune_min_spans = 1024;
    base.prune_spans = round % 2 == 0;
    ShardTuning all = base, some = base;
    all.join_resident_bytes = 1;
    some.join_resident_bytes = 16 << 10;
    const auto a = run(*cp, s.by_op_only, ev, batch, base);
    const auto b = run(*cp, s.by_op_only, ev, batch, all);
    const auto c = run(*cp, s.by_op_only, ev, batch, some);
    EXPECT_EQ(a.spilled_blocks, 0u);
    ASSERT_EQ(b.text, a.text);
    ASSERT_EQ(c.text, a.text);
    EXPECT_EQ(b.pruned, a.pruned);
    EXPECT_EQ(b.evicted, a.evicted);
    EXPECT_EQ(c.evicted, a.evicted);
    EXPECT_GT(b.spilled_blocks, c.spilled_blocks);
    spilled_total += b.spilled_blocks;
  }
  EXPECT_GT(spilled_total, 100u);  // not vacuous: blocks went to the file
}

// Call buffers' chunks of calls in the spill file (CallChunks in engine/runtime.cpp, under the
// same budget as the join span blocks) change nothing: keys with thousands of calls in one window
// or in tumbling windows, a cap some keys pass (their chunks, spilled ones included, go back to
// the TopK in arrival order) and some do not, a key whose calls widen midway (a call past 32
// bits after spilled chunks), with pruning (which lists the held calls, spilled ones read back)
// and without: the same results and counts with every full chunk spilled as with none.
TEST(JoinPrune, SpilledCallChunksGiveIdenticalResults) {
  std::mt19937_64 rng(20261129);
  uint64_t spilled_total = 0;
  for (int round = 0; round < 6; ++round) {
    Shape s;
    s.whole = round % 2 == 0;
    s.window_ns = (8'000 + rng() % 6'000) * kUs;
    s.horizon_ns = (rng() % 3) * 500 * kUs;
    s.within_ns = (rng() % 3) * 5 * kUs;
    s.tail = round % 3;
    auto ev = random_trace(rng, 24'000 + rng() % 16'000, 20'000 * kUs);
    // Narrow calls (under 2^32 ns) but for one long call midway in odd rounds: its key widens
    // after chunks of it were spilled.
    bool widened = false;
    for (size_t i = 0; i < ev.size(); ++i) {
      Event& e = ev[i];
      if (e.source != Source::kCuda || e.dur_ns <= 4'000'000'000ull) continue;
      e.dur_ns = (round % 2 == 1 && !widened && i > ev.size() / 2) ? e.dur_ns : 400 * 50;
      widened = widened || e.dur_ns > 4'000'000'000ull;
    }
    std::vector<std::string> errors;
    const auto cp = compile_plan(join_plan(s), errors);
    ASSERT_TRUE(cp) << errors.front();
    const size_t batch = 1 + rng() % 2048;
    SCOPED_TRACE("round " + std::to_string(round) + " batch " + std::to_string(batch));
    ShardTuning base;
    base.max_tail_calls = round < 3 ? 3'000 + rng() % 3'000 : kMaxTailCalls;
    base.prune_min_spans = 1024;
    base.prune_spans = round % 3 != 2;
    ShardTuning all = base, some = base;
    all.join_resident_bytes = 1;
    some.join_resident_bytes = 64 << 10;
    const auto a = run(*cp, false, ev, batch, base);
    const auto b = run(*cp, false, ev, batch, all);
    const auto c = run(*cp, false, ev, batch, some);
    EXPECT_EQ(a.spilled_blocks, 0u);
    ASSERT_EQ(b.text, a.text);
    ASSERT_EQ(c.text, a.text);
    EXPECT_EQ(b.pruned, a.pruned);
    EXPECT_EQ(b.evicted, a.evicted);
    EXPECT_EQ(c.evicted, a.evicted);
    // Full-form call buffers have no chunks: what they spill is the span blocks alone.
    ShardTuning wide = all;
    wide.narrow_calls = false;
    const auto d = run(*cp, false, ev, batch, wide);
    ASSERT_EQ(d.text, a.text);
    EXPECT_GT(b.spilled_blocks, d.spilled_blocks);
    spilled_total += b.spilled_blocks - d.spilled_blocks;
  }
  EXPECT_GT(spilled_total, 20u);  // not vacuous: chunks of calls went to the file
}

using test::span_event;

std::vector<uint64_t> ids_after_prune(JoinKind kind, uint64_t within, const std::vector<Event>& spans, uint64_t floor,
                                      std::vector<IntervalJoin::CallRange> calls) {
  IntervalJoin j(kind, within);
  for (const auto& e : spans) j.add_right(7, e);
  std::unordered_map<uint64_t, std::vector<IntervalJoin::CallRange>> cand;
  if (!calls.empty()) cand[7] = std::move(calls);
  j.prune(floor, cand);
  EXPECT_EQ(j.pruned() + j.buffered(), spans.size());
  return j.probe(7, 0, 1'000'000).right_ids;
}

TEST(JoinPrune, KeepsSpansACandidateOrAFutureCallCanTouch) {
  // Spans (ids): 1 [10,20), 2 [30,30] instant, 3 [40,50), 4 [95,120) ends past the floor,
  // 5 [60,70), 6 [70,70] instant at the candidate's end.
  const std::vector<Event> spans = {span_event(10, 10, 1), span_event(30, 0, 2), span_event(40, 10, 3),
                                    span_event(60, 10, 5), span_event(70, 0, 6), span_event(95, 25, 4)};
  // Candidate call [50, 70): touches 3 (closed ranges meet at 50), 5, 6; floor 100 keeps 4.
  EXPECT_EQ(ids_after_prune(JoinKind::kOverlap, 0, spans, 100, {{50, 70}}), (std::vector<uint64_t>{3, 5, 6, 4}));
  // No candidates: only what a call starting at or after the floor can reach.
  EXPECT_EQ(ids_after_prune(JoinKind::kOverlap, 0, spans, 100, {}), (std::vector<uint64_t>{4}));
  // An instant exactly at the floor stays (a call may start there).
  EXPECT_EQ(ids_after_prune(JoinKind::kOverlap, 0, {span_event(50, 10, 8), span_event(100, 0, 9)}, 100, {}),
            (std::vector<uint64_t>{9}));
  // Spans with one start go all or none: 12 is touched, so 11 (same start) stays too.
  EXPECT_EQ(ids_after_prune(JoinKind::kOverlap, 0, {span_event(20, 5, 11), span_event(20, 40, 12)}, 100, {{50, 55}}),
            (std::vector<uint64_t>{11, 12}));
  // kWithin widens both: a future call at 100 reaches back to 100 - 35 = 65 (keeps 5, 6, 4), and
  // the candidate [20, 22) reaches [0, 57] (keeps 1, 2, 3).
  EXPECT_EQ(ids_after_prune(JoinKind::kWithin, 35, spans, 100, {{20, 22}}), (std::vector<uint64_t>{1, 2, 3, 5, 6, 4}));
  EXPECT_EQ(ids_after_prune(JoinKind::kWithin, 35, spans, 100, {}), (std::vector<uint64_t>{5, 6, 4}));
  // A floor within reach of zero prunes nothing.
  EXPECT_EQ(ids_after_prune(JoinKind::kWithin, 200, spans, 100, {}).size(), spans.size());
}

// evicted() counts a pruned span at once; horizon evictions of the spans left go on in order,
// a live front still blocking the spans behind it.
TEST(JoinPrune, EvictedCountsPrunedSpansAtOnce) {
  auto evicted_with = [](bool prune) {
    IntervalJoin j(JoinKind::kOverlap, 0);
    std::unordered_map<uint64_t, std::vector<IntervalJoin::CallRange>> none;
    j.add_right(7, span_event(10, 10, 1));
    j.add_right(7, span_event(12, 2, 2));
    if (prune) j.prune(30, none);
    EXPECT_EQ(j.pruned(), prune ? 2u : 0u);
    EXPECT_EQ(j.evicted(), prune ? 2u : 0u);
    j.add_right(7, span_event(10, 90, 3));  // live until 100
    j.add_right(7, span_event(5, 10, 4));   // before everything; dead at 50
    j.evict(50, 0);                         // pops 4 and, unpruned, 1; then 3 blocks 2
    const uint64_t first = j.evicted();
    j.evict(101, 0);  // pops 3 and, unpruned, 2
    EXPECT_EQ(j.buffered(), 0u);
    return std::make_pair(first, j.evicted());
  };
  EXPECT_EQ(evicted_with(false), std::make_pair(uint64_t{2}, uint64_t{4}));
  EXPECT_EQ(evicted_with(true), std::make_pair(uint64_t{3}, uint64_t{4}));
}

}  // namespace
}  // namespace ingero
