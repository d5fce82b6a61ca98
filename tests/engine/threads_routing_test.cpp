// The parallel engine's routing (engine.cpp, threads >= 2): the whole result of the rule pack
// (explain's JSON: chains, per-op statistics, rule outcomes, counters) is the one-thread result at
// any thread count and batch size; and the runtime's routing by index (ShardInput::indexed, which
// the runtime's passes support though the engine gathers copies) gives what gathered copies give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "engine/runtime.h"
#include "model/ops.h"
#include "model/result_json.h"
#include "model/synth.h"
#include "operators/key_by.h"
#include "rules/pack.h"
#include "tests/util/pack_run.h"
#include "tests/util/shard_run.h"

namespace ingero {
namespace {

using test::result_text;

AnalysisResult run_pack(const std::vector<Event>& ev, unsigned threads, size_t batch) {
  BorrowedSource src(ev, batch);
  return test::run_pack(src, threads);
}

const std::vector<Event>& large_trace() {
  // ~3.5 simulated seconds of the benchmark workload: 4 ranks, DataLoader workers, block I/O and
  // TCP (host-wide events every pid shard also receives), off-CPU spans.
  static const std::vector<Event> ev = synth::make_large_trace(200'000, 7);
  return ev;
}

TEST(ThreadsRouting, TraceExercisesEveryRoute) {
  // The parity tests below mean something only if the trace has host-wide events, several
  // processes and global pipes in the pack.
  const auto& ev = large_trace();
  size_t host_wide = 0;
  std::vector<uint32_t> pids;
  for (const auto& e : ev) {
    host_wide += is_host_wide(e) ? 1 : 0;
    if (std::find(pids.begin(), pids.end(), e.pid) == pids.end()) pids.push_back(e.pid);
  }
  EXPECT_GT(host_wide, 0u);
  EXPECT_GE(pids.size(), 4u);
  std::vector<std::string> errors;
  const auto compiled = compile_plan(rules::default_rule_pack_plan(), errors);
  ASSERT_TRUE(compiled) << errors.front();
  EXPECT_TRUE(compiled->has_global);
  EXPECT_TRUE(compiled->has_sharded);
}

// The pack over `ev` at 2, 3, 4 and 8 threads and two batch sizes gives the one-thread result.
void expect_thread_parity(const std::vector<Event>& ev, size_t min_chains) {
  const auto one = run_pack(ev, 1, 4096);
  ASSERT_EQ(one.counters.events_in, ev.size());
  ASSERT_FALSE(one.ops.empty());
  ASSERT_GE(one.chains.size(), min_chains);
  const std::string base = result_text(one);
  for (unsigned threads : {2u, 3u, 4u, 8u})
    for (size_t batch : {size_t{4096}, size_t{777}}) {
      const auto r = run_pack(ev, threads, batch);
      EXPECT_EQ(r.counters.events_in, ev.size()) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.node_errors, 0u) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.threads, threads);
      // Not EXPECT_EQ on the strings: a mismatch would print two ~30 kB JSON documents.
      EXPECT_TRUE(result_text(r) == base) << threads << " threads, batch " << batch << " differs from one thread";
    }
}

TEST(ThreadsRouting, RulePackResultIsTheOneThreadResult) {
  // Windows, joins against host-wide events, peers across ranks and per-op statistics (no chain
  // fires in the first seconds of this workload: misses and statistics carry the comparison).
  expect_thread_parity(large_trace(), 0);
}

TEST(ThreadsRouting, RulePackChainsAreTheOneThreadChains) {
  // Scenarios whose chains come from pid shards (off-CPU join, block I/O join against a
  // host-wide stream) and from the global shard (a straggler rank).
  for (const auto& t :
       {synth::make_cpu_contention(true), synth::make_checkpoint_io(true), synth::make_straggler(true)}) {
    SCOPED_TRACE(t.category);
    expect_thread_parity(t.events, 1);
  }
}

// The pack over `ev` in batches of `batch` with options `o`; plan errors fail the calling test.
AnalysisResult run_with(const std::vector<Event>& ev, size_t batch, const EngineOptions& o) {
  static const Plan plan = rules::default_rule_pack_plan();
  BorrowedSource src(ev, batch);
  std::vector<std::string> errors;
  auto r = run_plan(plan, src, o, &errors);
  EXPECT_TRUE(errors.empty());
  return r;
}

// The same at `threads` threads split as `split`.
AnalysisResult run_split(const std::vector<Event>& ev, unsigned threads, ShardSplit split, size_t batch) {
  EngineOptions o;
  o.threads = threads;
  o.split = split;
  return run_with(ev, batch, o);
}

// Both ways of splitting a run between shards (ShardSplit: pid shards plus the global shard, or
// shards of some window groups each over every event) give the one-thread result at 2 and 3
// threads (3 group sets: a set may be all light groups) and two batch sizes, on the large trace
// and the scenario traces (chains from pid-keyed and from global rules).
TEST(ThreadsRouting, BothShardSplitsGiveTheOneThreadResult) {
  std::vector<const std::vector<Event>*> traces = {&large_trace()};
  const synth::SynthTrace scenarios[] = {synth::make_cpu_contention(true), synth::make_checkpoint_io(true),
                                         synth::make_straggler(true)};
  for (const auto& t : scenarios) traces.push_back(&t.events);
  for (const auto* ev : traces) {
    const auto one = run_pack(*ev, 1, 4096);
    const std::string base = result_text(one), base_ops = test::ops_text(one);
    ASSERT_FALSE(one.ops.empty());
    for (const ShardSplit split : {ShardSplit::kByPid, ShardSplit::kByGroup})
      for (const unsigned threads : {2u, 3u})
        for (const size_t batch : {size_t{4096}, size_t{777}}) {
          const auto r = run_split(*ev, threads, split, batch);
          EXPECT_EQ(r.counters.events_in, ev->size());
          EXPECT_TRUE(result_text(r) == base) << (split == ShardSplit::kByPid ? "by pid, " : "by group, ") << threads
                                              << " threads, batch " << batch << ", " << ev->size() << " events";
          EXPECT_EQ(test::ops_text(r), base_ops)
              << (split == ShardSplit::kByPid ? "by pid, " : "by group, ") << threads << " threads, batch " << batch;
        }
  }
}

// EngineOptions::join_resident_bytes: join span blocks in a spill file give the in-memory result,
// at one thread (every sealed block spilled: a budget of one byte) and two (the run's budget
// shared out, at least 1 MiB a shard); a spill directory that cannot be used leaves the spans in
// memory, counts one failure and gives the same result.
TEST(ThreadsRouting, JoinSpillGivesTheInMemoryResult) {
  const auto& ev = large_trace();
  const std::string base = result_text(run_pack(ev, 1, 4096));
  const auto run = [&](unsigned threads, size_t budget) {
    EngineOptions o;
    o.threads = threads;
    o.join_resident_bytes = budget;
    return run_with(ev, 4096, o);
  };
  const auto one = run(1, 1);
  EXPECT_EQ(result_text(one), base);
  EXPECT_GT(one.counters.join_spilled_blocks, 0u);
  EXPECT_GT(one.counters.join_spill_peak_bytes, 0u);
  EXPECT_EQ(one.counters.join_spill_errors + one.counters.join_spill_read_errors, 0u);
  const auto two = run(2, 1);
  EXPECT_EQ(result_text(two), base);
  EXPECT_EQ(two.counters.join_spill_errors + two.counters.join_spill_read_errors, 0u);

  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", "/nonexistent-dir-for-ingero-test", 1);
  const auto unusable = run(1, 1);
  if (old) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  EXPECT_EQ(result_text(unusable), base);
  EXPECT_EQ(unusable.counters.join_spilled_blocks, 0u);
  EXPECT_EQ(unusable.counters.join_spill_errors, 1u);  // one shard, one failed creation
}

// Host-wide events of several processes at the same instant: a pid shard adds its own before
// those other shards own, one thread adds them in batch order, and a join exemplar names the
// first five. The TCP scenario with every retransmit sent by six processes at once (the
// trainer's last, so by id it comes last and a shard that adds its own first would name it
// first): the chain's evidence is the one-thread evidence at every thread count and split
// (engine_parity_fuzz found four threads naming other retransmits).
TEST(ThreadsRouting, HostWideEventsAtOneInstantGiveTheOneThreadEvidence) {
  const auto t = synth::make_tcp_retransmit(true);
  std::vector<Event> ev;
  for (const Event& e : t.events) {
    if (e.source == Source::kTcp)
      for (uint32_t other = 4001; other <= 4005; ++other) {
        Event copy = e;
        copy.pid = copy.tid = other;
        ev.push_back(copy);
      }
    ev.push_back(e);
  }
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;  // in batch order: the copies first
  const auto one = run_pack(ev, 1, 4096);
  const std::string base = result_text(one);
  ASSERT_FALSE(one.chains.empty());
  size_t tcp_evidence = 0;
  for (const auto& c : one.chains)
    for (const auto& e : c.evidence) tcp_evidence += e.kind == "tcp" && e.event_ids.size() > 2 ? 1 : 0;
  ASSERT_GT(tcp_evidence, 0u);  // the comparison covers retransmits named as evidence
  for (const ShardSplit split : {ShardSplit::kByPid, ShardSplit::kByGroup})
    for (const unsigned threads : {2u, 3u, 4u}) {
      const auto r = run_split(ev, threads, split, 777);
      EXPECT_TRUE(result_text(r) == base)
          << (split == ShardSplit::kByPid ? "by pid, " : "by group, ") << threads << " threads";
    }
}

// A call that outlasts its window's lateness: an 8 s launch from 1 s before window 1 ends, and
// the thread preempted 4 s after window 1 ended (2 s after the window is due to close). A run in
// small batches closes window 1 before it reads that span; one that reads the trace in one batch
// has it at the close. Both must judge the call on the spans that start before the window is due
// (IntervalJoin::probe's horizon), so the result does not depend on the batches (engine_parity_fuzz
// found a page allocation counted only in one batch).
TEST(ThreadsRouting, ACallOutlastingItsWindowIsJudgedOnTheSameSpansInAnyBatches) {
  auto ev = synth::make_cpu_contention(true).events;
  constexpr uint64_t kSec = 1'000'000'000ull;
  const uint64_t w2 = synth::kSynthEpochNs + 20 * kSec;  // window 2's start (10 s windows)
  Event call = ev.front();
  for (const Event& e : ev)
    if (e.source == Source::kCuda) call = e;
  call.ts_ns = w2 - kSec;
  call.dur_ns = 8 * kSec;
  call.id = ev.size() + 1;
  Event span;
  span.source = Source::kHost;
  span.op = op::kSchedSwitch;
  span.pid = call.pid;
  span.tid = call.tid;
  span.ts_ns = w2 + 4 * kSec;
  span.dur_ns = 50'000'000;
  span.prev_state = OffCpuState::kPreempted;
  span.id = ev.size() + 2;
  ev.push_back(call);
  ev.push_back(span);
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  const auto small = run_split(ev, 1, ShardSplit::kAuto, 777);
  ASSERT_FALSE(small.chains.empty());
  const std::string base = result_text(small);
  EXPECT_TRUE(result_text(run_split(ev, 1, ShardSplit::kAuto, ev.size())) == base) << "one batch";
  EXPECT_TRUE(result_text(run_split(ev, 2, ShardSplit::kAuto, ev.size())) == base) << "one batch, two threads";
  EXPECT_TRUE(result_text(run_split(ev, 3, ShardSplit::kAuto, 64)) == base) << "batches of 64, three threads";
}

// The runtime contract the engine relies on: a pid shard fed the shared batch through position
// lists gives exactly what it gives when fed gathered copies of the same events.
TEST(ThreadsRouting, IndexedShardInputMatchesGatheredCopies) {
  const auto& ev = large_trace();
  std::vector<std::string> errors;
  const auto compiled = compile_plan(rules::default_rule_pack_plan(), errors);
  ASSERT_TRUE(compiled) << errors.front();
  constexpr unsigned kShards = 3;
  for (unsigned me = 0; me < kShards; ++me) {
    Shard gathered(*compiled, false, true), indexed(*compiled, false, true);
    std::string chains_gathered, chains_indexed;
    ShardOutput last_gathered, last_indexed;
    constexpr size_t kBatch = 5000;
    for (size_t at = 0;; at += kBatch) {
      const size_t end = std::min(ev.size(), at + kBatch);
      auto batch = std::make_shared<const std::vector<Event>>(ev.begin() + static_cast<ptrdiff_t>(at),
                                                              ev.begin() + static_cast<ptrdiff_t>(end));
      auto owned = std::make_shared<std::vector<Event>>();
      auto foreign = std::make_shared<std::vector<Event>>();
      std::vector<uint32_t> owned_at, foreign_at;
      for (uint32_t i = 0; i < batch->size(); ++i) {
        const Event& e = (*batch)[i];
        if (shard_of(e.pid, kShards) == me) {
          owned->push_back(e);
          owned_at.push_back(i);
        } else if (is_host_wide(e)) {
          foreign->push_back(e);
          foreign_at.push_back(i);
        }
      }
      const bool final = end == ev.size();
      ShardInput a;
      a.owned = owned;
      a.foreign = foreign;
      a.final = final;
      a.watermark = batch->empty() ? 0 : batch->back().ts_ns;
      a.trace_end = ev.back().end_ns();
      ShardInput b = a;
      b.owned = batch;
      b.foreign = batch;
      b.indexed = true;
      b.owned_at = owned_at;
      b.foreign_at = foreign_at;
      auto out_a = gathered.process(a);
      auto out_b = indexed.process(b);
      for (const auto& c : out_a.chains) chains_gathered += c.id + "|" + c.summary + "\n";
      for (const auto& c : out_b.chains) chains_indexed += c.id + "|" + c.summary + "\n";
      if (final) {
        last_gathered = std::move(out_a);
        last_indexed = std::move(out_b);
        break;
      }
    }
    EXPECT_EQ(chains_indexed, chains_gathered) << "shard " << me;
    ASSERT_TRUE(last_gathered.stats && last_indexed.stats);
    EXPECT_GT(last_gathered.counters.events_in, 0u) << "shard " << me;
    EXPECT_EQ(last_indexed.counters.events_in, last_gathered.counters.events_in) << "shard " << me;
    EXPECT_EQ(last_indexed.counters.windows_closed, last_gathered.counters.windows_closed) << "shard " << me;
    EXPECT_EQ(last_indexed.counters.evicted_spans, last_gathered.counters.evicted_spans) << "shard " << me;
    ASSERT_EQ(last_indexed.outcomes.size(), last_gathered.outcomes.size());
    for (size_t i = 0; i < last_indexed.outcomes.size(); ++i) {
      EXPECT_EQ(last_indexed.outcomes[i].windows, last_gathered.outcomes[i].windows) << i;
      EXPECT_EQ(last_indexed.outcomes[i].chains, last_gathered.outcomes[i].chains) << i;
      EXPECT_EQ(last_indexed.outcomes[i].miss_key, last_gathered.outcomes[i].miss_key) << i;
    }
    const auto sa = last_gathered.stats->results(), sb = last_indexed.stats->results();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sb[i].count, sa[i].count) << i;
      EXPECT_EQ(sb[i].p99_ns, sa[i].p99_ns) << i;
    }
  }
}

