// Two threads split by window group (engine.cpp, run_parallel): a router (Shard::route, a shard of
// every group) walks each batch once, and two shards, each running some of the groups, read its
// lists (ShardInput::routed) instead of walking the batch. Together they give what one shard of
// every group gives: the same chains, rule outcomes (windows, chains, closest miss), window
// counters and per-op statistics (the router's totals and the durations no group carries, merged
// with the carrying group's window states in its shard), whichever shard runs which groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "model/synth.h"
#include "rules/pack.h"
#include "tests/util/shard_run.h"

namespace ingero {
namespace {

std::unique_ptr<CompiledPlan> pack_plan() {
  std::vector<std::string> errors;
  auto plan = compile_plan(rules::default_rule_pack_plan(), errors);
  EXPECT_TRUE(plan) << (errors.empty() ? "" : errors.front());
  return plan;
}

// Rule outcomes merged as the engine merges shards' (merge_outcome: windows and chains add up;
// a rule's outcome is empty in a shard that does not run it), as text.
std::string outcomes_text(const std::vector<RuleOutcome>& a, const std::vector<RuleOutcome>* b) {
  std::string s;
  for (size_t i = 0; i < a.size(); ++i) {
    const uint64_t windows = a[i].windows + (b ? (*b)[i].windows : 0);
    const uint64_t chains = a[i].chains + (b ? (*b)[i].chains : 0);
    s += a[i].rule + " " + std::to_string(windows) + " " + std::to_string(chains) + "\n";
  }
  return s;
}

std::string stats_text(const OpStatsAccumulator& s) {
  std::string t;
  for (const auto& o : s.results())
    t += std::to_string(static_cast<int>(o.source)) + "/" + std::to_string(o.op) + " n=" + std::to_string(o.count) +
         " err=" + std::to_string(o.errors) + " p50=" + std::to_string(o.p50_ns) + " p99=" + std::to_string(o.p99_ns) +
         " max=" + std::to_string(o.max_ns) + " total=" + std::to_string(o.total_ns) + "\n";
  return t;
}

// Runs `ev` through one shard of every group and through a router plus two shards that read its
// lists, the groups shared out by `in_first` (per group: 1 = the first shard, else the second).
void expect_routed_matches(const std::vector<Event>& ev, size_t batch, const std::vector<char>& in_first,
                           bool want_chains) {
  const auto plan = pack_plan();
  ASSERT_TRUE(plan);
  Shard whole(*plan, ShardTier::kBoth, true);
  Shard router(*plan, ShardTier::kBoth, true);
  const int carried = router.carried_stats_group();
  std::vector<std::vector<char>> masks(2, std::vector<char>(plan->groups.size(), 0));
  for (size_t k = 0; k < plan->groups.size(); ++k) masks[in_first[k] ? 0 : 1][k] = 1;
  std::vector<std::unique_ptr<Shard>> shards;
  for (size_t p = 0; p < 2; ++p) {
    const bool stats = carried >= 0 && masks[p][static_cast<size_t>(carried)];
    shards.push_back(std::make_unique<Shard>(*plan, ShardTier::kBoth, stats, ShardTuning{}, masks[p]));
  }
  std::vector<ShardOutput> outs_whole, outs_split;
  ShardOutput last_whole, last_split[2];
  RoutedBatch routed;
  test::for_each_batch(ev, batch, [&](const ShardInput& in) {
    ShardOutput w = whole.process(in);
    router.route(*in.owned, routed);
    ShardInput split_in = in;
    split_in.routed = &routed;
    ShardOutput a = shards[0]->process(split_in), b = shards[1]->process(split_in);
    if (in.final) {
      last_whole = std::move(w);
      last_split[0] = std::move(a);
      last_split[1] = std::move(b);
      return;
    }
    outs_whole.push_back(std::move(w));
    outs_split.push_back(std::move(a));
    outs_split.push_back(std::move(b));
  });
  // Chains as sorted lines (a batch's chains come per shard when split).
  auto chain_lines = [](const std::vector<ShardOutput>& outs, const std::vector<const ShardOutput*>& last) {
    std::vector<std::string> lines;
    auto add = [&](const ShardOutput& o) {
      for (const auto& c : o.chains) {
        std::string s = c.id + " " + c.rule + " " + c.summary;
        for (const auto& [name, v] : c.values) s += " " + name + "=" + test::num_text(v);
        for (const auto& e : c.evidence) {
          s += " | " + e.kind + " " + test::num_text(e.value) + " " + e.detail;
          for (uint64_t id : e.event_ids) s += " " + std::to_string(id);
        }
        lines.push_back(s);
      }
    };
    for (const auto& o : outs) add(o);
    for (const auto* o : last) add(*o);
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  const auto want = chain_lines(outs_whole, {&last_whole});
  const auto got = chain_lines(outs_split, {&last_split[0], &last_split[1]});
  EXPECT_EQ(!want.empty(), want_chains);
  EXPECT_EQ(got, want);
  EXPECT_EQ(outcomes_text(last_split[0].outcomes, &last_split[1].outcomes),
            outcomes_text(last_whole.outcomes, nullptr));
  EXPECT_EQ(last_split[0].counters.windows_closed + last_split[1].counters.windows_closed,
            last_whole.counters.windows_closed);
  EXPECT_EQ(last_split[0].counters.late_events + last_split[1].counters.late_events, last_whole.counters.late_events);
  EXPECT_EQ(last_split[0].counters.tail_windows_capped + last_split[1].counters.tail_windows_capped,
            last_whole.counters.tail_windows_capped);
  OpStatsAccumulator merged;
  if (auto rs = router.take_stats()) merged.merge(*rs);
  for (const auto& o : last_split)
    if (o.stats) merged.merge(*o.stats);
  ASSERT_TRUE(last_whole.stats);
  EXPECT_EQ(stats_text(merged), stats_text(*last_whole.stats));
}

// Group g in the first shard when bit g of `bits` is set.
std::vector<char> groups_by_bits(size_t n, uint64_t bits) {
  std::vector<char> in_first(n);
  for (size_t g = 0; g < n; ++g) in_first[g] = static_cast<char>((bits >> (g % 64)) & 1);
  return in_first;
}

TEST(RoutedShards, ThePackOnALargeTraceGivesTheOneShardResult) {
  const auto ev = synth::make_large_trace(120'000, 11);
  const size_t n = pack_plan()->groups.size();
  for (size_t batch : {size_t{4096}, size_t{333}}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    expect_routed_matches(ev, batch, groups_by_bits(n, 0x5555), false);
  }
}

TEST(RoutedShards, ScenarioTracesGiveTheOneShardResultWhicheverShardRunsWhichGroup) {
  // Off-CPU spans (cpu_contention), host-wide block I/O (checkpoint_io), ranks (straggler); the
  // groups in alternating shards, then the other way round, then all in one and none in the other.
  const size_t n = pack_plan()->groups.size();
  for (const auto& t :
       {synth::make_cpu_contention(true), synth::make_checkpoint_io(true), synth::make_straggler(true)}) {
    SCOPED_TRACE(t.category);
    for (uint64_t bits : {uint64_t{0x5555}, uint64_t{0xaaaa}, ~uint64_t{0}})
      expect_routed_matches(t.events, 512, groups_by_bits(n, bits), true);
  }
}

}  // namespace
}  // namespace ingero
