// Operators in isolation, per event: quantile state (exact and sketch), the rule pack's aggregate
// shape, an exact window's quantile query, keying, off-CPU span building and the interval join,
// over the large synthetic workload (model/synth.h); and the slowest-call buffer (TopK) on the
// replay benchmark's call stream.
// Run: ./build/ingero-bench --benchmark_filter='BM_Op'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "engine/top_k.h"
#include "model/ops.h"
#include "model/synth.h"
#include "operators/aggregate.h"
#include "operators/interval_join.h"
#include "operators/key_by.h"
#include "operators/offcpu_spans.h"
#include "operators/quantile.h"

namespace ingero {
namespace {

// The slowest-call buffers of bench/make_ingero_trace.sh's calls: 36 keys, calls in time order
// taking turns, durations 2-102 us with a 1 % tail of 1-21 ms (the same formulas), k = 16384
// each (the engine's cap): the threshold reject, the appends and the compactions.
struct TopKCall {
  uint64_t ts;
  uint32_t dur;
};
struct TopKSlower {
  static uint64_t primary(const TopKCall& c) { return c.dur; }
  bool operator()(const TopKCall& a, const TopKCall& b) const { return a.dur != b.dur ? a.dur > b.dur : a.ts > b.ts; }
};
void BM_OpTopKCalls(benchmark::State& state) {
  constexpr size_t kKeys = 36, kCalls = 4'500'000, kCap = 16384;
  std::vector<TopKCall> calls(kCalls);
  for (uint64_t i = 0; i < kCalls; ++i) {
    const uint64_t h = i * 2654435761ULL;
    const uint64_t dur = h % 100 == 0 ? 1000000 + (i * 40503) % 20000000 : 2000 + h % 100000;
    calls[i] = {i, static_cast<uint32_t>(dur)};
  }
  for (auto _ : state) {
    std::vector<TopK<TopKCall, TopKSlower>> tops;
    tops.reserve(kKeys);
    for (size_t k = 0; k < kKeys; ++k) tops.emplace_back(kCap);
    for (size_t i = 0; i < kCalls; ++i) tops[i % kKeys].add(calls[i]);
    size_t kept = 0;
    for (auto& t : tops) kept += t.items().size();
    benchmark::DoNotOptimize(kept);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kCalls));
}
BENCHMARK(BM_OpTopKCalls)->Unit(benchmark::kMillisecond);

const std::vector<Event>& trace() {
  static const std::vector<Event> events = synth::make_large_trace(1'000'000, 42);
  return events;
}

// Exact up to the limit (the small-window path), then DDSketch (the large-window path).
void BM_OpQuantileAdd(benchmark::State& state) {
  const auto& ev = trace();
  const auto limit = static_cast<uint32_t>(state.range(0));
  for (auto _ : state) {
    QuantileState q(limit, 0.01);
    for (const auto& e : ev) q.add(e.dur_ns);
    benchmark::DoNotOptimize(q.quantile(0.99));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
}
BENCHMARK(BM_OpQuantileAdd)->Arg(65536)->Arg(1 << 22)->Unit(benchmark::kMillisecond);

// The rule pack's aggregate shape (count, sum, max, p50, p99 of duration) per event: exact up to
// the limit, then DDSketch; the per-event path AggregateState::add inlines into the engine.
void BM_OpAggregateAdd(benchmark::State& state) {
  const auto& ev = trace();
  AggregateNode node;
  node.aggs = {{"n", AggKind::kCount, Field::kDuration, 0},
               {"sum", AggKind::kSum, Field::kDuration, 0},
               {"max", AggKind::kMax, Field::kDuration, 0},
               {"p50", AggKind::kQuantile, Field::kDuration, 0.5},
               {"p99", AggKind::kQuantile, Field::kDuration, 0.99}};
  node.exact_limit = static_cast<uint32_t>(state.range(0));
  const AggregateLayout layout(node);
  double row[5];
  for (auto _ : state) {
    AggregateState s(&layout);
    for (const auto& e : ev) s.add(e);
    s.values(0, row);
    benchmark::DoNotOptimize(row[4]);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
}
BENCHMARK(BM_OpAggregateAdd)->Arg(65536)->Arg(1 << 22)->Unit(benchmark::kMillisecond);

// Closing an exact window: p50/p95/p99 of a full 65,536-value buffer (the sort dominates).
void BM_OpQuantileQueryExact(benchmark::State& state) {
  const auto& ev = trace();
  QuantileState filled(65536, 0.01);
  for (size_t i = 0; i < 65536 && i < ev.size(); ++i) filled.add(ev[i].dur_ns);
  for (auto _ : state) {
    state.PauseTiming();
    // A fresh unsorted copy each time: quantile() sorts the buffer it queries.
    QuantileState q(filled);  // NOLINT(performance-unnecessary-copy-initialization)
    state.ResumeTiming();
    benchmark::DoNotOptimize(q.quantile(0.5) + q.quantile(0.95) + q.quantile(0.99));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 65536));
}
BENCHMARK(BM_OpQuantileQueryExact)->Unit(benchmark::kMicrosecond);

void BM_OpKeyBy(benchmark::State& state) {
  const auto& ev = trace();
  KeyBy kb({Field::kPid, Field::kSource, Field::kOp});
  for (auto _ : state) {
    uint64_t acc = 0;
    for (const auto& e : ev) acc += KeyHash{}(kb.key_of(e));
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
}
BENCHMARK(BM_OpKeyBy)->Unit(benchmark::kMillisecond);

void BM_OpOffCpuSpans(benchmark::State& state) {
  const auto& ev = trace();
  OffCpuNode node{0, {OffCpuState::kPreempted, OffCpuState::kUnknown}};
  std::vector<Event> out;
  out.reserve(1 << 16);
  for (auto _ : state) {
    OffCpuSpanBuilder b(node);
    size_t n = 0;
    for (const auto& e : ev) {
      b.add(e, out);
      n += out.size();
      out.clear();
    }
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
}
BENCHMARK(BM_OpOffCpuSpans)->Unit(benchmark::kMillisecond);

// Off-CPU spans buffered by tid, every CUDA/driver call probed against them, eviction at the
// moving watermark: the join the cpu_contention rule runs.
void BM_OpIntervalJoin(benchmark::State& state) {
  const auto& ev = trace();
  for (auto _ : state) {
    IntervalJoin j(JoinKind::kOverlap, 0);
    uint64_t overlap = 0, n = 0;
    for (const auto& e : ev) {
      if (e.source == Source::kHost && e.op == 1) {
        j.add_right(e.tid, e);
      } else if (is_gpu_api(e.source)) {
        overlap += j.probe(e.tid, e.ts_ns, e.end_ns()).overlap_ns;
      }
      if (++n % 4096 == 0) j.evict(e.ts_ns, 2'000'000'000ull);
    }
    benchmark::DoNotOptimize(overlap);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
}
BENCHMARK(BM_OpIntervalJoin)->Unit(benchmark::kMillisecond);

void BM_OpSynthGenerate(benchmark::State& state) {
  for (auto _ : state) {
    synth::LargeTraceGenerator g(1'000'000, 7);
    std::vector<Event> out;
    out.reserve(4096);
    while (g.next(out, 4096)) out.clear();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 1'000'000));
}
BENCHMARK(BM_OpSynthGenerate)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ingero
