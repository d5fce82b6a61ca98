// SQLite store throughput: the sink's insert rate and the replay reader's load rate.
// Figures are quoted in docs/storage.md with the command that produced them.
#include <benchmark/benchmark.h>
#include <cstdlib>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "model/ops.h"
#include "sinks/store/spooling_writer.h"
#include "sinks/store/sqlite_store.h"

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

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ip-sqlite-bench-XXXXXX").string();
  return mkdtemp(tmpl.data()) ? tmpl : std::string();
}

// One sink run per iteration: create, meta, every event, close. close_ms is close() alone (with
// deferred indexes that is the index build); the CPU column is this thread's, i.e. the cost an
// inline sink puts on the engine thread.
void run_sink(benchmark::State& state, const SqliteSink::Options& options) {
  const auto events = make_events(static_cast<size_t>(state.range(0)));
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.db";
  double close_s = 0, close_cpu_s = 0, insert_cpu_s = 0;
  for (auto _ : state) {
    std::string error;
    const double c0 = thread_cpu_s();
    auto sink = SqliteSink::create(path, error, options);
    if (!sink || !sink->write_meta(TraceMeta{}) || !sink->write_events(events)) {
      state.SkipWithError(error.c_str());
      break;
    }
    const double c1 = thread_cpu_s();
    const auto t0 = std::chrono::steady_clock::now();
    if (!sink->close(error)) {
      state.SkipWithError(error.c_str());
      break;
    }
    close_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    close_cpu_s += thread_cpu_s() - c1;
    insert_cpu_s += c1 - c0;
  }
  const double iters = static_cast<double>(std::max<int64_t>(state.iterations(), 1));
  state.SetItemsProcessed(state.iterations() * state.range(0));
  // insert_cpu_us: this thread's CPU per event for create + meta + every insert (what an inline
  // sink costs the engine thread); close_*: close() alone (with deferred indexes, the build).
  state.counters["insert_cpu_us"] = insert_cpu_s * 1e6 / iters / static_cast<double>(state.range(0));
  state.counters["close_ms"] = close_s * 1e3 / iters;
  state.counters["close_cpu_ms"] = close_cpu_s * 1e3 / iters;
  state.counters["bytes_per_event"] = static_cast<double>(std::filesystem::file_size(path)) /
                                      static_cast<double>(state.range(0));
  std::filesystem::remove_all(dir);
}

// The default options (deferred indexes, 16 KiB pages).
void BM_SqliteSinkWrite(benchmark::State& state) { run_sink(state, SqliteSink::Options{}); }
BENCHMARK(BM_SqliteSinkWrite)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();

// Args: events, defer_indexes (0/1), page_size: what each choice costs on its own.
void BM_SqliteSinkWriteOptions(benchmark::State& state) {
  SqliteSink::Options o;
  o.defer_indexes = state.range(1) != 0;
  o.page_size = static_cast<int>(state.range(2));
  run_sink(state, o);
}
BENCHMARK(BM_SqliteSinkWriteOptions)
    ->ArgNames({"events", "defer", "page"})
    ->Args({1'000'000, 0, 4096})
    ->Args({1'000'000, 1, 4096})
    ->Args({1'000'000, 0, 16384})
    ->Args({1'000'000, 1, 16384})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The spooling writer as a live capture uses it: the producer (engine thread) hands batches of
