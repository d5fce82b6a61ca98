// The Prometheus exporter (sinks/metrics/prometheus_exporter.h): classic buckets are an exact
// collapse of the gamma = 2^(1/32) sketch, labels stay bounded, /metrics is served over HTTP.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/ops.h"
#include "sinks/metrics/prometheus_exporter.h"
#include "tests/sinks/metrics/e2e_util.h"

using namespace ingero;
using namespace ingero::metrics;

namespace {

Event call(Source s, uint8_t o, uint64_t dur, int16_t rank = 0, uint32_t pid = 100) {
  Event e;
  e.source = s;
  e.op = o;
  e.dur_ns = dur;
  e.rank = rank;
  e.pid = e.tid = pid;
  return e;
}

}  // namespace

TEST(Metrics, SketchIndexIsUpperInclusiveAtPowersOfTwo) {
  // 2^-10 s = 976562.5 ns is not an integer; 2^0 s = 1e9 ns is: exactly on a boundary.
  EXPECT_EQ(sketch_index(1'000'000'000), 0);
  EXPECT_EQ(sketch_index(1'000'000'001), 1);
  EXPECT_EQ(sketch_index(2'000'000'000), 32);
  EXPECT_EQ(sketch_index(500'000'000), -32);
}

TEST(Metrics, ClassicBucketsAreTheExactCountsAtPowersOfTwo) {
  MetricsState s({"n1", "c1", "host", "test"});
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> d(std::log(200e3), 2.0);
  std::vector<uint64_t> durs;
  std::vector<Event> ev;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t v = std::min<uint64_t>(static_cast<uint64_t>(d(rng)) + 1, 60'000'000'000ULL);
    durs.push_back(v);
    ev.push_back(call(Source::kCuda, op::kCudaLaunchKernel, v));
  }
  s.observe(ev, TraceMeta{});
  const auto b = s.classic_buckets("cudaLaunchKernel", "0");
  ASSERT_EQ(b.size(), static_cast<size_t>(kMaxPow2 - kMinPow2 + 2));
  for (int k = kMinPow2; k <= kMaxPow2; ++k) {
    const double le = std::ldexp(1.0, k);
    uint64_t exact = 0;
    for (auto v : durs) exact += static_cast<double>(v) * 1e-9 <= le;
    EXPECT_EQ(b[static_cast<size_t>(k - kMinPow2)], exact) << "le=2^" << k;
  }
  EXPECT_EQ(b.back(), durs.size());
}

TEST(Metrics, RendersBoundedSeries) {
  MetricsState s({"n1", "c1", "host", "test"});
  TraceMeta meta;
  std::vector<Event> ev;
  for (int r = 0; r < 40; ++r) {
    meta.process_names[1000 + r] = "python3 train.py";
    ev.push_back(call(Source::kCuda, op::kCudaStreamSync, 2'000'000, static_cast<int16_t>(r), 1000 + r));
    ev.push_back(call(Source::kNccl, op::kNcclAllReduce, 20'000, static_cast<int16_t>(r), 1000 + r));
  }
  s.observe(ev, meta);
  s.set_drops("ringbuf_full", 7);
  Chain c;
  c.id = "x:1";
  c.category = "cpu_contention";
  c.severity = Severity::kHigh;
  s.add_chains(std::span<const Chain>(&c, 1));
  s.add_chains(std::span<const Chain>(&c, 1));  // the same chain again: counted once
  const std::string text = s.render();
  EXPECT_NE(text.find("gpustall_op_latency_seconds_bucket{op=\"cudaStreamSync\",rank=\"3\",le=\"0.00390625\"} 1"),
            std::string::npos)
      << text.substr(0, 2000);
  EXPECT_NE(text.find("gpustall_events_dropped_total{reason=\"ringbuf_full\"} 7"), std::string::npos);
  EXPECT_NE(text.find("gpustall_chains_total{category=\"cpu_contention\",severity=\"high\"} 1"), std::string::npos);
  EXPECT_NE(text.find("gpustall_sync_wait_seconds_total{rank=\"0\"} 0.002"), std::string::npos);
  EXPECT_NE(text.find("target_info{cluster=\"c1\",node=\"n1\",hostname=\"host\"} 1"), std::string::npos);
  // 40 ranks: the first 16 keep their number, the rest share rank="other".
  EXPECT_NE(text.find("rank=\"other\""), std::string::npos);
  EXPECT_EQ(text.find("rank=\"20\""), std::string::npos);
  // pid and comm only in the info series.
  EXPECT_NE(text.find("gpustall_rank_info{rank=\"0\",pid=\"1000\",comm=\"python3 train.py\"} 1"), std::string::npos);
  EXPECT_EQ(text.find("gpustall_op_latency_seconds_count{pid"), std::string::npos);
}

TEST(Metrics, ServesMetricsOnLoopback) {
  std::string error;
  auto ex = MetricsExporter::start("127.0.0.1:0", {"n1", "c1", "host", "test"}, error);
  ASSERT_TRUE(ex) << error;
  ASSERT_GT(ex->port(), 0);
  std::vector<Event> ev{call(Source::kCuda, op::kCudaLaunchKernel, 5'000)};
  ex->state().observe(ev, TraceMeta{});
  const auto body = ingero::test::http_get_response(ex->port(), "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body.substr(0, 200);
  EXPECT_NE(body.find("gpustall_op_latency_seconds_count{op=\"cudaLaunchKernel\",rank=\"0\"} 1"), std::string::npos);
  // A busy address is an error, not an exception.
  auto second = MetricsExporter::start("127.0.0.1:" + std::to_string(ex->port()), {}, error);
  EXPECT_FALSE(second);
  EXPECT_NE(error.find("--metrics-addr"), std::string::npos) << error;
}

// ---- The per-step straggler signal (sinks/metrics/step_waits.h).
namespace {

// One rank's step k: compute until `arrive`, enqueue the all-reduce, block until `done`.
void add_step(std::vector<Event>& out, int16_t rank, uint64_t arrive, uint64_t done, int64_t clock_off = 0,
              uint64_t comm = 0xC0) {
  Event c = call(Source::kNccl, op::kNcclAllReduce, 15'000, rank, 100 + static_cast<uint32_t>(rank));
  c.ts_ns = static_cast<uint64_t>(static_cast<int64_t>(arrive) + clock_off);
  c.arg1 = comm;
  out.push_back(c);
  Event w = call(Source::kCuda, op::kCudaStreamSync, 0, rank, 100 + static_cast<uint32_t>(rank));
  w.ts_ns = c.ts_ns + 20'000;
  w.dur_ns = done > arrive + 20'000 ? done - arrive - 20'000 : 1'000;
  out.push_back(w);
}

}  // namespace

TEST(StepWaits, MediansOverTheLast20StepsOnlyOnceThereAre20) {
  StepWaitTracker t;
  constexpr uint64_t kStep = 50'000'000;
  for (uint64_t k = 0; k < 20; ++k) {
    std::vector<Event> ev;
    add_step(ev, 0, 1'000'000'000 + k * kStep + 20'000'000, 1'000'000'000 + k * kStep + 30'000'000);
    for (const auto& e : ev) t.add(e);
  }
  auto r = t.ranks();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps, 20u);
  EXPECT_FALSE(r[0].ready);  // 20 sync points = 19 steps
  std::vector<Event> ev;
  add_step(ev, 0, 1'000'000'000 + 20 * kStep + 20'000'000, 1'000'000'000 + 20 * kStep + 30'000'000);
  for (const auto& e : ev) t.add(e);
  r = t.ranks();
  ASSERT_TRUE(r[0].ready);
  EXPECT_EQ(r[0].median_wait_ns, 10'000'000);
  EXPECT_EQ(r[0].median_step_ns, static_cast<int64_t>(kStep));
  EXPECT_NEAR(r[0].wait_s, 21 * 0.010, 1e-9);
  EXPECT_NEAR(r[0].step_s, 20 * 0.050, 1e-9);
}

TEST(StepWaits, TheRankThatArrivesLastWaitsLeastByItsLagWhateverItsClock) {
  // 4 ranks; rank 2 arrives 3 ms after the others from step 30 on; every collective completes
  // 2 ms after the last arrival. Rank 2's clock is 400 ms ahead, rank 3's 250 ms behind.
  StepWaitTracker t;
  constexpr uint64_t kStep = 50'000'000, kT0 = 5'000'000'000;
  const int64_t off[4] = {0, 0, 400'000'000, -250'000'000};
  for (uint64_t k = 0; k < 60; ++k) {
    uint64_t arrive[4];
    for (int r = 0; r < 4; ++r) arrive[r] = kT0 + k * kStep + 20'000'000 + static_cast<uint64_t>(r) * 50'000;
    if (k >= 30) arrive[2] += 3'000'000;
    const uint64_t done = *std::max_element(arrive, arrive + 4) + 2'000'000;
    std::vector<Event> ev;
    for (int r = 0; r < 4; ++r) add_step(ev, static_cast<int16_t>(r), arrive[r], done, off[r]);
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    for (const auto& e : ev) t.add(e);
    if (k == 29) {  // balanced so far: waits within the 150 us arrival spread
      const auto r = t.ranks();
      for (const auto& x : r) EXPECT_NEAR(static_cast<double>(x.median_wait_ns), 2.1e6, 0.1e6) << x.rank;
    }
  }
  const auto r = t.ranks();
  ASSERT_EQ(r.size(), 4u);
  for (const auto& x : r) {
    ASSERT_TRUE(x.ready);
    EXPECT_EQ(x.median_step_ns, static_cast<int64_t>(kStep)) << x.rank;
  }
  EXPECT_EQ(r[2].median_wait_ns, 2'000'000);  // arrives last: only the transfer
  for (int i : {0, 1, 3})                     // the others wait for it: ~3 ms more
    EXPECT_NEAR(static_cast<double>(r[i].median_wait_ns - r[2].median_wait_ns), 3.0e6, 0.16e6) << i;
}

TEST(StepWaits, ShortWaitsCountAndOnlyTheFirstWaitAfterTheLastCollectiveCloses) {
  StepWaitTracker t;
  std::vector<Event> ev;
  for (uint64_t k = 0; k < 30; ++k) {
    const uint64_t t0 = 1'000'000'000 + k * 10'000'000;
    Event first = call(Source::kNccl, op::kNcclAllReduce, 10'000);
    first.ts_ns = t0;
    ev.push_back(first);
    Event last = first;
    last.ts_ns = t0 + 1'000'000;  // the second bucket's all-reduce: the step's collective
    ev.push_back(last);
    Event w = call(Source::kCuda, op::kCudaStreamSync, 0);
    w.ts_ns = t0 + 1'020'000;
    w.dur_ns = 30'000;  // under merge's 100 us floor: still a wait at the collective
    ev.push_back(w);
    Event w2 = w;  // a second wait in the same step: not the collective's
    w2.ts_ns = t0 + 5'000'000;
    w2.dur_ns = 3'000'000;
    ev.push_back(w2);
  }
  for (const auto& e : ev) t.add(e);
  const auto r = t.ranks();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].steps, 30u);
  ASSERT_TRUE(r[0].ready);
  EXPECT_EQ(r[0].median_wait_ns, 50'000);
  EXPECT_EQ(r[0].median_step_ns, 10'000'000);
}

TEST(Metrics, StepSignalSeriesAreBoundedPerRank) {
  MetricsState s({"n1", "c1", "host", "test"});
  std::vector<Event> ev;
  for (uint64_t k = 0; k < 25; ++k)
    for (int16_t r = 0; r < 18; ++r)
      add_step(ev, r, 1'000'000'000 + k * 50'000'000 + 20'000'000, 1'000'000'000 + k * 50'000'000 + 30'000'000);
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  TraceMeta meta;
  s.observe(ev, meta);
  const std::string text = s.render();
  EXPECT_NE(text.find("gpustall_step_wait_median_seconds{rank=\"0\"} 0.01"), std::string::npos) << text;
  EXPECT_NE(text.find("gpustall_step_median_seconds{rank=\"15\"} 0.05"), std::string::npos) << text;
  EXPECT_NE(text.find("gpustall_step_syncs_total{rank=\"other\"} 50"), std::string::npos) << text;  // ranks 16, 17
  EXPECT_EQ(text.find("gpustall_step_wait_median_seconds{rank=\"other\"}"), std::string::npos) << text;
  size_t gauges = 0;
  for (size_t p = 0; (p = text.find("\ngpustall_step_wait_median_seconds{", p)) != std::string::npos; ++p) ++gauges;
  EXPECT_EQ(gauges, 16u);
}
