// Labelled synthetic scenarios for the rule families of issue 15 - implicit synchronisation
// (rules/implicit_sync.rules), CUDA graphs (rules/cuda_graphs.rules), the per-process warm-up and
// the time-split severity of throughput_drop (operators/chain_annotate.*) - run the way `explain`
// runs them: the default rule pack through the engine, the chain annotator on the same events.
//
// Every scenario is built here, deterministically (no RNG: jitter from the step index), as a
// training loop of pid 2000 / launching thread 2001 (plus an idle helper thread 2002) beside a
// clean neighbour process (pid 3000) running the same loop without the fault. Each has a control:
// the same trace without the fault. Checks: the injected cause is found with the right rule,
// category, pid and thread; the neighbour and the control give no MEDIUM/HIGH chain; 1 and 4
// engine threads give identical chains. Last, on the shared Ingero traces, every chain of the new
// families is backed by the data (SQL over the same file, opened immutable), and none fires there.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/ops.h"
#include "model/stack.h"
#include "model/synth.h"
#include "operators/chain_annotate.h"
#include "rules/pack.h"
#include "sinks/store/sqlite_store.h"

using namespace ingero;

namespace {

constexpr uint64_t kUs = 1'000, kMs = 1'000'000, kS = 1'000'000'000;
constexpr uint64_t kT0 = synth::kSynthEpochNs;  // 10 s aligned: windows start at the trace start
constexpr uint32_t kPid = 2000, kTid = 2001, kHelper = 2002, kNeighbour = 3000;

struct Trace {
  std::vector<Event> ev;
  TraceMeta meta;
  void add(Source s, uint8_t op, uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint64_t arg0 = 0,
           uint64_t arg1 = 0) {
    Event e;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.pid = pid;
    e.tid = tid;
    e.source = s;
    e.op = op;
    e.arg0 = arg0;
    e.arg1 = arg1;
    ev.push_back(e);
  }
  void offcpu(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, OffCpuState st) {
    add(Source::kHost, op::kSchedSwitch, pid, tid, ts, dur);
    ev.back().prev_state = st;
  }
  void finish() {
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
    meta.format = "synthetic-rulepack";
    meta.process_names[kPid] = "python3 train.py";
    meta.process_names[kNeighbour] = "python3 other.py";
    meta.thread_names[kTid] = "python3";
    meta.thread_names[kHelper] = "pt_data_worker";
    if (!ev.empty()) {
      meta.first_ts = ev.front().ts_ns;
      meta.last_ts = ev.back().ts_ns;
    }
  }
};

// Deterministic jitter in [1 - a, 1 + a) from an index.
uint64_t jit(uint64_t base, uint64_t i, double a = 0.2) {
  const double u = static_cast<double>((i * 2654435761u) % 1000) / 1000.0;
  return static_cast<uint64_t>(static_cast<double>(base) * (1.0 - a + 2 * a * u));
}

// The body of one training step of `tid`, starting at `t`: an H2D copy, `launches` eager kernel
// launches and a stream sync waiting ~2 ms for the GPU; `extra` adds the scenario's calls before
// the sync. Returns the step's end.
using Extra = std::function<uint64_t(Trace&, uint32_t pid, uint32_t tid, uint64_t t, uint64_t step)>;
uint64_t step(Trace& tr, uint32_t pid, uint32_t tid, uint64_t t, uint64_t i, int launches, const Extra& extra) {
  tr.add(Source::kCuda, op::kCudaMemcpyAsync, pid, tid, t, jit(9 * kUs, i), 8u << 20, 1);
  t += 20 * kUs;
  for (int k = 0; k < launches; ++k) {
    const uint64_t d = jit(12 * kUs, i * 64 + static_cast<uint64_t>(k));
    tr.add(Source::kCuda, op::kCudaLaunchKernel, pid, tid, t, d, 0x7f00 + static_cast<uint64_t>(k));
    t += d + 5 * kUs;
  }
  if (extra) t = extra(tr, pid, tid, t, i);
  const uint64_t sync = jit(2 * kMs, i);
  tr.add(Source::kCuda, op::kCudaStreamSync, pid, tid, t, sync);
  return t + sync + 100 * kUs;
}

// A loop of `pid`/`tid` from kT0 + start for `len`, `launches` per step, with `extra` from
// kT0 + fault_from on (never when fault_from == 0).
void loop(Trace& tr, uint32_t pid, uint32_t tid, uint64_t start, uint64_t len, int launches, const Extra& extra,
          uint64_t fault_from) {
  uint64_t t = kT0 + start;
  // Whole windows: the last step ends before the boundary (a partial last window would look like
  // a throughput drop).
  for (uint64_t i = 0; t + 50 * kMs < kT0 + start + len; ++i) {
    const bool on = extra && fault_from && t >= kT0 + fault_from;
    t = step(tr, pid, tid, t, i, launches, on ? extra : Extra{});
  }
}

struct Scenario {
  std::string name, rule, category;
  Source source = Source::kUnknown;
  uint8_t op = 0;
  std::function<Trace(bool fault)> make;
  std::string extra_rules;  // a rule file loaded beside the pack (rules/optional/), "" = the pack
};

// A fault in the loop of pid 2000 from 20 s on (past its 10 s warm-up), the neighbour clean.
Trace in_loop(bool fault, const Extra& extra, int launches = 40) {
  Trace tr;
  loop(tr, kPid, kTid, 0, 60 * kS, launches, extra, fault ? 20 * kS : 0);
  loop(tr, kNeighbour, kNeighbour + 1, 0, 60 * kS, launches, {}, 0);
  tr.offcpu(kPid, kHelper, kT0 + 5 * kS, 100 * kMs, OffCpuState::kSleeping);  // an idle helper thread
  tr.finish();
  return tr;
}

std::vector<Scenario> scenarios() {
  std::vector<Scenario> s;
  s.push_back({"empty_cache_every_step", "free_in_loop", "implicit_sync", Source::kCuda, op::kCudaFree,
               [](bool f) {
                 return in_loop(f, [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   // torch.cuda.empty_cache(): two blocks go back to the driver, each free waits
                   // for the device (~4 ms).
                   for (int k = 0; k < 2; ++k) {
                     const uint64_t d = jit(4 * kMs, i * 2 + static_cast<uint64_t>(k));
                     tr.add(Source::kCuda, op::kCudaFree, p, t, ts, d);
                     ts += d + 10 * kUs;
                   }
                   return ts;
                 });
               },
               ""});
  s.push_back({"item_every_step", "sync_copy_in_loop", "implicit_sync", Source::kCuda, op::kCudaMemcpy,
               [](bool f) {
                 return in_loop(f, [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   // loss.item(): a 4-byte device-to-host cudaMemcpy (kind 2) that waits ~1.5 ms.
                   const uint64_t d = jit(1500 * kUs, i);
                   tr.add(Source::kCuda, op::kCudaMemcpy, p, t, ts, d, 4, 2);
                   return ts + d + 10 * kUs;
                 });
               },
               ""});
  s.push_back({"malloc_in_steady_state", "malloc_in_loop", "implicit_sync", Source::kCuda, op::kCudaMalloc,
               [](bool f) {
                 return in_loop(f, [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   // A caching-allocator miss every step (changing shapes): ~1 ms in the driver.
                   const uint64_t d = jit(1 * kMs, i);
                   tr.add(Source::kCuda, op::kCudaMalloc, p, t, ts, d, 64u << 20);
                   return ts + d + 10 * kUs;
                 });
               },
               ""});
  s.push_back({"graph_reinstantiated", "graph_reinstantiated", "cuda_graph", Source::kGraph, op::kGraphInstantiate,
               [](bool f) {
                 // A graph-replayed step (3 eager launches + 1 graph launch); in the fault the
                 // capture is invalidated every 10th step: capture, instantiate (~25 ms), launch.
                 return in_loop(
                     f,
                     [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                       if (i % 10 == 0) {
                         tr.add(Source::kGraph, op::kGraphBeginCapture, p, t, ts, 5 * kUs);
                         tr.add(Source::kGraph, op::kGraphEndCapture, p, t, ts + 300 * kUs, 20 * kUs);
                         const uint64_t d = jit(25 * kMs, i);
                         tr.add(Source::kGraph, op::kGraphInstantiate, p, t, ts + 400 * kUs, d);
                         ts += 400 * kUs + d + 10 * kUs;
                       }
                       tr.add(Source::kGraph, op::kGraphLaunch, p, t, ts, jit(15 * kUs, i));
                       return ts + 30 * kUs;
                     },
                     3);
               },
               ""});
  s.push_back({"graph_launch_tail", "graph_launch_tail", "cuda_graph", Source::kGraph, op::kGraphLaunch,
               [](bool f) {
                 Trace tr;
                 // Every step is one graph launch; from 20 s on, 1 in 25 blocks for ~12 ms (a full
                 // launch queue). The control launches the graph every step too, always fast.
                 const Extra graph = [f](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   const bool slow = f && ts >= kT0 + 20 * kS && i % 25 == 0;
                   const uint64_t d = slow ? jit(12 * kMs, i) : jit(15 * kUs, i);
                   tr.add(Source::kGraph, op::kGraphLaunch, p, t, ts, d);
                   return ts + d + 10 * kUs;
                 };
                 loop(tr, kPid, kTid, 0, 60 * kS, 2, graph, 1);
                 loop(
                     tr, kNeighbour, kNeighbour + 1, 0, 60 * kS, 2,
                     [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                       tr.add(Source::kGraph, op::kGraphLaunch, p, t, ts, jit(15 * kUs, i));
                       return ts + 25 * kUs;
                     },
                     1);
                 tr.finish();
                 return tr;
               },
               ""});
  s.push_back({"graph_coverage_falling", "graph_coverage_falling", "cuda_graph", Source::kCuda, op::kCudaLaunchKernel,
               [](bool f) {
                 Trace tr;
                 // Steps replay a graph (+3 eager launches) - until 30 s in the fault, where the
                 // capture breaks and the step runs its 40 kernels eagerly.
                 auto graphed = [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   tr.add(Source::kGraph, op::kGraphLaunch, p, t, ts, jit(15 * kUs, i));
                   return ts + 25 * kUs;
                 };
                 uint64_t t = kT0;
                 for (uint64_t i = 0; t + 50 * kMs < kT0 + 60 * kS; ++i) {
                   const bool eager = f && t >= kT0 + 30 * kS;
                   t = step(tr, kPid, kTid, t, i, eager ? 40 : 3, eager ? Extra{} : Extra{graphed});
                   t += eager ? 0 : 700 * kUs;  // the graph's kernels take the eager launches' time
                 }
                 loop(tr, kNeighbour, kNeighbour + 1, 0, 60 * kS, 3, graphed, 1);
                 tr.finish();
                 return tr;
               },
               std::string(INGERO_SOURCE_DIR) + "/rules/optional/graph_coverage.rules"});
  s.push_back({"steps_slow_down", "slow_steps", "step_slowdown", Source::kUnknown, 0,  // a step is no op
               [](bool f) {
                 return in_loop(f, [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
                   // From 20 s on the feeding thread sleeps ~3 ms before each sync (a slower
                   // input, a lock): its ~2.8 ms steps take twice as long.
                   const uint64_t d = jit(3 * kMs, i);
                   tr.offcpu(p, t, ts, d, OffCpuState::kSleeping);
                   return ts + d;
                 });
               },
               std::string(INGERO_SOURCE_DIR) + "/rules/optional/slow_steps.rules"});
  return s;
}

// The pack, plus `extra` (its inline tests must pass) when given.
Plan plan_with(const std::string& extra) {
  if (extra.empty()) return rules::default_rule_pack_plan();
  rules::LoadResult lr = rules::load_rule_files({extra}, true);
  EXPECT_TRUE(lr.ok()) << extra << ": " << (lr.rejected.empty() ? "" : lr.rejected.front());
  return lr.plan;
}

AnalysisResult analyse(const Trace& tr, unsigned threads, AnnotateOptions ao = {}, const std::string& extra = "") {
  VectorSource src(tr.ev, 4096, tr.meta);
  ChainAnnotator a(ao);
  AnnotatingSource tap(src, a);
  EngineOptions o;
  o.threads = threads;
  o.compute_stats = false;
  std::vector<std::string> errors;
  AnalysisResult r = run_plan(plan_with(extra), tap, o, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  annotate_result(r, a);
  return r;
}

std::string describe(const AnalysisResult& r) {
  std::string s;
  for (const auto& c : r.chains)
    s += std::string(severity_name(c.severity)) + " " + c.rule + " pid " + std::to_string(c.pid) + " tid " +
         std::to_string(c.tid) + ": " + c.summary + "\n";
  return s;
}

// A chain the warm-up did not decide: the rule declared MEDIUM+ and the severity module
// (operators/severity.h) did not demote it for warm-up. It may still be LOW for another of the
// module's reasons (one slow call stands behind it: the warm-up script's first calls are single).
bool steady_state_medium(const Chain& c) {
  return c.declared_severity.value_or(c.severity) >= Severity::kMedium && c.summary.rfind("warm-up: ", 0) != 0 &&
         c.root_cause.find("warm-up calls alone") == std::string::npos &&
         (c.severity >= Severity::kMedium || c.root_cause.find("a single call stands behind it") != std::string::npos);
}

std::multiset<std::string> chain_keys(const AnalysisResult& r) {
  std::multiset<std::string> k;
  for (const auto& c : r.chains)
    k.insert(c.id + "|" + severity_name(c.severity) + "|" + std::to_string(c.tid) + "|" + c.summary + "|" +
             c.root_cause);
  return k;
}

class RulePackScenario : public ::testing::TestWithParam<size_t> {};

TEST_P(RulePackScenario, FaultFoundWithTheRightRulePidAndThread) {
  const Scenario sc = scenarios()[GetParam()];
  const auto r = analyse(sc.make(true), 1, {}, sc.extra_rules);
  const Chain* hit = nullptr;
  for (const auto& c : r.chains)
    if (c.rule == sc.rule && c.severity >= Severity::kMedium) {
      EXPECT_EQ(c.category, sc.category);
      EXPECT_EQ(c.pid, kPid) << describe(r);
      EXPECT_EQ(c.tid, kTid) << "the launching thread, from the rule's key or the annotator";
      EXPECT_EQ(c.source, sc.source);
      EXPECT_EQ(c.op, sc.op);
      EXPECT_GE(c.window_start, kT0 + 20 * kS) << "only after the fault starts";
      hit = &c;
    }
  ASSERT_NE(hit, nullptr) << sc.name << ": no " << sc.rule << " chain\n" << describe(r);
  // The new families never blame the clean neighbour.
  for (const auto& c : r.chains)
    if (c.category == sc.category) {
      EXPECT_NE(c.pid, kNeighbour) << describe(r);
    }
  if (std::getenv("INGERO_TEST_SHOW")) std::printf("%s", describe(r).c_str());
}

TEST_P(RulePackScenario, ControlIsClean) {
  const Scenario sc = scenarios()[GetParam()];
  const auto r = analyse(sc.make(false), 1, {}, sc.extra_rules);
  for (const auto& c : r.chains) EXPECT_LT(c.severity, Severity::kMedium) << sc.name << "\n" << describe(r);
  for (const auto& c : r.chains) EXPECT_NE(c.category, sc.category) << describe(r);
}

TEST_P(RulePackScenario, OneAndFourThreadsGiveTheSameChains) {
  const Scenario sc = scenarios()[GetParam()];
  const Trace tr = sc.make(true);
  EXPECT_EQ(chain_keys(analyse(tr, 1, {}, sc.extra_rules)), chain_keys(analyse(tr, 4, {}, sc.extra_rules)));
}

INSTANTIATE_TEST_SUITE_P(Issue15, RulePackScenario, ::testing::Range<size_t>(0, 7),
                         [](const auto& info) { return scenarios()[info.param].name; });

// --- implicit_sync: the call site, and the launch loop -------------------------------------

TEST(RulePackImplicitSync, ChainNamesTheCallSiteOfItsCalls) {
  Trace tr = scenarios()[0].make(true);  // empty_cache every step
  ParsedStack p;
  StackFrame lib;
  lib.kind = FrameKind::kNative;
  lib.function = "cudaFree";
  lib.module = "libcudart.so.13";
  p.frames.push_back(lib);
  StackFrame py;
  py.kind = FrameKind::kPython;
  py.file = "train.py";
  py.function = "train_step";
  py.line = 57;
  p.frames.push_back(py);
  tr.meta.stacks[0x5157] = encode_stack(p);
  for (auto& e : tr.ev)
    if (e.source == Source::kCuda && e.op == op::kCudaFree) e.stack_id = 0x5157;
  const auto r = analyse(tr, 1);
  size_t named = 0;
  for (const auto& c : r.chains)
    if (c.rule == "free_in_loop") {
      ASSERT_FALSE(c.recommendations.empty());
      EXPECT_NE(c.recommendations.front().find("train.py:57"), std::string::npos) << c.recommendations.front();
      ++named;
    }
  EXPECT_GT(named, 0u) << describe(r);
}

TEST(RulePackImplicitSync, AThreadThatLaunchesNothingIsNotALaunchLoop) {
  // A cleanup thread freeing memory in a loop, beside a launch loop that is fine.
  Trace tr;
  loop(tr, kPid, kTid, 0, 30 * kS, 40, {}, 0);
  for (uint64_t t = kT0 + 12 * kS, i = 0; t < kT0 + 29 * kS; t += 20 * kMs, ++i)
    tr.add(Source::kCuda, op::kCudaFree, kPid, kHelper, t, jit(5 * kMs, i));
  tr.finish();
  const auto r = analyse(tr, 1);
  size_t seen = 0;
  for (const auto& c : r.chains)
    if (c.rule == "free_in_loop") {
      ++seen;
      EXPECT_EQ(c.tid, kHelper);
      EXPECT_EQ(c.severity, Severity::kLow) << c.summary;
      EXPECT_NE(c.root_cause.find("launched no kernel"), std::string::npos) << c.root_cause;
    }
  EXPECT_GT(seen, 0u) << describe(r);
}

// Explicit stream syncs without stacks are not an implicit_sync chain (docs/rules.md): a
// GPU-bound loop's one sync per step holds most of its launching thread's time - that is the GPU
// working, not time lost - so a share-of-thread-time rule would fire on every healthy loop.
TEST(RulePackImplicitSync, AGpuBoundLoopsOneSyncPerStepIsNotAChain) {
  Trace tr;
  // 40 launches then a ~20 ms cudaStreamSynchronize per step: ~95% of tid 2001's time in syncs.
  uint64_t t = kT0;
  for (uint64_t i = 0; t + 50 * kMs < kT0 + 60 * kS; ++i) {
    t = step(tr, kPid, kTid, t, i, 40, {});
    const uint64_t d = jit(18 * kMs, i);
    tr.add(Source::kCuda, op::kCudaStreamSync, kPid, kTid, t, d);
    t += d + 50 * kUs;
  }
  tr.finish();
  uint64_t sync_ns = 0;
  for (const auto& e : tr.ev)
    if (e.op == op::kCudaStreamSync && e.source == Source::kCuda) sync_ns += e.dur_ns;
  ASSERT_GT(static_cast<double>(sync_ns), 0.8 * 60e9) << "the control must be sync-heavy to mean anything";
  const auto r = analyse(tr, 1);
  for (const auto& c : r.chains) {
    EXPECT_NE(c.category, "implicit_sync") << describe(r);
    EXPECT_LT(c.severity, Severity::kMedium) << describe(r);
  }
}

// The implicit_sync chain carries the time lost (`lost`, the value its severity comes from) and
// its call site; a heavier fault loses more and ranks at least as high.
TEST(RulePackImplicitSync, SeverityFollowsTheTimeLost) {
  auto frees = [](uint64_t each) {
    return in_loop(true, [each](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
      const uint64_t d = jit(each, i);
      tr.add(Source::kCuda, op::kCudaFree, p, t, ts, d);
      return ts + d + 10 * kUs;
    });
  };
  auto worst = [](const AnalysisResult& r, double& lost) {
    Severity s = Severity::kLow;
    lost = 0;
    for (const auto& c : r.chains)
      if (c.rule == "free_in_loop") {
        s = std::max(s, c.severity);
        for (const auto& [k, v] : c.values)
          if (k == "lost") lost = std::max(lost, v);
      }
    return s;
  };
  double light = 0, heavy = 0;
  const Severity sl = worst(analyse(frees(300 * kUs), 1), light);  // ~10% of the step
  const Severity sh = worst(analyse(frees(3 * kMs), 1), heavy);    // ~50% of the step
  EXPECT_GT(light, 0.05 * 10e9);
  EXPECT_GT(heavy, light);
  EXPECT_EQ(sl, Severity::kMedium);
  EXPECT_EQ(sh, Severity::kHigh);
}

// --- warm-up ---------------------------------------------------------------------------------

// A short script (traced live in the issue): its first calls create the context, load modules
// and allocate (hundreds of ms), then 50 ordinary steps. Its only slow calls are its first ones.
Trace warmup_script(uint64_t context_ns = 350 * kMs) {
  Trace tr;
  uint64_t t = kT0 + 2 * kS;
  tr.add(Source::kCuda, op::kCudaMalloc, kPid, kTid, t, context_ns, 2u << 20);  // context creation
  t += context_ns + kMs;
  for (int k = 0; k < 3; ++k) {  // lazy module loading on the first launches
    tr.add(Source::kCuda, op::kCudaLaunchKernel, kPid, kTid, t, 30 * kMs);
    t += 31 * kMs;
  }
  tr.add(Source::kCuda, op::kCudaStreamSync, kPid, kTid, t, 120 * kMs);  // first autotuned kernels
  t += 121 * kMs;
  for (uint64_t i = 0; i < 50; ++i) t = step(tr, kPid, kTid, t, i, 10, {});
  for (int k = 0; k < 20; ++k) {  // the model's buffers, allocated once at start
    tr.add(Source::kCuda, op::kCudaMalloc, kPid, kTid, t, jit(80 * kUs, static_cast<uint64_t>(k)), 64u << 20);
    t += 100 * kUs;
  }
  tr.finish();
  return tr;
}

TEST(RulePackWarmup, OnlyAProcesssFirstCallsAreSlowGivesNoMediumOrHighChain) {
  const Trace tr = warmup_script();
  const auto r = analyse(tr, 1);
  for (const auto& c : r.chains) EXPECT_EQ(c.severity, Severity::kLow) << describe(r);
  // It is still reported, as warm-up, with the evidence on the chain.
  bool warm = false;
  for (const auto& c : r.chains) {
    if (c.summary.rfind("warm-up: ", 0) != 0) continue;
    warm = true;
    double calls = 0, window = 0;
    for (const auto& [k, v] : c.values) {
      if (k == "warmup.calls") calls = v;
      if (k == "warmup.window_ns") window = v;
    }
    EXPECT_GT(calls, 0) << c.id;
    EXPECT_EQ(window, 10e9);
    EXPECT_NE(c.root_cause.find("warm-up"), std::string::npos);
  }
  EXPECT_TRUE(warm) << describe(r);
  EXPECT_EQ(chain_keys(r), chain_keys(analyse(tr, 4)));
}

TEST(RulePackWarmup, WithoutTheWarmupTheSameScriptGivesAMediumChain) {
  // The test above can fail: with warm-up off the first calls make an unexplained tail the rule
  // declares MEDIUM+ that no warm-up demotes (steady_state_medium).
  AnnotateOptions ao;
  ao.warmup_ns = 0;
  const auto r = analyse(warmup_script(), 1, ao);
  bool medium = false;
  for (const auto& c : r.chains) medium |= steady_state_medium(c);
  EXPECT_TRUE(medium) << describe(r);
}

// Warm-up is the pack's `param warmup` (rules/common.rules): the annotator's default equals it,
// overrides parse with the rule language's units, and a wrong kind is rejected.
TEST(RulePackWarmup, IsAPackParamWithTheAnnotatorsDefault) {
  rules::PackParam p;
  std::string err;
  ASSERT_TRUE(rules::pack_param("warmup", {}, p, err)) << err;
  EXPECT_EQ(p.kind, "duration");
  EXPECT_EQ(p.text, "10s");
  EXPECT_FALSE(p.overridden);
  EXPECT_EQ(static_cast<uint64_t>(p.value), AnnotateOptions{}.warmup_ns);
  ASSERT_TRUE(rules::pack_param("min_calls", {}, p, err)) << err;
  EXPECT_EQ(static_cast<uint64_t>(p.value), AnnotateOptions{}.warmup_min_calls);
  ASSERT_TRUE(rules::pack_param("min_tail_ratio", {}, p, err)) << err;
  EXPECT_EQ(p.value, AnnotateOptions{}.warmup_tail_ratio);

  ASSERT_TRUE(rules::pack_param("warmup", {{"warmup", "0s"}}, p, err)) << err;
  EXPECT_EQ(p.value, 0.0);
  EXPECT_TRUE(p.overridden);
  ASSERT_TRUE(rules::pack_param("warmup", {{"warmup", "2m"}, {"min_share", "60%"}}, p, err)) << err;
  EXPECT_EQ(p.value, 120e9);
  ASSERT_TRUE(rules::pack_param("warmup", {{"warmup", "1500ms"}}, p, err)) << err;
  EXPECT_EQ(p.value, 1.5e9);
  EXPECT_FALSE(rules::pack_param("warmup", {{"warmup", "5"}}, p, err));  // not a duration
  EXPECT_NE(err.find("duration"), std::string::npos) << err;
  EXPECT_FALSE(rules::pack_param("warmup", {{"warmup", "5MiB"}}, p, err));
  EXPECT_FALSE(rules::pack_param("warmup", {{"warmup", "min_calls"}}, p, err));  // not a literal
  EXPECT_FALSE(rules::pack_param("warmup", {{"warmup", "10s +"}}, p, err));
  EXPECT_FALSE(rules::pack_param("no_such_param", {}, p, err));
  EXPECT_NE(err.find("no param"), std::string::npos) << err;
  // The override also compiles with the pack: the rule compiler knows the name.
  dsl::CompileOptions co;
  co.params["warmup"] = "0s";
  EXPECT_TRUE(rules::load_rule_files({}, true, co).ok());
}

// The override reaches the annotator: `--param warmup=0s` turns warm-up off, so the script whose
// only slow calls are its first ones gets its MEDIUM+ chain back (steady_state_medium); 30 s keeps it LOW.
TEST(RulePackWarmup, TheParamOverrideDrivesTheAnnotator) {
  rules::PackParam p;
  std::string err;
  ASSERT_TRUE(rules::pack_param("warmup", {{"warmup", "0s"}}, p, err)) << err;
  AnnotateOptions off;
  off.warmup_ns = static_cast<uint64_t>(p.value);
  bool medium = false;
  for (const auto& c : analyse(warmup_script(), 1, off).chains) medium |= steady_state_medium(c);
  EXPECT_TRUE(medium);
  ASSERT_TRUE(rules::pack_param("warmup", {{"warmup", "30s"}}, p, err)) << err;
  AnnotateOptions longer;
  longer.warmup_ns = static_cast<uint64_t>(p.value);
  const auto r = analyse(warmup_script(), 1, longer);
  ASSERT_FALSE(r.chains.empty());
  for (const auto& c : r.chains) {
    EXPECT_EQ(c.severity, Severity::kLow) << describe(r);
    for (const auto& [k, v] : c.values)
      if (k == "warmup.window_ns") {
        EXPECT_EQ(v, 30e9);
      }
    EXPECT_NE(c.root_cause.find("param warmup = 30s"), std::string::npos) << c.root_cause;
  }
}

// `explain --why-not RULE` says what the warm-up did to the rule's chains, with the count and
// the param's name and value (cli/cmd_explain.cpp prints warmup_why_not_text()).
TEST(RulePackWarmup, WhyNotCountsTheChainsAndCallsTheWarmupJudged) {
  const auto r = analyse(warmup_script(), 1);
  std::set<std::string> rules_with_warmup;
  uint64_t demoted = 0, calls = 0;
  for (const auto& c : r.chains) {
    double v_calls = 0, only = -1;
    for (const auto& [k, v] : c.values) {
      if (k == "warmup.calls") v_calls = v;
      if (k == "warmup.only") only = v;
    }
    if (v_calls <= 0) continue;
    rules_with_warmup.insert(c.rule);
    EXPECT_EQ(only, 1.0) << c.summary;  // every chain of this script stands on warm-up alone
  }
  ASSERT_FALSE(rules_with_warmup.empty()) << describe(r);
  for (const auto& rule : rules_with_warmup) {
    const WarmupEffect w = warmup_effect(r.chains, rule);
    EXPECT_GT(w.chains, 0u);
    EXPECT_EQ(w.only, w.chains);
    EXPECT_EQ(w.demoted, w.chains);
    EXPECT_EQ(w.abnormal, 0u);
    EXPECT_GT(w.calls, 0u);
    demoted += w.demoted;
    calls += w.calls;
    const std::string text = warmup_why_not_text(w, 10 * kS);
    EXPECT_NE(text.find("param warmup = 10s"), std::string::npos) << text;
    EXPECT_NE(text.find(std::to_string(w.chains) + " chain(s) had " + std::to_string(w.calls) + " call(s)"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("reported LOW"), std::string::npos) << text;
  }
  EXPECT_GT(demoted, 0u);
  // A rule with no chain, and warm-up off, are said as such.
  const WarmupEffect none = warmup_effect(r.chains, "graph_launch_tail");
  EXPECT_EQ(none.chains, 0u);
  EXPECT_NE(warmup_why_not_text(none, 10 * kS).find("no chain of this rule had calls in a warm-up"), std::string::npos);
  EXPECT_NE(warmup_why_not_text(none, 0).find("off (param warmup = 0s)"), std::string::npos);
  // An abnormal warm-up is counted apart.
  const auto slow = analyse(warmup_script(6 * kS), 1);
  uint64_t abnormal = 0;
  for (const auto& c : slow.chains) abnormal += warmup_effect({c}, c.rule).abnormal;
  EXPECT_GT(abnormal, 0u) << describe(slow);
}

TEST(RulePackWarmup, AnAbnormalWarmupKeepsItsSeverityAndSaysSo) {
  // Context creation taking 6 s (>= warmup_abnormal_ns, 5 s) is itself the problem.
  const auto r = analyse(warmup_script(6 * kS), 1);
  bool abnormal = false;
  for (const auto& c : r.chains)
    if (c.summary.rfind("abnormal warm-up: ", 0) == 0) {
      abnormal = true;
      EXPECT_TRUE(steady_state_medium(c)) << c.summary << " | " << c.root_cause;
      EXPECT_NE(c.explanation.find("itself abnormal"), std::string::npos) << c.explanation;
    }
  EXPECT_TRUE(abnormal) << describe(r);
}

TEST(RulePackWarmup, MallocsOnlyInWarmupAreReportedLow) {
  // cudaMalloc every step for the first 9 s (allocating the model and the first batches), then
  // a cached steady state: malloc_in_loop's chain is warm-up, LOW. (Steady-state allocations stay
  // MEDIUM+: RulePackScenario/malloc_in_steady_state.)
  Trace tr;
  loop(
      tr, kPid, kTid, 0, 40 * kS, 40,
      [](Trace& tr, uint32_t p, uint32_t t, uint64_t ts, uint64_t i) {
        if (ts >= kT0 + 9 * kS) return ts;
        const uint64_t d = jit(1 * kMs, i);
        tr.add(Source::kCuda, op::kCudaMalloc, p, t, ts, d, 64u << 20);
        return ts + d + 10 * kUs;
      },
      1);
  tr.finish();
  const auto r = analyse(tr, 1);
  bool seen = false;
  for (const auto& c : r.chains) {
    EXPECT_EQ(c.severity, Severity::kLow) << describe(r);
    if (c.rule == "malloc_in_loop") {
      seen = true;
      EXPECT_EQ(c.summary.rfind("warm-up: ", 0), 0u) << c.summary;
    }
  }
  EXPECT_TRUE(seen) << "the allocations are reported, as warm-up\n" << describe(r);
}

// --- throughput_drop: severity from the launching thread's time split ------------------------

// A server thread launching 1000/s for 60 s, then 100/s (a 10x drop: the rule's HIGH). Between
// launches in the drop it either sleeps (idle: its load fell) or computes on CPU (busy).
Trace server(bool idle) {
  Trace tr;
  uint64_t i = 0;
  for (uint64_t t = kT0; t < kT0 + 90 * kS; ++i) {
    const bool drop = t >= kT0 + 60 * kS;
    tr.add(Source::kCuda, op::kCudaLaunchKernel, kPid, kTid, t, jit(12 * kUs, i));
    const uint64_t gap = drop ? 10 * kMs : 1 * kMs;
    if (drop && idle) tr.offcpu(kPid, kTid, t + 20 * kUs, gap - 40 * kUs, OffCpuState::kSleeping);
    t += gap;
  }
  tr.finish();
  return tr;
}

TEST(RulePackTimeSplit, ThroughputDropOfAnIdleThreadIsNotHigh) {
  const auto r = analyse(server(true), 1);
  size_t drops = 0;
  for (const auto& c : r.chains) {
    if (c.category != "throughput_drop") continue;
    ++drops;
    EXPECT_EQ(c.time_split.dominant, "off_cpu_blocked");
    EXPECT_EQ(c.severity, Severity::kLow) << c.summary;
    EXPECT_NE(c.root_cause.find("idle"), std::string::npos) << c.root_cause;
  }
  EXPECT_GT(drops, 0u) << describe(r);
}

TEST(RulePackTimeSplit, ThroughputDropOfABusyThreadStaysHigh) {
  const auto r = analyse(server(false), 1);
  size_t high = 0;
  for (const auto& c : r.chains)
    if (c.category == "throughput_drop") {
      EXPECT_EQ(c.time_split.dominant, "on_cpu");
      high += c.severity == Severity::kHigh;
    }
  EXPECT_GT(high, 0u) << describe(r);
}

// --- the shared Ingero traces: no new chain the data does not support ------------------------

struct Db {
  sqlite3* db = nullptr;
  explicit Db(const std::string& path) {
    const std::string uri = "file:" + path + "?immutable=1";
    if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
      sqlite3_close(db);
      db = nullptr;
    }
  }
  ~Db() { sqlite3_close(db); }
  // Rows of a query as strings joined by '|'.
  std::set<std::string> rows(const std::string& sql) const {
    std::set<std::string> out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sqlite3_errmsg(db) << ": " << sql;
      return out;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::string r;
      for (int i = 0; i < sqlite3_column_count(st); ++i)
        r += (i ? "|" : "") + std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, i)));
      out.insert(r);
    }
    sqlite3_finalize(st);
    return out;
  }
};

