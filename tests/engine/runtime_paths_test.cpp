// The engine's fast paths at a window close against the general ones, on the demo scenarios and
// random large traces: a join tail `duration >= X` is compared per call against X computed once,
// and identical joins share one outcome (engine/runtime.cpp, TailCut and join_cache). Wrapping
// every tail as `tail and 1` keeps its meaning but forces the general path (the expression is
// evaluated per buffered call, no sharing), so both runs must give identical chains and outcomes.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/synth.h"
#ifdef INGERO_TEST_RULE_PACK
#include "rules/pack.h"
#endif

namespace ingero {
namespace {

Plan general_tails(Plan p) {
  for (auto& node : p.nodes)
    if (auto* j = std::get_if<JoinNode>(&node.body)) j->tail = ex::land(j->tail, ex::num(1));
  return p;
}

size_t joins_of(const Plan& p) {
  size_t n = 0;
  for (const auto& node : p.nodes) n += std::holds_alternative<JoinNode>(node.body) ? 1 : 0;
  return n;
}

std::string dump(const AnalysisResult& r) {
  std::ostringstream o;
  o.precision(17);
  for (const auto& c : r.chains) {
    o << c.id << '|' << c.rule << '|' << static_cast<int>(c.severity) << '|' << c.summary << '|' << c.explanation
      << '\n';
    for (const auto& [n, v] : c.values) o << "  " << n << '=' << v << '\n';
    for (const auto& e : c.evidence) {
      o << "  ev " << e.kind << ' ' << e.value << ' ' << e.detail << " ids";
      for (auto id : e.event_ids) o << ' ' << id;
      o << '\n';
    }
  }
  for (const auto& ro : r.rules)
    o << "rule " << ro.rule << ' ' << ro.windows << ' ' << ro.chains << ' ' << ro.has_miss << ' ' << ro.miss_key << ' '
      << ro.miss.lhs << ' ' << ro.miss.rhs << '\n';
  return o.str();
}

AnalysisResult run(const Plan& plan, const std::vector<Event>& events, const TraceMeta& meta) {
  VectorSource src(events, 4096, meta);
  EngineOptions eo;
  eo.threads = 1;
  return run_plan(plan, src, eo);
}

std::vector<Plan> plans() {
  std::vector<Plan> v{default_plan()};
#ifdef INGERO_TEST_RULE_PACK
  v.push_back(rules::default_rule_pack_plan());
#endif
  return v;
}

TEST(RuntimePaths, FastJoinTailsEqualGeneralOnScenarios) {
  for (const Plan& plan : plans()) {
    ASSERT_GT(joins_of(plan), 0u);
    const Plan slow = general_tails(plan);
    for (const auto& info : synth::all_scenarios())
      for (bool fault : {true, false})
        for (uint64_t seed : {1, 7}) {
          const auto t = synth::make_scenario(info.id, fault, seed);
          const auto a = run(plan, t.events, t.meta), b = run(slow, t.events, t.meta);
          ASSERT_EQ(dump(a), dump(b)) << info.name << " fault=" << fault << " seed=" << seed;
          if (fault && seed == 1) {
            EXPECT_FALSE(a.chains.empty()) << info.name;
          }
        }
  }
}

TEST(RuntimePaths, FastJoinTailsEqualGeneralOnLargeRandomTraces) {
  for (const Plan& plan : plans()) {
    const Plan slow = general_tails(plan);
    for (uint64_t seed : {3, 11}) {
      const auto events = synth::make_large_trace(300000, seed);
      const auto a = run(plan, events, {}), b = run(slow, events, {});
      ASSERT_EQ(dump(a), dump(b)) << "seed=" << seed;
    }
  }
}

}  // namespace
}  // namespace ingero
