// The default rule pack: compiles cleanly, every inline test passes through the engine, it
// covers every chain family of the hand-built plans, and user files load from outside rules/
// (and are rejected when their tests fail).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "rules/pack.h"

using namespace ingero;

TEST(RulePack, CompilesWithoutDiagnostics) {
  const auto& pack = rules::default_rule_pack();
  EXPECT_TRUE(pack.diagnostics.empty()) << dsl::render_diagnostics(pack.diagnostics);
  EXPECT_TRUE(pack.plan.validate().empty());
  EXPECT_GE(pack.rules.size(), 10u);
}

// The whole pack's plan as canonical text: any change to a rule or to lowering shows up here.
// Regenerate after an intended change: INGERO_UPDATE_GOLDEN=1 ./pack_test
TEST(RulePack, PlanMatchesGolden) {
  const std::string golden = std::string(INGERO_SOURCE_DIR) + "/tests/rules/golden/default_pack.plan";
  const std::string actual = rules::default_rule_pack_plan().to_string();
  if (std::getenv("INGERO_UPDATE_GOLDEN")) {
    std::ofstream(golden) << actual;
    return;
  }
  std::ifstream in(golden);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), actual);
}

TEST(RulePack, ImportOfANonRegularFileIsAnError) {
  const auto r = dsl::compile_rules({{"x.rules", "import \"/dev/zero\"\n"}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics[0].code, "E0101");
}

TEST(RulePack, EveryInlineTestPasses) {
  const auto& pack = rules::default_rule_pack();
  std::map<std::string, std::pair<int, int>> per_rule;  // positive, negative tests
  for (const auto& o : rules::run_rule_tests(pack)) {
    EXPECT_TRUE(o.passed) << o.test.file << ":" << o.test.line << " " << o.test.rule << " / " << o.test.name << ": "
                          << o.detail;
    (o.test.expect_match ? per_rule[o.test.rule].first : per_rule[o.test.rule].second)++;
  }
  for (const auto& r : pack.rules) {
    EXPECT_GE(per_rule[r.name].first, 1) << r.name << " needs a positive test";
    EXPECT_GE(per_rule[r.name].second, 1) << r.name << " needs a negative test";
  }
}

// A user's rule keyed by rank, without the pack's `where rank >= 0`: the rank-less events
// (rank -1, lumped into one row) are still no peer across rank, so a busy process started
// without a rank is neither reported as "rank -1" nor counted among the ranks' peers.
TEST(RulePack, RowsWithoutARankAreNoPeersAcrossRank) {
  const char* text = R"(rule busy_rank "one rank is busier than its peers"
  from cuda
  window tumbling 10s by rank
  let n = count(), busy = sum(duration)
  require n >= 10
  peer busy across rank z 3.5 floor 20ms min_peers 3
  severity high
  category straggler
  summary "rank {rank} spent {busy} over a median of {peer.median} among {peer.peers} ranks"
  root_cause "r"
  fix ["f"]

  test "a busy process without a rank is no peer" {
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 100 rank 0
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 101 rank 1
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 102 rank 2
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 103 rank 3
    event cudaLaunchKernel repeat 20 every 10ms dur 10ms pid 200
    expect no match
  }
  test "the ranks still find their straggler, among 7 peers" {
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 100 rank 0
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 101 rank 1
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 102 rank 2
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 103 rank 3
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 104 rank 4
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 105 rank 5
    event cudaLaunchKernel repeat 20 every 10ms dur 10ms pid 106 rank 6
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 200
    event cudaLaunchKernel repeat 20 every 10ms dur 1ms pid 201
    expect match chains 1 severity high
  }
end
)";
  const auto compiled = dsl::compile_rules({{"busy_rank.rules", text}});
  ASSERT_TRUE(compiled.ok()) << dsl::render_diagnostics(compiled.diagnostics);
  const auto outcomes = rules::run_rule_tests(compiled);
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& o : outcomes) EXPECT_TRUE(o.passed) << o.test.name << ": " << o.detail;
  // The straggler's chain counts the seven ranks, not the rank-less row.
  ASSERT_EQ(compiled.rules.size(), 1u);
  VectorSource src(compiled.tests[1].events, 4096, TraceMeta{});
  EngineOptions eo;
  eo.threads = 1;
  const auto r = run_plan(compiled.rules[0].plan, src, eo);
  ASSERT_EQ(r.chains.size(), 1u) << r.counters.events_in << " events in";
  EXPECT_NE(r.chains[0].summary.find("among 7 ranks"), std::string::npos) << r.chains[0].summary;
  EXPECT_EQ(r.chains[0].rank, 6);
}

