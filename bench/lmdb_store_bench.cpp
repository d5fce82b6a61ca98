// The LMDB event log: write throughput (chunked, batched transactions, no fsync per commit as in
// `convert`) and replay throughput (decode + checksum + merge, what `bench --replay-only` does).
// Run: ./build/ingero-bench --benchmark_filter='BM_Lmdb'
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "model/synth.h"
#include "sinks/store/lmdb_store.h"

namespace ingero {
namespace {

std::string bench_path(const char* name) {
  return (std::filesystem::temp_directory_path() / ("ip-bench-" + std::to_string(::getpid()) + "-" + name)).string();
}

const std::vector<Event>& trace() {
  static const std::vector<Event> events = synth::make_large_trace(2'000'000, 3);
  return events;
}

void BM_LmdbWrite(benchmark::State& state) {
  const auto& ev = trace();
  const std::string path = bench_path("write.lmdb");
  for (auto _ : state) {
    std::string err;
    LmdbSink::Options o;
    o.durable = state.range(0) != 0;
    auto sink = LmdbSink::create(path, err, o);
    if (!sink) {
      state.SkipWithError(err.c_str());
      break;
    }
    for (size_t i = 0; i < ev.size(); i += 4096)
      sink->write_events(std::span(ev).subspan(i, std::min<size_t>(4096, ev.size() - i)));
    sink->close(err);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ev.size() * sizeof(Event)));
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-lock");
}
BENCHMARK(BM_LmdbWrite)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LmdbReplay(benchmark::State& state) {
  const auto& ev = trace();
  const std::string path = bench_path("replay.lmdb");
  {
    std::string err;
    LmdbSink::Options o;
    o.durable = false;
    auto sink = LmdbSink::create(path, err, o);
    sink->write_events(ev);
    sink->close(err);
  }
  LmdbReadOptions ro;
  ro.verify_checksums = state.range(0) != 0;
  for (auto _ : state) {
    std::string err;
    auto src = open_lmdb_trace(path, err, ro);
    if (!src) {
      state.SkipWithError(err.c_str());
      break;
    }
    Batch b;
    uint64_t n = 0;
    while (src->next(b)) n += b.events.size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ev.size()));
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-lock");
}
BENCHMARK(BM_LmdbReplay)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ingero