// One shard of both tiers (ShardTier::kBoth, what the one-thread engine runs: one routing pass
// for the pid shards' and the global shard's window groups) against a pid shard and a global shard
// run side by side over `ev` in batches of `batch`: the same chains (ids and summaries; a batch's
// chains come per window group in one shard, per tier in two, so compared as sets), rule
// outcomes, counters and per-op statistics. Adds the chains each tier made to the counts.
void expect_both_tiers_match(const CompiledPlan& plan, const std::vector<Event>& ev, size_t batch, size_t& pid_chains,
                             size_t& global_chains) {
  Shard both(plan, ShardTier::kBoth, true), pid(plan, ShardTier::kPid, true), global(plan, ShardTier::kGlobal, false);
  std::vector<std::string> chains_both, chains_split;
  ShardOutput last_both, last_pid, last_global;
  test::for_each_batch(ev, batch, [&](const ShardInput& in) {
    auto out_both = both.process(in);
    auto out_pid = pid.process(in);
    auto out_global = global.process(in);
    for (const auto& c : out_both.chains) chains_both.push_back(c.id + "|" + c.summary);
    for (const auto* o : {&out_pid, &out_global})
      for (const auto& c : o->chains) chains_split.push_back(c.id + "|" + c.summary);
    pid_chains += out_pid.chains.size();
    global_chains += out_global.chains.size();
    if (in.final) {
      last_both = std::move(out_both);
      last_pid = std::move(out_pid);
      last_global = std::move(out_global);
    }
  });
  std::sort(chains_both.begin(), chains_both.end());
  std::sort(chains_split.begin(), chains_split.end());
  EXPECT_EQ(chains_both, chains_split);
  EXPECT_FALSE(last_both.global);
  EXPECT_EQ(last_both.counters.events_in, ev.size());
  EXPECT_EQ(last_both.counters.windows_closed, last_pid.counters.windows_closed + last_global.counters.windows_closed);
  EXPECT_EQ(last_both.counters.late_events, last_pid.counters.late_events + last_global.counters.late_events);
  EXPECT_EQ(last_both.counters.tail_windows_capped,
            last_pid.counters.tail_windows_capped + last_global.counters.tail_windows_capped);
  ASSERT_EQ(last_both.outcomes.size(), last_pid.outcomes.size());
  ASSERT_EQ(last_both.outcomes.size(), last_global.outcomes.size());
  for (size_t i = 0; i < last_both.outcomes.size(); ++i) {
    // A rule runs in one tier: the other tier's outcome is empty.
    const RuleOutcome& split = last_pid.outcomes[i].windows ? last_pid.outcomes[i] : last_global.outcomes[i];
    EXPECT_EQ(last_both.outcomes[i].windows, split.windows) << i;
    EXPECT_EQ(last_both.outcomes[i].chains, split.chains) << i;
    EXPECT_EQ(last_both.outcomes[i].miss_key, split.miss_key) << i;
  }
  ASSERT_TRUE(last_both.stats && last_pid.stats);
  const auto sa = last_pid.stats->results(), sb = last_both.stats->results();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sb[i].count, sa[i].count) << i;
    EXPECT_EQ(sb[i].errors, sa[i].errors) << i;
    EXPECT_EQ(sb[i].p50_ns, sa[i].p50_ns) << i;
    EXPECT_EQ(sb[i].p99_ns, sa[i].p99_ns) << i;
    EXPECT_EQ(sb[i].max_ns, sa[i].max_ns) << i;
  }
}

