// Per-op statistics taken from window states (engine/runtime.cpp, Shard::Impl::stats_group): the
// rule pack's (pid, source, op) windows hold every CUDA/driver call's duration, so the shard
// gives the statistics only each such call's total and error count and merges each window's
// duration quantile in when it closes. Whatever the trace, every number must be what one
// OpStatsAccumulator fed every event gives (the reference below): across many windows whose
// exact samples add up past the exact limit (the merged state must turn into the same sketch),
// zero durations, durations past 2^32, events the windows refuse as late (their duration goes in
// directly), and durations of 2^53 ns or more (where the shard stops carrying, mid-trace), at
// 1 to 3 threads and batch sizes from 1 to 4096.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "operators/op_stats.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using namespace test;  // kT0, kUs, kMs, kWindow, make

// Delivers the given batches as they are (the events of each in the given order, its watermark
// the largest start delivered so far): a batch may hold events behind the watermark (late).
class ScriptedSource final : public EventSource {
 public:
  explicit ScriptedSource(std::vector<std::vector<Event>> batches) : batches_(std::move(batches)) {
    for (const auto& b : batches_)
      for (const auto& e : b) {
        meta_.first_ts = std::min(meta_.first_ts ? meta_.first_ts : e.ts_ns, e.ts_ns);
        meta_.last_ts = std::max(meta_.last_ts, e.end_ns());
      }
  }
  bool next(Batch& out) override {
    if (pos_ >= batches_.size()) return false;
    out.events = batches_[pos_];
    for (const auto& e : out.events) high_ = std::max(high_, e.ts_ns);
    out.seq = pos_;
    out.final = ++pos_ == batches_.size();
    out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : high_;
    return true;
  }
  TraceMeta& meta() override { return meta_; }

 private:
  std::vector<std::vector<Event>> batches_;
  size_t pos_ = 0;
  uint64_t high_ = 0;
  TraceMeta meta_;
};

struct Shape {
  uint64_t huge_at = 0;   // the event index from which one duration of 2^53 ns or more appears (0: none)
  bool late = false;      // replay some calls of the first window after it closed
  bool zeros = true;      // some zero durations
  uint32_t launches = 0;  // this many extra launches of one pid spread over windows (exact-limit crossing)
};

// A trace over four 10 s windows: 6 pids making launches, syncs and driver launches with random
// durations (a tail, some zeros, some past 2^32), their threads' off-CPU spans, and a few events of
// sources no window keeps (block I/O, TCP): in start order.
std::vector<Event> trace(uint32_t seed, const Shape& shape) {
  std::mt19937_64 rng(seed);
  std::vector<Event> ev;
  uint64_t id = 1;
  const uint8_t cuda_ops[] = {op::kCudaLaunchKernel, op::kCudaStreamSync};
  for (int i = 0; i < 6000; ++i) {
    const uint64_t ts = kT0 + static_cast<uint64_t>(i) * (4 * kWindow / 6000) + rng() % kUs;
    const auto pid = static_cast<uint32_t>(100 + rng() % 6);
    const unsigned kind = static_cast<unsigned>(rng() % 20);
    uint64_t dur = 5 * kUs + rng() % (200 * kUs);
    if (rng() % 50 == 0) dur = 2 * kMs + rng() % (40 * kMs);
    if (shape.zeros && rng() % 97 == 0) dur = 0;
    if (rng() % 301 == 0) dur = (uint64_t{1} << 32) + rng() % (uint64_t{1} << 34);
    Event e;
    if (kind < 12) e = make(Source::kCuda, cuda_ops[kind % 2], pid, ts, dur, id++);
    else if (kind < 16) e = make(Source::kDriver, op::kCuLaunchKernel, pid, ts, dur, id++);
    else if (kind < 18) e = make(Source::kHost, op::kSchedSwitch, pid, ts, dur, id++);
    else if (kind < 19) e = make(Source::kIo, 1, pid, ts, dur, id++);
    else e = make(Source::kTcp, 1, pid, ts, dur, id++);
    e.ret = rng() % 13 == 0 ? 1 : 0;
    ev.push_back(e);
  }
  // One pid's launches in bulk, spread over the four windows: each window's state stays exact
  // (under 65,536) while the op's total passes the statistics' exact limit.
  for (uint32_t i = 0; i < shape.launches; ++i) {
    const uint64_t ts = kT0 + static_cast<uint64_t>(i) * (4 * kWindow / shape.launches);
    ev.push_back(make(Source::kCuda, op::kCudaLaunchKernel, 300, ts, 1 + rng() % (3 * kMs), id++));
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  if (shape.huge_at && shape.huge_at < ev.size()) {
    Event& h = ev[shape.huge_at];
    h.source = Source::kCuda;
    h.op = op::kCudaLaunchKernel;
    h.dur_ns = (uint64_t{1} << 53) + 12345;
  }
  return ev;
}

// Batches of `n` events; with `late`, 40 calls of the first window are held back and delivered
// in the last batch, after every window before the last has closed.
std::vector<std::vector<Event>> batches_of(const std::vector<Event>& ev, size_t n, bool late) {
  std::vector<Event> on_time, held;
  for (const auto& e : ev) {
    const bool hold = late && held.size() < 40 && e.ts_ns < kT0 + kWindow / 2 && is_gpu_api(e.source) && e.id % 3 == 0;
    (hold ? held : on_time).push_back(e);
  }
  std::vector<std::vector<Event>> out;
  for (size_t i = 0; i < on_time.size(); i += n)
    out.emplace_back(on_time.begin() + static_cast<std::ptrdiff_t>(i),
                     on_time.begin() + static_cast<std::ptrdiff_t>(std::min(i + n, on_time.size())));
  if (!held.empty()) out.back().insert(out.back().end(), held.begin(), held.end());
  return out;
}

std::vector<OpStats> reference(const std::vector<Event>& ev) {
  OpStatsAccumulator acc;
  for (const auto& e : ev) acc.add(e);
  return acc.results();
}

void expect_same(const std::vector<OpStats>& got, const std::vector<OpStats>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("op " + std::to_string(static_cast<int>(want[i].source)) + "/" + std::to_string(want[i].op));
    EXPECT_EQ(got[i].source, want[i].source);
    EXPECT_EQ(got[i].op, want[i].op);
    EXPECT_EQ(got[i].count, want[i].count);
    EXPECT_EQ(got[i].p50_ns, want[i].p50_ns);
    EXPECT_EQ(got[i].p95_ns, want[i].p95_ns);
    EXPECT_EQ(got[i].p99_ns, want[i].p99_ns);
    EXPECT_EQ(got[i].min_ns, want[i].min_ns);
    EXPECT_EQ(got[i].max_ns, want[i].max_ns);
    EXPECT_EQ(got[i].total_ns, want[i].total_ns);
    EXPECT_EQ(got[i].errors, want[i].errors);
    EXPECT_EQ(got[i].exact, want[i].exact);
  }
}

