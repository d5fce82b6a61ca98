// Cost of stamping ranks on live batches (sinks/fleet/process_identity.h): what `trace` adds per event
// between the live source and the engine. The identities come from a fake /proc (one environ
// file per pid, written once); after the first event of each pid the cost is one hash lookup.
// Arg: distinct pids in the stream.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "sinks/fleet/process_identity.h"

namespace {

namespace fs = std::filesystem;

void BM_IdentityStamp(benchmark::State& state) {
  const uint32_t pids = static_cast<uint32_t>(state.range(0));
  const fs::path proc = fs::temp_directory_path() / ("ip_identity_bench_" + std::to_string(::getpid()));
  for (uint32_t p = 1; p <= pids; ++p) {
    fs::create_directories(proc / std::to_string(p));
    const std::string env = "PATH=/usr/bin\0RANK=" + std::to_string(p % 64) + std::string("\0WORLD_SIZE=64\0", 15);
    std::ofstream(proc / std::to_string(p) / "environ", std::ios::binary) << env;
  }
  ingero::Batch batch;
  batch.events.resize(4096);
  for (size_t i = 0; i < batch.events.size(); ++i) {
    batch.events[i].pid = 1 + static_cast<uint32_t>(i % pids);
    batch.events[i].source = ingero::Source::kCuda;
  }
  ingero::ProcessIdentityCache cache(proc.string());
  for (auto _ : state) {
    for (auto& e : batch.events) e.rank = -1;
    cache.stamp(batch);
    benchmark::DoNotOptimize(batch.events.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(batch.events.size()));
  std::error_code ec;
  fs::remove_all(proc, ec);
}
BENCHMARK(BM_IdentityStamp)->Arg(1)->Arg(8)->Arg(512);

}  // namespace
