// The foundation's throughput target: per-op statistics plus the tail / off-CPU join (the
// default analyses) over a generated trace of 10 million events held in memory, on one thread.
// Target: >= 5 million events/s on one core (docs/performance.md has the figures and command).
//
//   ./build/ingero-bench --benchmark_filter=Analysis --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <memory>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/synth.h"

namespace ingero {
namespace {

constexpr uint64_t kEvents = 10'000'000;

// Events generated once and shared by every run; each run replays them from memory.
const std::vector<Event>& trace() {
  static const std::vector<Event> events = synth::make_large_trace(kEvents, 42);
  return events;
}

void run(benchmark::State& state, const Plan& plan) {
  const auto& ev = trace();
  EngineOptions opts;
  opts.threads = static_cast<unsigned>(state.range(0));
  size_t chains = 0;
  for (auto _ : state) {
    BorrowedSource src(ev, 4096);
    const auto r = run_plan(plan, src, opts);
    chains = r.chains.size();
    benchmark::DoNotOptimize(r.ops.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
  state.counters["events"] = static_cast<double>(ev.size());
  state.counters["chains"] = static_cast<double>(chains);
}

// Statistics only (no rules): the floor of the engine's cost.
void BM_AnalysisStatsOnly(benchmark::State& state) { run(state, Plan{}); }

// Per-op statistics plus the CPU-contention tail / off-CPU interval join alone (the target).
void BM_AnalysisStatsAndTailJoin(benchmark::State& state) {
  static const Plan plan = [] {
    const Plan all = default_plan();
    // Keep the streams and the cpu_contention rule only: nodes up to its Emit.
    Plan p;
    for (const auto& n : all.nodes) {
      p.nodes.push_back(n);
      if (const auto* e = std::get_if<EmitNode>(&n.body); e && e->rule == "cpu_contention") break;
    }
    return p;
  }();
  run(state, plan);
}

// Every default analysis (10 hand-built rules).
void BM_AnalysisDefaultPlan(benchmark::State& state) {
  static const Plan plan = default_plan();
  run(state, plan);
}

// Rates are per CPU-second of the whole process (MeasureProcessCPUTime: every engine thread is
// counted), so "events/s on one core" stays meaningful on a shared machine; the Time column is
// wall-clock and the 2-thread runs show the parallel speed-up against it.
BENCHMARK(BM_AnalysisStatsOnly)->Arg(1)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();
BENCHMARK(BM_AnalysisStatsAndTailJoin)->Arg(1)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();
BENCHMARK(BM_AnalysisDefaultPlan)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

}  // namespace
}  // namespace ingero
