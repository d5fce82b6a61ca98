// Cross-node stragglers (rules/fleet.rules) on MERGED multi-node traces: 8 single-rank nodes with
// different clock offsets and capture starts, merged by `merge`, then the default rule pack. One
// slowed rank must be named (node and rank) and no other; balanced controls produce no straggler.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/engine.h"
#include "rules/pack.h"
#include "sinks/fleet/merge.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/fleet/fleet_synth.h"

namespace fs = std::filesystem;
using namespace ingero;

namespace {

struct Run {
  std::vector<Chain> stragglers;  // category straggler
  std::string described;
  std::vector<std::string> nodes;
};

Run merge_and_explain(const test::FleetSpec& spec, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("fleet_strag_" + tag + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<MergeInput> in;
  for (int r = 0; r < spec.ranks; ++r) {
    const std::string p = (dir / ("n" + std::to_string(r) + ".db")).string();
    EXPECT_EQ(test::write_fleet_node(spec, r, "node-" + std::to_string(r), p), "");
    in.push_back({p, ""});
  }
  MergeOptions o;
  o.out = (dir / "merged.db").string();
  MergeReport rep;
  std::string error;
  EXPECT_TRUE(merge_traces(in, o, rep, error)) << error;
  auto src = open_sqlite_trace(o.out, error);
  Run out;
  if (!src) {
    ADD_FAILURE() << error;
    return out;
  }
  out.nodes = src->meta().nodes;
  EngineOptions eo;
  eo.threads = 2;
  std::vector<std::string> errors;
  auto result = run_plan(rules::default_rule_pack_plan(), *src, eo, &errors);
  EXPECT_TRUE(errors.empty());
  for (const auto& c : result.chains) {
    out.described += "  [" + c.category + "] " + c.rule + " rank=" + std::to_string(c.rank) + ": " + c.summary + "\n";
    if (c.category == "straggler") out.stragglers.push_back(c);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return out;
}

test::FleetSpec eight_ranks() {
  test::FleetSpec s;
  s.ranks = 8;
  s.steps = 400;  // 20 s: two full windows
  s.clock_offset_ns = {0, 3'100'000, -2'700'000, 5'500'000, -6'000'000, 1'200'000, -900'000, 7'400'000};
  s.first_step = {0, 1, 3, 0, 2, 0, 1, 4};
  return s;
}

}  // namespace

TEST(FleetStraggler, MergedEightRanksNameTheSlowRankOnly) {
  auto spec = eight_ranks();
  spec.slow_rank = 5;
  const auto run = merge_and_explain(spec, "slow");
  ASSERT_FALSE(run.stragglers.empty()) << run.described;
  for (const auto& c : run.stragglers) {
    EXPECT_EQ(c.rule, "fleet_training_straggler") << run.described;
    EXPECT_EQ(c.rank, 5) << run.described;
    ASSERT_LT(c.node, run.nodes.size());
    EXPECT_EQ(run.nodes[c.node], "node-5") << run.described;
    EXPECT_NE(c.summary.find("rank 5 on node node-5"), std::string::npos) << c.summary;
  }
}

TEST(FleetStraggler, BalancedRanksProduceNone) {
  const auto run = merge_and_explain(eight_ranks(), "balanced");
  EXPECT_TRUE(run.stragglers.empty()) << run.described;
}

TEST(FleetStraggler, MildImbalanceBelowTheFloorIsNotAStraggler) {
  auto spec = eight_ranks();
  spec.slow_rank = 2;
  spec.slow_extra_ns = 300'000;  // 0.3 ms slower: inside the 1 ms floor
  const auto run = merge_and_explain(spec, "mild");
  EXPECT_TRUE(run.stragglers.empty()) << run.described;
}