// The rule pack on the large trace and the three scenario traces, at two batch sizes.
TEST(ThreadsRouting, OneShardOfBothTiersGivesThePidAndTheGlobalShard) {
  std::vector<std::string> errors;
  const auto compiled = compile_plan(rules::default_rule_pack_plan(), errors);
  ASSERT_TRUE(compiled) << errors.front();
  std::vector<const std::vector<Event>*> traces = {&large_trace()};
  const synth::SynthTrace scenarios[] = {synth::make_cpu_contention(true), synth::make_checkpoint_io(true),
                                         synth::make_straggler(true)};
  for (const auto& t : scenarios) traces.push_back(&t.events);
  size_t pid_chains = 0, global_chains = 0;
  for (const auto* ev : traces)
    for (const size_t batch : {size_t{4096}, size_t{333}}) {
      SCOPED_TRACE(std::to_string(ev->size()) + " events, batch " + std::to_string(batch));
      expect_both_tiers_match(*compiled, *ev, batch, pid_chains, global_chains);
    }
  // Both tiers made chains, so the comparison covers each.
  EXPECT_GT(pid_chains, 0u);
  EXPECT_GT(global_chains, 0u);
}

// Routes with checks in both tiers (filters whose source/op part is a mask and whose rest is a
// residual check per event: the one shard's table holds both tiers' checks, the global tier's
// after the pid tier's).
TEST(ThreadsRouting, OneShardOfBothTiersKeepsEachTiersRouteChecks) {
  using namespace ex;
  Plan p;
  const int scan = p.add(ScanNode{});
  const double cuda = static_cast<double>(Source::kCuda);
  const int slow = p.add(FilterNode{land(eq(field(Field::kSource), num(cuda)),
                                         ge(field(Field::kDuration), num(40'000)))},
                         {scan});
  const int quick = p.add(FilterNode{land(eq(field(Field::kSource), num(cuda)),
                                          lt(field(Field::kDuration), num(20'000)))},
                          {scan});
  for (const auto& [stream, keys, rule] :
       {std::tuple{slow, std::vector<Field>{Field::kPid, Field::kOp}, std::string("slow_by_pid")},
        std::tuple{quick, std::vector<Field>{Field::kOp}, std::string("quick_by_op")}}) {
    WindowNode w;
    w.size_ns = w.slide_ns = 1'000'000'000ull;
    w.keys = keys;
    int id = p.add(w, {stream});
    AggregateNode agg;
    agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}, {"p50", AggKind::kQuantile, Field::kDuration, 0.5}};
    id = p.add(agg, {id});
    EmitNode e;
    e.rule = rule;
    e.category = "test";
    e.summary = "{key} n={n} p50={p50}";
    p.add(e, {id});
  }
  std::vector<std::string> errors;
  const auto compiled = compile_plan(p, errors);
  ASSERT_TRUE(compiled) << errors.front();
  ASSERT_FALSE(compiled->routes[0].checks.empty());
  ASSERT_FALSE(compiled->routes[1].checks.empty());
  size_t pid_chains = 0, global_chains = 0;
  expect_both_tiers_match(*compiled, large_trace(), 2048, pid_chains, global_chains);
  EXPECT_GT(pid_chains, 0u);
  EXPECT_GT(global_chains, 0u);
}

// Positions past the end of the batch are skipped, never read.
TEST(ThreadsRouting, IndexedPositionsPastTheEndAreSkipped) {
  std::vector<std::string> errors;
  const auto compiled = compile_plan(rules::default_rule_pack_plan(), errors);
  ASSERT_TRUE(compiled) << errors.front();
  Shard shard(*compiled, false, true);
  const auto& ev = large_trace();
  auto batch = std::make_shared<const std::vector<Event>>(ev.begin(), ev.begin() + 10);
  const std::vector<uint32_t> at = {0, 3, 9, 10, 4'000'000'000u};
  ShardInput in;
  in.owned = batch;
  in.indexed = true;
  in.owned_at = at;
  in.final = true;
  const auto out = shard.process(in);
  ASSERT_TRUE(out.stats);
  uint64_t counted = 0;
  for (const auto& s : out.stats->results()) counted += s.count;
  EXPECT_LE(counted, 3u);
}

}  // namespace
}  // namespace ingero
