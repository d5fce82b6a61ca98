// The time accounting observer (operators/time_accounting.h) over a recorded trace held in memory:
// its cost beside the rule pack's run phase on the same trace (`ingero-pipeline bench --db`).
//   INGERO_BENCH_TRACE=/tmp/big5m.db ./build/ingero-bench --benchmark_filter=TimeAccounting
// Without INGERO_BENCH_TRACE: bench/make_ingero_trace.sh's shape, synthesised (1M events: 90 %
// calls of 12 pids, 10 % sched_switch spans).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/ops.h"
#include "operators/time_accounting.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {
namespace {

struct Loaded {
  std::vector<std::vector<Event>> batches;
  TraceMeta meta;
  size_t events = 0;
};

const Loaded& trace() {
  static const Loaded l = [] {
    Loaded out;
    const char* path = std::getenv("INGERO_BENCH_TRACE");
    if (path && *path) {
      std::string error;
      auto src = open_sqlite_trace(path, error);
      if (!src) std::abort();
      Batch b;
      while (src->next(b)) {
        out.events += b.view().size();
        out.batches.push_back(b.view());
      }
      out.meta = src->meta();
      return out;
    }
    std::mt19937_64 rng(42);
    std::vector<Event> v;
    uint64_t ts = 1'700'000'000'000'000'000ull;
    for (int i = 0; i < 1'000'000; ++i) {
      ts += 1000 + rng() % 4000;
      Event e;
      e.ts_ns = ts;
      e.pid = e.tid = 1000 + static_cast<uint32_t>(rng() % 12);
      if (rng() % 10 == 0) {
        e.source = Source::kHost;
        e.op = op::kSchedSwitch;
        e.dur_ns = rng() % 3'000'000;
      } else {
        const uint8_t ops[] = {op::kCudaLaunchKernel, op::kCudaStreamSync, op::kCuLaunchKernel};
        const uint8_t o = ops[rng() % 3];
        e.source = o == op::kCuLaunchKernel ? Source::kDriver : Source::kCuda;
        e.op = o;
        e.dur_ns = 2000 + rng() % 100'000;
      }
      v.push_back(e);
    }
    for (size_t i = 0; i < v.size(); i += 4096)
      out.batches.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(i),
                               v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), i + 4096)));
    out.events = v.size();
    return out;
  }();
  return l;
}

void BM_TimeAccounting(benchmark::State& state) {
  const Loaded& l = trace();
  size_t threads = 0;
  for (auto _ : state) {
    TimeAccounting acc;
    for (const auto& b : l.batches) acc.observe(b.data(), b.size());
    AnalysisResult r;
    acc.finish(l.meta, r);
    threads = r.accounting.size();
    benchmark::DoNotOptimize(r.accounting.data());
  }
  state.counters["events"] = static_cast<double>(l.events);
  state.counters["threads"] = static_cast<double>(threads);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * l.events));
}
BENCHMARK(BM_TimeAccounting)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ingero