TEST(RulePackOnIngeroTraces, NewFamiliesFireOnlyWhereTheDataSupportsThem) {
  const std::filesystem::path dir = INGERO_SHARED_DATA;
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no shared Ingero traces at " << dir;
  size_t traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".db") continue;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    Db db(path);
    ASSERT_NE(db.db, nullptr);
    std::string error;
    auto src = open_sqlite_trace(path, error);
    ASSERT_TRUE(src) << error;
    ++traces;
    ChainAnnotator a;
    AnnotatingSource tap(*src, a);
    EngineOptions o;
    o.compute_stats = false;
    AnalysisResult r = run_plan(rules::default_rule_pack_plan(), tap, o);
    annotate_result(r, a);
    // What the data could support: per (pid, tid, op, 10 s window) at least min_loop_calls (20)
    // calls, and n x median >= 5% of the window, for which 2 x sum(duration) >= 0.5 s is necessary.
    // Ingero's sched_switch rows are stored at the switch-in, CUDA calls at their start.
    auto candidates = [&](const std::string& where) {
      return db.rows("SELECT pid || '|' || tid || '|' || (timestamp / 10000000000) FROM events WHERE " + where +
                     " GROUP BY pid, tid, timestamp / 10000000000 HAVING count(*) >= 20 AND 2 * sum(duration) >= "
                     "500000000");
    };
    const auto frees = candidates("(source = 1 AND op = 2) OR (source = 4 AND op = 8)");
    const auto mallocs = candidates("(source = 1 AND op IN (1, 8)) OR (source = 4 AND op IN (5, 6))");
    const auto copies = candidates("(source = 1 AND op = 4 AND arg1 = 2) OR (source = 4 AND op = 10)");
    const auto graphs = db.rows("SELECT count(*) FROM events WHERE source = 8");
    for (const auto& c : r.chains) {
      const std::string key = std::to_string(c.pid) + "|" + std::to_string(c.tid) + "|" +
                              std::to_string(c.window_start / 10'000'000'000ull);
      if (c.rule == "free_in_loop") {
        EXPECT_TRUE(frees.count(key)) << c.id;
      }
      if (c.rule == "malloc_in_loop") {
        EXPECT_TRUE(mallocs.count(key)) << c.id;
      }
      if (c.rule == "sync_copy_in_loop") {
        EXPECT_TRUE(copies.count(key)) << c.id;
      }
      if (c.category == "cuda_graph") {
        EXPECT_NE(*graphs.begin(), "0") << c.id;
      }
    }
    // And the recorded traces hold none of these patterns, so none of the new rules fires there.
    EXPECT_TRUE(frees.empty() && mallocs.empty() && copies.empty());
    EXPECT_EQ(*graphs.begin(), "0");
    for (const auto& c : r.chains) {
      EXPECT_NE(c.category, "implicit_sync") << c.id;
      EXPECT_NE(c.category, "cuda_graph") << c.id;
    }
  }
  if (traces == 0) GTEST_SKIP() << "no .db under " << dir;
}

