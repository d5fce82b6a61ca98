// SQLite store throughput: the sink's insert rate and the replay reader's load rate.
// Figures are quoted in docs/storage.md with the command that produced them.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "sinks/sqlite_store.h"

namespace {

using namespace ingero;

// A mix like a live capture: CUDA launches and syncs on a few threads, off-CPU spans between.
std::vector<Event> make_events(size_t n) {
  std::vector<Event> v(n);
  for (size_t i = 0; i < n; ++i) {
    Event& e = v[i];
    e.ts_ns = 1'760'000'000'000'000'000ull + i * 10'000;
    e.id = i + 1;
    e.pid = 4242;
    e.tid = 4242 + static_cast<uint32_t>(i % 4);
    if (i % 3 == 2) {
      e.source = Source::kHost;
      e.op = op::kSchedSwitch;
      e.dur_ns = 20'000 + i % 997;
      e.prev_state = OffCpuState::kPreempted;
    } else {
      e.source = Source::kCuda;
      e.op = i % 3 ? op::kCudaStreamSync : op::kCudaLaunchKernel;
      e.dur_ns = 5'000 + i % 1009;
      e.arg0 = 0x7f00'0000'0000ull + i;
    }
  }
  return v;
}

std::string temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ip-sqlite-bench-XXXXXX").string();
  return mkdtemp(tmpl.data()) ? tmpl : std::string();
}

void BM_SqliteSinkWrite(benchmark::State& state) {
  const auto events = make_events(static_cast<size_t>(state.range(0)));
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.db";
  for (auto _ : state) {
    std::string error;
    auto sink = SqliteSink::create(path, error);
    if (!sink || !sink->write_meta(TraceMeta{}) || !sink->write_events(events) || !sink->close(error)) {
      state.SkipWithError(error.c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["bytes_per_event"] =
      static_cast<double>(std::filesystem::file_size(path)) / static_cast<double>(state.range(0));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SqliteSinkWrite)->Arg(100'000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SqliteReplay(benchmark::State& state) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.db";
  {
    std::string error;
    auto sink = SqliteSink::create(path, error);
    if (!sink || !sink->write_events(make_events(static_cast<size_t>(state.range(0)))) ||
        !sink->close(error)) {
      state.SkipWithError(error.c_str());
      return;
    }
  }
  for (auto _ : state) {
    std::string error;
    auto src = open_sqlite_trace(path, error);
    if (!src) {
      state.SkipWithError(error.c_str());
      break;
    }
    Batch b;
    size_t n = 0;
    while (src->next(b)) n += b.events.size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SqliteReplay)->Arg(100'000)->Unit(benchmark::kMillisecond)->UseRealTime();

// The bundled sample (3,807 Ingero 0.8 rows plus side tables), as `stats` replays it.
void BM_SqliteReplaySample(benchmark::State& state) {
  const auto path = std::filesystem::path(__FILE__).parent_path().parent_path() / "samples" /
                    "pytorch-dataloader-starvation.db";
  for (auto _ : state) {
    std::string error;
    auto src = open_sqlite_trace(path.string(), error);
    if (!src) {
      state.SkipWithError(error.c_str());
      break;
    }
    Batch b;
    while (src->next(b)) benchmark::DoNotOptimize(b.events.data());
  }
  state.SetItemsProcessed(state.iterations() * 3807);
}
BENCHMARK(BM_SqliteReplaySample)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