TEST(RulePack, CoversEveryHandBuiltFamily) {
  std::set<std::string> hand, pack;
  for (const auto& n : default_plan().nodes)
    if (const auto* e = std::get_if<EmitNode>(&n.body)) hand.insert(e->rule + "/" + e->category);
  for (const auto& n : rules::default_rule_pack_plan().nodes)
    if (const auto* e = std::get_if<EmitNode>(&n.body)) {
      pack.insert(e->rule + "/" + e->category);
      EXPECT_EQ(e->rule_hash.size(), 16u);
      EXPECT_GT(n.line, 0);
    }
  // Rules that exist only in the pack: those that need stacks (rules/where_in_code.rules; the
  // hand-built plans have no stack patterns), implicit synchronisation (rules/implicit_sync.rules)
  // CUDA graphs (rules/cuda_graphs.rules), cross-node stragglers (rules/fleet.rules) and the rules
  // over time (rules/time.rules: the hand-built plans have no accounting stream).
  for (const char* pack_only :
       {"cpu_preempted/cpu_contention", "input_wait/input_starvation", "sync_in_step/implicit_sync",
        "free_in_loop/implicit_sync", "malloc_in_loop/implicit_sync", "sync_copy_in_loop/implicit_sync",
        "graph_reinstantiated/cuda_graph", "graph_launch_tail/cuda_graph", "fleet_training_straggler/straggler",
        "fleet_replica_p99/straggler"})
    EXPECT_EQ(pack.erase(pack_only), 1u) << pack_only;
  EXPECT_EQ(hand, pack);
}

TEST(RulePack, LoadsAUserRuleFromOutsideRulesDir) {
  const std::string path = std::string(INGERO_SOURCE_DIR) + "/tests/rules/user/cudamalloc_p99_climb.rules";
  auto loaded = rules::load_rule_files({path}, /*include_default=*/true);
  EXPECT_TRUE(loaded.ok()) << dsl::render_diagnostics(loaded.diagnostics)
                           << (loaded.rejected.empty() ? "" : loaded.rejected[0]);
  ASSERT_EQ(loaded.tests.size(), 2u);
  for (const auto& t : loaded.tests) EXPECT_TRUE(t.passed) << t.test.name << ": " << t.detail;
  bool found = false;
  for (const auto& r : loaded.rules) found = found || r.name == "cudamalloc_tail_climb";
  EXPECT_TRUE(found);
  EXPECT_GE(loaded.rules.size(), 11u);
}

TEST(RulePack, RejectsAFileWhoseTestFails) {
  const std::string path = std::string(INGERO_SOURCE_DIR) + "/tests/rules/user/failing_test.rules";
  auto loaded = rules::load_rule_files({path}, /*include_default=*/false);
  ASSERT_EQ(loaded.rejected.size(), 1u);
  EXPECT_NE(loaded.rejected[0].find("claims a match that cannot happen"), std::string::npos) << loaded.rejected[0];
  EXPECT_TRUE(loaded.rules.empty());
}

// The pack must reproduce the hand-built plans: same chains (rule, severity, key, window,
// texts) on every synthetic scenario and its control.
TEST(RulePack, SameChainsAsHandBuiltPlansOnSyntheticTraces) {
  const Plan hand = default_plan();
  const Plan pack = rules::default_rule_pack_plan();
  auto key = [](const Chain& c) {
    return c.rule + "|" + severity_name(c.severity) + "|" + c.category + "|" + std::to_string(c.pid) + "|" +
           std::to_string(c.tid) + "|" + std::to_string(c.op) + "|" + std::to_string(c.rank) + "|" +
           std::to_string(c.window_start) + "|" + c.summary + "|" + c.root_cause + "|" + c.explanation;
  };
  size_t total = 0;
  for (const auto& info : synth::all_scenarios()) {
    for (bool fault : {true, false}) {
      SCOPED_TRACE(std::string(info.name) + (fault ? " fault" : " control"));
      auto trace = synth::make_scenario(info.id, fault, 7);
      EngineOptions o;
      o.compute_stats = false;
      VectorSource a(trace.events, 4096, trace.meta), b(trace.events, 4096, trace.meta);
      const auto ra = run_plan(hand, a, o);
      const auto rb = run_plan(pack, b, o);
      std::multiset<std::string> ka, kb;
      for (const auto& c : ra.chains) ka.insert(key(c));
      // The pack's rules over time (rules/time.rules) have no hand-built twin.
      for (const auto& c : rb.chains)
        if (!c.over_time) kb.insert(key(c));
      EXPECT_EQ(ka, kb);
      total += ra.chains.size();
    }
  }
  EXPECT_GT(total, 0u);
}