void check(const std::vector<Event>& ev, const Shape& shape, uint64_t want_late) {
  const auto want = reference(ev);
  for (unsigned threads : {1u, 2u, 3u}) {
    for (size_t batch : {1u, 7u, 256u, 4096u}) {
      if (batch == 1 && ev.size() > 20000) continue;  // the bulk trace: one batch size fewer
      SCOPED_TRACE("threads " + std::to_string(threads) + ", batch " + std::to_string(batch));
      ScriptedSource src(batches_of(ev, batch, shape.late));
      EngineOptions o;
      o.threads = threads;
      std::vector<std::string> errors;
      const auto r = run_plan(default_plan(), src, o, &errors);
      ASSERT_TRUE(errors.empty()) << errors.front();
      ASSERT_EQ(r.counters.events_in, ev.size());
      // The pack's groups each refuse the held-back calls of the closed first window.
      if (want_late) EXPECT_GE(r.counters.late_events, want_late);
      else EXPECT_EQ(r.counters.late_events, 0u);
      expect_same(r.ops, want);
    }
  }
}

TEST(StatsFromWindows, RandomTracesMatchPerEventStatistics) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    check(trace(seed, {}), {}, 0);
  }
}

TEST(StatsFromWindows, ExactWindowsMergeIntoTheSketchPerEventAddsGive) {
  const auto ev = trace(4, {0, false, true, 90000});
  // The bulk pid's launches: over the exact limit in all, under it in every window.
  uint64_t bulk = 0;
  for (const auto& e : ev) bulk += e.pid == 300 ? 1 : 0;
  ASSERT_GT(bulk, 65536u);
  const auto want = reference(ev);
  bool sketch = false;
  for (const auto& s : want)
    sketch = sketch || (s.source == Source::kCuda && s.op == op::kCudaLaunchKernel && !s.exact);
  ASSERT_TRUE(sketch) << "the launches' statistics should be a sketch";
  check(ev, {0, false, true, 90000}, 0);
}

TEST(StatsFromWindows, LateCallsGiveTheirDurationsDirectly) {
  const Shape shape{0, true, true, 0};
  check(trace(5, shape), shape, 40);
}

TEST(StatsFromWindows, AHugeDurationMidTraceStopsCarryingWithNothingLostOrCountedTwice) {
  for (uint64_t at : {3u, 2500u, 5990u}) {
    SCOPED_TRACE("huge duration at event " + std::to_string(at));
    const Shape shape{at, false, true, 0};
    check(trace(6, shape), shape, 0);
  }
  const Shape both{3100, true, false, 0};
  check(trace(7, both), both, 40);
}

}  // namespace
}  // namespace ingero
