// Off-CPU span building shared by off-CPU streams (engine/runtime.cpp, Shard::Impl::SharedSpans):
// streams over the same parent with the same minimum length share one builder and each keeps
// its states' spans. The default plan has three such streams (cpu_contention: preempted or
// unknown; blocking: sleeping or disk wait; unexplained_tail: every state). Giving each a
// different min_ns that drops nothing on this trace (every span is longer) makes them build
// apart, as before sharing: the whole result must be identical. Random traces mix whole spans,
// switch-out/switch-in halves, states and threads, with slow calls overlapping them.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "model/result_json.h"

namespace ingero {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

// `only`: every span in that state (a random one when unset).
std::vector<Event> random_trace(uint64_t seed, std::optional<OffCpuState> only = std::nullopt) {
  std::mt19937_64 rng(seed);
  std::vector<Event> ev;
  uint64_t id = 1;
  const OffCpuState states[] = {OffCpuState::kUnknown, OffCpuState::kPreempted, OffCpuState::kSleeping,
                                OffCpuState::kDiskWait};
  for (uint32_t pid = 100; pid < 104; ++pid) {
    uint64_t ts = kT0 + kMs;
    for (int i = 0; i < 400; ++i) {
      Event c;
      c.source = Source::kCuda;
      c.op = op::kCudaLaunchKernel;
      c.pid = pid;
      c.tid = pid * 10 + static_cast<uint32_t>(rng() % 2);
      c.ts_ns = ts;
      const bool slow = rng() % 20 == 0;
      c.dur_ns = slow ? (2 + rng() % 8) * kMs : (10 + rng() % 30) * kUs;
      c.id = id++;
      ev.push_back(c);
      if (slow || rng() % 10 == 0) {  // the thread off CPU during (part of) the call
        Event s;
        s.source = Source::kHost;
        s.op = op::kSchedSwitch;
        s.pid = pid;
        s.tid = c.tid;
        s.prev_state = states[rng() % 4];
        if (only) s.prev_state = *only;
        s.ts_ns = c.ts_ns + rng() % (c.dur_ns / 2 + 1);
        const uint64_t dur = kUs + rng() % c.dur_ns;  // longer than every min_ns the test sets
        s.id = id++;
        if (rng() % 3 == 0) {  // as switch-out and switch-in halves
          Event out = s, in = s;
          out.flags = event_flags::kSwitchOut;
          in.flags = event_flags::kSwitchIn;
          in.ts_ns = s.ts_ns + dur;
          in.id = id++;
          ev.push_back(out);
          ev.push_back(in);
        } else {
          s.dur_ns = dur;
          ev.push_back(s);
        }
      }
      ts += c.dur_ns + (50 + rng() % 200) * kUs;
    }
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

std::string result_text(const Plan& plan, const std::vector<Event>& ev, size_t batch, size_t* chains) {
  VectorSource src(ev, batch);
  EngineOptions o;
  o.threads = 1;
  std::vector<std::string> errors;
  AnalysisResult r = run_plan(plan, src, o, &errors);
  EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors.front());
  *chains = r.chains.size();
  r.counters.batches = 0;
  return explain_json(r).dump();
}

TEST(OffCpuShared, SharedBuilderGivesWhatSeparateBuildersGive) {
  const Plan shared = default_plan();
  Plan separate = shared;
  uint64_t min_ns = 1, offcpu_nodes = 0;
  for (auto& node : separate.nodes)
    if (auto* off = std::get_if<OffCpuNode>(&node.body)) {
      off->min_ns = min_ns++;  // distinct: no two streams share a builder
      ++offcpu_nodes;
    }
  ASSERT_GE(offcpu_nodes, 3u);
  size_t total_chains = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    const std::vector<Event> ev = random_trace(seed);
    for (size_t batch : {size_t{64}, size_t{4096}}) {
      size_t a = 0, b = 0;
      EXPECT_EQ(result_text(shared, ev, batch, &a), result_text(separate, ev, batch, &b));
      EXPECT_EQ(a, b);
      total_chains += a;
    }
  }
  EXPECT_GT(total_chains, 0u);  // the traces make the off-CPU joins fire, so the comparison bites
}

// Each stream still keeps only its states' spans from the shared list: with every span preempted,
// cpu_contention fires and blocking does not; with every span sleeping, the reverse.
TEST(OffCpuShared, EachStreamKeepsItsStates) {
  auto chains_of = [](const std::vector<Event>& ev, const std::string& rule) {
    VectorSource src(ev, 4096);
    std::vector<std::string> errors;
    const AnalysisResult r = run_plan(default_plan(), src, EngineOptions{}, &errors);
    EXPECT_TRUE(errors.empty());
    return std::count_if(r.chains.begin(), r.chains.end(), [&](const Chain& c) { return c.rule == rule; });
  };
  const auto preempted = random_trace(3, OffCpuState::kPreempted);
  const auto sleeping = random_trace(3, OffCpuState::kSleeping);
  EXPECT_GT(chains_of(preempted, "cpu_contention"), 0);
  EXPECT_EQ(chains_of(preempted, "blocking"), 0);
  EXPECT_GT(chains_of(sleeping, "blocking"), 0);
  EXPECT_EQ(chains_of(sleeping, "cpu_contention"), 0);
}

}  // namespace
}  // namespace ingero
