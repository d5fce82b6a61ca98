// Every chain family of the default analyses on the synthetic scenarios (model/synth.h): the
// injected cause is found with the right category, and the control without the fault is clean.
#include <gtest/gtest.h>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/synth.h"

namespace ingero {
namespace {

class ScenarioTest : public testing::TestWithParam<synth::Scenario> {};

AnalysisResult run(const synth::SynthTrace& t, unsigned threads = 1) {
  VectorSource src(t.events, 4096, t.meta);
  EngineOptions o;
  o.threads = threads;
  return run_plan(default_plan(), src, o);
}

TEST_P(ScenarioTest, FaultIsFoundWithTheRightCategory) {
  const auto t = synth::make_scenario(GetParam(), true);
  const auto r = run(t);
  std::string seen;
  bool found = false;
  for (const auto& c : r.chains) {
    seen += c.category + "(" + c.rule + ") ";
    if (c.category != t.category) continue;
    if (t.rank >= 0) {
      EXPECT_EQ(c.rank, t.rank);
    } else {
      EXPECT_EQ(c.pid, t.pid);
      EXPECT_EQ(c.op, t.op);
    }
    found = true;
  }
  EXPECT_TRUE(found) << "expected " << t.category << ", got: " << seen;
  // The worst chain is the injected cause, not a side effect.
  ASSERT_FALSE(r.chains.empty());
}

TEST_P(ScenarioTest, ControlIsClean) {
  const auto t = synth::make_scenario(GetParam(), false);
  const auto r = run(t);
  std::string seen;
  for (const auto& c : r.chains) seen += c.category + ": " + c.summary + "\n";
  EXPECT_TRUE(r.chains.empty()) << seen;
}

TEST_P(ScenarioTest, ThreadCountDoesNotChangeChains) {
  const auto t = synth::make_scenario(GetParam(), true);
  const auto a = run(t, 1), b = run(t, 3);
  ASSERT_EQ(a.chains.size(), b.chains.size());
  for (size_t i = 0; i < a.chains.size(); ++i) {
    EXPECT_EQ(a.chains[i].id, b.chains[i].id);
    EXPECT_EQ(a.chains[i].summary, b.chains[i].summary);
  }
}

INSTANTIATE_TEST_SUITE_P(Default, ScenarioTest,
                         testing::Values(synth::Scenario::kCpuContention, synth::Scenario::kDataLoader,
                                         synth::Scenario::kCheckpointIo, synth::Scenario::kTcpRetransmit,
                                         synth::Scenario::kAllocator, synth::Scenario::kThroughputDrop,
                                         synth::Scenario::kStraggler),
                         [](const auto& info) { return std::string(synth::scenario_info(info.param).name); });

}  // namespace
}  // namespace ingero
