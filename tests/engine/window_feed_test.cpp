// Shard::Impl::feed_events: the per-group loop that feeds window states (key masks, the
// direct-mapped state cache probed at the last-used entry first, the window index recomputed only
// when an event leaves the previous event's window). Two threads' calls interleave event by event
// and cross a tumbling-window boundary; every (pid, window) has its own slow-call duration, so a
// call fed to the wrong key or window changes a chain's p99. The expected chains are derived from
// the trace here, and must not depend on batch size or thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using namespace test;  // kT0, kUs, kMs, kWindow, make (tests/util/window_events.h)

// The slow-call duration of pid's calls in window w (distinct for every pair).
uint64_t slow_dur(uint32_t pid, int w) { return (pid == 10 ? 3 : 4) * kMs + static_cast<uint64_t>(w) * 2 * kMs; }

// Windows 0 and 1; in each, pids 10 and 20 take turns: 100 launches each, every 20th slow with
// the thread off CPU for 85% of it (a cpu_contention chain per pid and window).
std::vector<Event> interleaved_trace() {
  std::vector<Event> ev;
  uint64_t id = 1;
  for (int w = 0; w < 2; ++w) {
    uint64_t ts = kT0 + static_cast<uint64_t>(w) * kWindow + kMs;
    for (int i = 0; i < 100; ++i) {
      for (uint32_t pid : {10u, 20u}) {
        const bool slow = i % 20 == 7;
        const uint64_t dur = slow ? slow_dur(pid, w) : 20 * kUs;
        ev.push_back(make(Source::kCuda, op::kCudaLaunchKernel, pid, ts, dur, id++));
        if (slow) ev.push_back(make(Source::kHost, op::kSchedSwitch, pid, ts + 100 * kUs, dur * 85 / 100, id++));
        ts += 10 * kUs;
      }
      ts += 10 * kMs;
    }
  }
  return ev;
}

AnalysisResult analyse(const std::vector<Event>& ev, unsigned threads, size_t batch) {
  VectorSource src(ev, batch);
  EngineOptions o;
  o.threads = threads;
  std::vector<std::string> errors;
  auto r = run_plan(default_plan(), src, o, &errors);
  EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors.front());
  return r;
}

TEST(WindowFeed, InterleavedKeysAcrossWindowsReachTheirOwnStates) {
  const auto ev = interleaved_trace();
  for (unsigned threads : {1u, 2u}) {
    for (size_t batch : {1u, 3u, 64u, 4096u}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", batch " + std::to_string(batch));
      const auto r = analyse(ev, threads, batch);
      EXPECT_EQ(r.counters.events_in, ev.size());
      EXPECT_EQ(r.counters.late_events, 0u);
      // (pid, window index) -> p99 of its cpu_contention chain.
      std::map<std::pair<uint32_t, int>, uint64_t> p99;
      for (const auto& c : r.chains) {
        if (c.category != "cpu_contention") continue;
        EXPECT_EQ(c.p50_ns, 20 * kUs) << c.id;
        ASSERT_GE(c.window_start, kT0) << c.id;
        p99[{c.pid, static_cast<int>((c.window_start - kT0) / kWindow)}] = c.p99_ns;
      }
      std::map<std::pair<uint32_t, int>, uint64_t> want;
      for (uint32_t pid : {10u, 20u})
        for (int w = 0; w < 2; ++w) want[{pid, w}] = slow_dur(pid, w);
      EXPECT_EQ(p99, want);
      // Per-op statistics see every launch once.
      const auto launches = std::find_if(r.ops.begin(), r.ops.end(), [](const OpStats& o) {
        return o.source == Source::kCuda && o.op == op::kCudaLaunchKernel;
      });
      ASSERT_NE(launches, r.ops.end());
      EXPECT_EQ(launches->count, 400u);
    }
  }
}

}  // namespace
}  // namespace ingero