// 4096 events to SpoolingWriter::write_events; the writer thread stores them. Args: events,
// producer rate in events/s (0 = as fast as the producer can go, the worst case for the FIFO
// and the spill). Events are generated per batch (no big input vector), so maxrss_mb is the
// process's peak resident memory with the writer (run this benchmark alone for that figure).
// producer_cpu_us: the engine thread's CPU per event in write_events; writer_cpu_us: the writer
// thread's (all other threads of the process, i.e. SQLite inserts); finish_ms: draining what is
// left plus the index build (on the calling thread); lost must be 0.
void BM_SpoolingWriter(benchmark::State& state) {
  const size_t total = static_cast<size_t>(state.range(0));
  const double rate = static_cast<double>(state.range(1));
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.db";
  constexpr size_t kBatch = 4096;
  auto batch = make_events(kBatch);
  SpoolingWriter::Stats last;
  double producer_cpu_s = 0, finish_s = 0, max_backlog = 0, writer_cpu_s = 0;
  for (auto _ : state) {
    const double p0 = process_cpu_s(), m0 = thread_cpu_s();
    std::string error;
    auto sink = SqliteSink::create(path, error);
    auto w = sink ? SpoolingWriter::start(std::move(sink), SpoolingWriter::Options{}, error) : nullptr;
    if (!w) {
      state.SkipWithError(error.c_str());
      break;
    }
    w->write_meta(TraceMeta{});
    const auto t0 = std::chrono::steady_clock::now();
    double cpu = 0;
    for (size_t sent = 0; sent < total; sent += kBatch) {
      if (rate > 0) {
        const auto due = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(static_cast<double>(sent) / rate));
        std::this_thread::sleep_until(due);
      }
      for (size_t i = 0; i < kBatch; ++i) {
        batch[i].id = sent + i + 1;
        batch[i].ts_ns = 1'760'000'000'000'000'000ull + (sent + i) * 5'000;
      }
      const size_t n = std::min(kBatch, total - sent);
      const double c0 = thread_cpu_s();
      w->write_events(std::span(batch).first(n));
      cpu += thread_cpu_s() - c0;
      max_backlog = std::max(max_backlog, static_cast<double>(w->stats().backlog));
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (!w->finish(nullptr, error)) {
      state.SkipWithError(error.c_str());
      break;
    }
    finish_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    producer_cpu_s += cpu;
    last = w->stats();
    w.reset();
    writer_cpu_s += (process_cpu_s() - p0) - (thread_cpu_s() - m0);
  }
  const double iters = static_cast<double>(std::max<int64_t>(state.iterations(), 1));
  state.SetItemsProcessed(state.iterations() * state.range(0));
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  state.counters["producer_cpu_us"] = producer_cpu_s * 1e6 / iters / static_cast<double>(total);
  state.counters["writer_cpu_us"] = writer_cpu_s * 1e6 / iters / static_cast<double>(total);
  state.counters["finish_ms"] = finish_s * 1e3 / iters;
  state.counters["spilled"] = static_cast<double>(last.events_spilled);
  state.counters["mem_peak_mb"] = static_cast<double>(last.memory_bytes_peak) / (1 << 20);
  state.counters["spill_peak_mb"] = static_cast<double>(last.spill_bytes_peak) / (1 << 20);
  state.counters["max_backlog"] = max_backlog;
  state.counters["lost"] = static_cast<double>(last.lost);
  state.counters["maxrss_mb"] = static_cast<double>(ru.ru_maxrss) / 1024;
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SpoolingWriter)
    ->ArgNames({"events", "rate"})
    ->Args({1'000'000, 0})
    ->Args({1'000'000, 200'000})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The whole target: 60 s of capture at 200k events/s (12M events) then finish(). About 90 s,
// so only registered when INGERO_BENCH_LONG=1 is set.
[[maybe_unused]] const bool kLongRegistered = [] {
  if (const char* v = std::getenv("INGERO_BENCH_LONG"); v && std::string(v) == "1")
    benchmark::RegisterBenchmark("BM_SpoolingWriter", BM_SpoolingWriter)
        ->ArgNames({"events", "rate"})
        ->Args({12'000'000, 200'000})
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  return true;
}();

void BM_SqliteReplay(benchmark::State& state) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.db";
  {
    std::string error;
    auto sink = SqliteSink::create(path, error);
    if (!sink || !sink->write_events(make_events(static_cast<size_t>(state.range(0)))) || !sink->close(error)) {
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