// The embedded sample (pytorch-dataloader-starvation.db): its slow calls are the process's first
// GPU calls (the 25.8 ms cudaLaunchKernel 159 ms after its first CUDA call). Its chains stay,
// each marked warm-up and LOW - what SQL says about the same file.
TEST(RulePackOnIngeroTraces, DataloaderSampleChainsAreItsWarmup) {
  const std::string path = std::string(INGERO_SHARED_DATA) + "/pytorch-dataloader-starvation.db";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  Db db(path);
  ASSERT_NE(db.db, nullptr);
  // The slowest launch, in ms after the process's first CUDA/driver call.
  const auto slow = db.rows(
      "SELECT CAST((e.timestamp - f.first) / 1000000 AS INTEGER) FROM events e, (SELECT pid, min(timestamp) AS first "
      "FROM events WHERE source IN (1, 4) GROUP BY pid) f WHERE e.pid = f.pid AND e.source = 1 AND e.op = 3 "
      "ORDER BY e.duration DESC LIMIT 1");
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_LT(std::stol(*slow.begin()), 10'000) << "the slow launch is inside the 10 s warm-up";
  std::string error;
  auto src = open_sqlite_trace(path, error);
  ASSERT_TRUE(src) << error;
  ChainAnnotator a;
  AnnotatingSource tap(*src, a);
  AnalysisResult r = run_plan(rules::default_rule_pack_plan(), tap, EngineOptions{});
  annotate_result(r, a);
  ASSERT_FALSE(r.chains.empty());
  for (const auto& c : r.chains) {
    EXPECT_EQ(c.severity, Severity::kLow) << c.summary;
    EXPECT_EQ(c.summary.rfind("warm-up: ", 0), 0u) << c.summary;
  }
}

}  // namespace
