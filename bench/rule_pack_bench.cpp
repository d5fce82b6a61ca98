// The default rule pack (rules/*.rules compiled by dsl/) against the hand-built plans it
// replaces (engine/default_plans.cpp), on the foundation's large synthetic trace, one thread.
// Target: the pack within 20% of the hand-built plans (docs/performance.md, "Rule pack").
// BM_RulePackThreads/N runs the pack with N engine threads (issue 12, "threads that scale":
// 2 threads >= 1.8x one): wall time (real_time) and the whole process's CPU time per run, so
// the speedup (wall 1 / wall N) and the added work (CPU N - CPU 1) read off the same table.
//
//   ./build/ingero-bench --benchmark_filter=RulePack --benchmark_min_time=1
//   ./build/ingero-bench --benchmark_filter=RulePackThreads --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "rules/pack.h"

namespace ingero {
namespace {

constexpr uint64_t kEvents = 2'000'000;

const std::vector<Event>& pack_trace() {
  static const std::vector<Event> events = synth::make_large_trace(kEvents, 42);
  return events;
}

void run_pack(benchmark::State& state, const Plan& plan, unsigned threads = 1) {
  const auto& ev = pack_trace();
  EngineOptions opts;
  opts.threads = threads;
  size_t chains = 0;
  for (auto _ : state) {
    BorrowedSource src(ev);
    const auto r = run_plan(plan, src, opts);
    chains = r.chains.size();
    benchmark::DoNotOptimize(r.chains.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
  state.counters["chains"] = static_cast<double>(chains);
}

void BM_RulePackHandBuilt(benchmark::State& state) {
  static const Plan plan = default_plan();
  run_pack(state, plan);
}
void BM_RulePackCompiled(benchmark::State& state) {
  static const Plan plan = rules::default_rule_pack_plan();
  run_pack(state, plan);
}
void BM_RulePackThreads(benchmark::State& state) {
  static const Plan plan = rules::default_rule_pack_plan();
  run_pack(state, plan, static_cast<unsigned>(state.range(0)));
}
// Compiling the embedded pack from text (parse + checks + lowering), for the record.
void BM_RulePackCompile(benchmark::State& state) {
  const auto sources = rules::default_rule_sources();
  dsl::CompileOptions o = rules::pack_compile_options();
  for (auto _ : state) benchmark::DoNotOptimize(dsl::compile_rules(sources, o).plan.nodes.size());
}

}  // namespace

BENCHMARK(BM_RulePackHandBuilt)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RulePackCompiled)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RulePackCompile)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RulePackThreads)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace ingero
