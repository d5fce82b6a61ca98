// Shard::Impl::feed_events' window-state cache (two-entry sets, engine/runtime.cpp) under
// pressure: 700 or 2,200 processes take turns call by call, more keys than the cache has sets, so
// sets are shared and entries evicted and re-added all the time, and every process also makes
// syncs (a second key per process that differs only in the op) and crosses a tumbling-window
// boundary. Every (pid, window) has its own slow-call duration and every pid's syncs their own
// long duration, so a call fed to another key's or window's state changes a chain's p50, p99 or
// call count.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using namespace test;  // kT0, kUs, kMs, kWindow, make (tests/util/window_events.h)

// Process i's pid: 1, 2, 3, ... or, scattered, spread over 32 bits (consecutive pids spread
// evenly over the cache's sets; scattered ones share sets by chance, as real pids do).
uint32_t pid_of(uint32_t i, bool scattered) { return scattered ? (i * 2654435761u) ^ 0x5bd1e995u : i; }
uint64_t slow_dur(uint32_t i, int w) { return 3 * kMs + uint64_t{i} * 2 * kUs + static_cast<uint64_t>(w) * 5 * kMs; }
uint64_t sync_dur(uint32_t i) { return 40 * kMs + uint64_t{i} * kUs; }

// Windows 0 and 1; in each, every pid makes 40 launches (the 20th slow, with the thread off CPU
// for 85% of it) and 4 syncs, the pids taking turns call by call.
std::vector<Event> busy_trace(uint32_t pids, bool scattered) {
  std::vector<Event> ev;
  uint64_t id = 1;
  for (int w = 0; w < 2; ++w) {
    uint64_t ts = kT0 + static_cast<uint64_t>(w) * kWindow + kMs;
    for (int i = 0; i < 40; ++i) {
      for (uint32_t n = 1; n <= pids; ++n) {
        const uint32_t pid = pid_of(n, scattered);
        const bool slow = i == 20;
        const uint64_t dur = slow ? slow_dur(n, w) : 20 * kUs;
        ev.push_back(make(Source::kCuda, op::kCudaLaunchKernel, pid, ts, dur, id++));
        if (slow) ev.push_back(make(Source::kHost, op::kSchedSwitch, pid, ts + 100 * kUs, dur * 85 / 100, id++));
        if (i % 10 == 5) ev.push_back(make(Source::kCuda, op::kCudaStreamSync, pid, ts + 1, sync_dur(n), id++));
        ts += 2 * kUs;
      }
      ts += 100 * kMs;
    }
  }
  return ev;
}

// 700 pids: far more keys than cache entries (constant eviction). 60 scattered pids: some keys
// share a set and stay in its second entry while the window changes (a hit must check the
// window too); the 4096-event batch holds both windows, so the first window is still open then.
TEST(WindowCache, ManyInterleavedKeysReachTheirOwnStates) {
  // 700 processes fill fewer sets than the cache has before the first window closes (the sets
  // filled are emptied one by one); 2,200 fill more (the whole cache is emptied) and have more
  // keys than the cache has entries.
  for (const auto& [pids, scattered] : {std::pair{700u, false}, std::pair{2200u, false}, std::pair{60u, true}}) {
    const auto ev = busy_trace(pids, scattered);
    for (unsigned threads : {1u, 2u}) {
      // Batches of 7 split the cache's work most finely; the 2,200-process trace (seconds at 7)
      // takes 4,096 only.
      for (size_t batch : {pids > 1000 ? 4096u : 7u, 4096u}) {
        SCOPED_TRACE("pids " + std::to_string(pids) + (scattered ? " scattered" : "") + ", threads " +
                     std::to_string(threads) + ", batch " + std::to_string(batch));
        VectorSource src(ev, batch);
        EngineOptions o;
        o.threads = threads;
        std::vector<std::string> errors;
        const auto r = run_plan(default_plan(), src, o, &errors);
        ASSERT_TRUE(errors.empty()) << errors.front();
        EXPECT_EQ(r.counters.events_in, ev.size());
        EXPECT_EQ(r.counters.late_events, 0u);
        // (pid, window index) -> p99 of its launches' cpu_contention chain.
        std::map<std::pair<uint32_t, int>, uint64_t> p99;
        for (const auto& c : r.chains) {
          if (c.category != "cpu_contention" || c.op != op::kCudaLaunchKernel) continue;
          EXPECT_EQ(c.p50_ns, 20 * kUs) << c.id;
          // A fast call fed to another key's or window's state leaves p50 and p99 alone but not
          // the count: each (pid, window) has exactly 40 launches.
          double n = -1;
          for (const auto& [name, v] : c.values)
            if (name == "n") n = v;
          EXPECT_EQ(n, 40) << c.id;
          ASSERT_GE(c.window_start, kT0) << c.id;
          p99[{c.pid, static_cast<int>((c.window_start - kT0) / kWindow)}] = c.p99_ns;
        }
        std::map<std::pair<uint32_t, int>, uint64_t> want;
        for (uint32_t n = 1; n <= pids; ++n)
          for (int w = 0; w < 2; ++w) want[{pid_of(n, scattered), w}] = slow_dur(n, w);
        EXPECT_EQ(p99, want);
      }
    }
  }
}

}  // namespace
}  // namespace ingero
