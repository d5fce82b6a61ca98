// The parallel engine's routing (engine.cpp, threads >= 2): the whole result of the rule pack
// (explain's JSON: chains, per-op statistics, rule outcomes, counters) is the one-thread result at
// any thread count and batch size; and the runtime's routing by index (ShardInput::indexed, which
// the runtime's passes support though the engine gathers copies) gives what gathered copies give.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/runtime.h"
#include "model/synth.h"
#include "operators/key_by.h"
#include "rules/pack.h"
#include "sinks/report.h"
#include "tests/util/pack_run.h"

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
