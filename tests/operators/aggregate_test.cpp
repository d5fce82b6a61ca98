#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/expr.h"
#include "operators/aggregate.h"
#include "operators/count_rate.h"

namespace ingero {
namespace {

AggregateNode node() {
  AggregateNode n;
  n.aggs = {{"n", AggKind::kCount, Field::kDuration, 0},        {"sum", AggKind::kSum, Field::kDuration, 0},
            {"min", AggKind::kMin, Field::kDuration, 0},        {"max", AggKind::kMax, Field::kDuration, 0},
            {"mean", AggKind::kMean, Field::kDuration, 0},      {"rate", AggKind::kRate, Field::kDuration, 0},
            {"p50", AggKind::kQuantile, Field::kDuration, 0.5}, {"bytes", AggKind::kSum, Field::kArg0, 0}};
  return n;
}

TEST(Aggregate, AllKinds) {
  AggregateLayout layout(node());
  AggregateState s(&layout);
  for (uint64_t d : {10u, 20u, 30u, 40u}) {
    Event e;
    e.ts_ns = d;
    e.dur_ns = d;
    e.arg0 = 1000;
    s.add(e);
  }
  double v[8];
  s.values(2'000'000'000, v);  // a 2 s window
  EXPECT_EQ(v[0], 4);
  EXPECT_EQ(v[1], 100);
  EXPECT_EQ(v[2], 10);
  EXPECT_EQ(v[3], 40);
  EXPECT_EQ(v[4], 25);
  EXPECT_EQ(v[5], 2);  // 4 events / 2 s
  EXPECT_EQ(v[6], 20);
  EXPECT_EQ(v[7], 4000);
}

TEST(Aggregate, EmptyGivesNaNNotZeroDivision) {
  AggregateLayout layout(node());
  AggregateState s(&layout);
  double v[8];
  s.values(0, v);
  EXPECT_EQ(v[0], 0);
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_TRUE(std::isnan(v[4]));
  EXPECT_TRUE(std::isnan(v[5]));  // whole-trace window with no span
  EXPECT_TRUE(std::isnan(v[6]));
}

TEST(Aggregate, MergeOfPartials) {
  AggregateLayout layout(node());
  AggregateState a(&layout), b(&layout), all(&layout);
  for (uint64_t i = 1; i <= 9; ++i) {
    Event e;
    e.ts_ns = i;
    e.dur_ns = i * 3;
    (i % 2 ? a : b).add(e);
    all.add(e);
  }
  a.merge(b);
  double x[8], y[8];
  a.values(10, x);
  all.values(10, y);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(x[i], y[i]) << i;
}

// Randomized: every layout shape (count only, duration stats, duration quantiles, both, and the
// general loop over mixed fields) against a straightforward reference computed here from the
// events, and merge() of random partitions against one state over all the events.
double reference_value(const AggSpec& spec, const std::vector<Event>& ev, uint64_t window_ns) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (spec.kind == AggKind::kCount) return static_cast<double>(ev.size());
  if (spec.kind == AggKind::kRate) {
    uint64_t first = UINT64_MAX, last = 0;
    for (const auto& e : ev) first = std::min(first, e.ts_ns), last = std::max(last, e.end_ns());
    const uint64_t span = window_ns ? window_ns : (last > first ? last - first : 0);
    return span ? static_cast<double>(ev.size()) * 1e9 / static_cast<double>(span) : nan;
  }
  if (ev.empty()) return spec.kind == AggKind::kSum ? 0 : nan;
  std::vector<double> v;
  v.reserve(ev.size());
  for (const auto& e : ev) v.push_back(read_field(e, spec.field));
  double sum = 0;
  for (double x : v) sum += x;
  switch (spec.kind) {
    case AggKind::kSum: return sum;
    case AggKind::kMin: return *std::min_element(v.begin(), v.end());
    case AggKind::kMax: return *std::max_element(v.begin(), v.end());
    case AggKind::kMean: return sum / static_cast<double>(v.size());
    case AggKind::kQuantile: {
      std::vector<uint64_t> u;
      u.reserve(v.size());
      for (double x : v) u.push_back(x > 0 ? (x < 18446744073709551616.0 ? static_cast<uint64_t>(x) : UINT64_MAX) : 0);
      std::sort(u.begin(), u.end());
      const double ek = spec.q * static_cast<double>(u.size());
      auto k = static_cast<size_t>(std::ceil(ek));
      if (std::fabs(ek - std::round(ek)) < 1e-9) k = static_cast<size_t>(std::llround(ek));
      k = std::clamp<size_t>(k, 1, u.size());
      return static_cast<double>(u[k - 1]);
    }
    default: return nan;
  }
}

Event random_event(std::mt19937_64& rng) {
  Event e;
  e.ts_ns = 1'000'000'000 + rng() % 5'000'000'000;
  switch (rng() % 8) {
    case 0: e.dur_ns = 0; break;
    case 1: e.dur_ns = (uint64_t{1} << 32) - 2 + rng() % 4; break;  // around 2^32
    case 2: e.dur_ns = (uint64_t{1} << 53) + rng() % 5; break;      // where a double rounds
    case 3: e.dur_ns = rng() % 2 ? UINT64_MAX : uint64_t{1} << 63; break;
    default: e.dur_ns = 2000 + rng() % 100000; break;
  }
  e.arg0 = rng() % 4 ? rng() % 1'000'000 : rng();
  e.ret = static_cast<int32_t>(rng() % 5) - 2;  // negative values go to a quantile as 0
  e.pid = static_cast<uint32_t>(rng() % 100);
  return e;
}

void expect_row(const double* got, const double* want, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << what << " spec " << i;
    else EXPECT_EQ(got[i], want[i]) << what << " spec " << i;
  }
}

TEST(Aggregate, RandomEventsEveryShapeAgainstReference) {
  using S = AggregateLayout::Shape;
  const auto spec = [](AggKind k, Field f = Field::kDuration, double q = 0.5) { return AggSpec{"x", k, f, q}; };
  struct Case {
    S shape;
    std::vector<AggSpec> aggs;
  };
  const std::vector<Case> cases = {
      {S::kCount, {spec(AggKind::kCount)}},
      {S::kCount, {spec(AggKind::kCount), spec(AggKind::kRate)}},
      {S::kDurStats, {spec(AggKind::kSum), spec(AggKind::kMax), spec(AggKind::kMean), spec(AggKind::kMin)}},
      {S::kDurQuantile, {spec(AggKind::kQuantile, Field::kDuration, 0.99), spec(AggKind::kCount)}},
      {S::kDurBoth,
       {spec(AggKind::kCount), spec(AggKind::kSum), spec(AggKind::kQuantile, Field::kDuration, 0.5),
        spec(AggKind::kQuantile, Field::kDuration, 0.95), spec(AggKind::kMax), spec(AggKind::kRate)}},
      {S::kGeneral,
       {spec(AggKind::kSum, Field::kArg0), spec(AggKind::kQuantile, Field::kDuration, 0.99),
        spec(AggKind::kMin, Field::kRet), spec(AggKind::kMax, Field::kDuration)}},
      {S::kGeneral,
       {spec(AggKind::kQuantile, Field::kRet, 0.5), spec(AggKind::kQuantile, Field::kArg0, 0.9),
        spec(AggKind::kMean, Field::kPid), spec(AggKind::kRate)}},
  };
  std::mt19937_64 rng(2024);
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int trial = 0; trial < 20; ++trial) {
      AggregateNode node;
      node.aggs = cases[c].aggs;
      node.exact_limit = 1u << 20;  // exact: the reference is nearest rank over the sorted values
      AggregateLayout layout(node);
      ASSERT_EQ(layout.shape(), cases[c].shape) << "case " << c;
      AggregateState all(&layout), a(&layout), b(&layout);
      std::vector<Event> ev;
      const int n = trial == 0 ? 0 : static_cast<int>(rng() % 3000);
      for (int i = 0; i < n; ++i) {
        ev.push_back(random_event(rng));
        all.add(ev.back());
        (rng() % 3 ? a : b).add(ev.back());
      }
      const size_t k = node.aggs.size();
      const std::string what = "case " + std::to_string(c) + " trial " + std::to_string(trial);
      for (uint64_t window : {uint64_t{0}, uint64_t{10'000'000'000}}) {
        std::vector<double> got(k), want(k), merged(k);
        for (size_t i = 0; i < k; ++i) want[i] = reference_value(node.aggs[i], ev, window);
        all.values(window, got.data());
        expect_row(got.data(), want.data(), k, what);
        AggregateState m = a;
        m.merge(b);
        m.values(window, merged.data());
        // Merged sums add partial sums (another rounding order): compare with the single state
        // only where the partition cannot matter.
        for (size_t i = 0; i < k; ++i)
          if (node.aggs[i].kind == AggKind::kSum || node.aggs[i].kind == AggKind::kMean) merged[i] = got[i];
        expect_row(merged.data(), got.data(), k, what + " merged");
      }
    }
  }
}

TEST(Aggregate, SketchModeQuantileEqualsAQuantileStateFedTheSameValues) {
  AggregateNode node;
  node.aggs = {{"p99", AggKind::kQuantile, Field::kDuration, 0.99}, {"p50", AggKind::kQuantile, Field::kDuration, 0.5}};
  node.exact_limit = 100;
  AggregateLayout layout(node);
  AggregateState s(&layout);
  QuantileState q(100, node.sketch_alpha);
  std::mt19937_64 rng(8);
  for (int i = 0; i < 5000; ++i) {
    const Event e = random_event(rng);
    s.add(e);
    q.add(AggregateState::quantile_input(static_cast<double>(e.dur_ns)));
  }
  ASSERT_FALSE(q.exact());
  double v[2];
  s.values(0, v);
  EXPECT_EQ(v[0], static_cast<double>(q.quantile(0.99)));
  EXPECT_EQ(v[1], static_cast<double>(q.quantile(0.5)));
}

TEST(CountRate, SaturatesAndHandlesZeroSpan) {
  CountRate c;
  c.count = UINT64_MAX;
  c.add(1, 1);
  EXPECT_EQ(c.count, UINT64_MAX);
  CountRate o;
  o.count = 10;
  c.merge(o);
  EXPECT_EQ(c.count, UINT64_MAX);
  CountRate z;
  z.add(5, 5);
  EXPECT_TRUE(std::isnan(z.rate(0)));
  EXPECT_EQ(sat_add(UINT64_MAX - 1, 5), UINT64_MAX);
}

// --- time(buckets), top_task(buckets), top_task_time(buckets) over accounting slices -------------

// A slice of a feeding thread's time (operators/time_accounting.h): op = its bucket, preempted
// ones name the task that ran instead (arg0 its pid when known, arg1 its tid).
Event slice_event(uint8_t bucket, uint64_t dur, uint64_t pid, uint64_t tid) {
  Event e;
  e.source = Source::kAccount;
  e.op = bucket;
  e.dur_ns = dur;
  e.arg0 = pid;
  e.arg1 = tid;
  return e;
}

uint32_t mask_of(std::initializer_list<uint8_t> buckets) {
  uint32_t m = 0;
  for (uint8_t b : buckets) m |= 1u << b;
  return m;
}

AggregateNode bucket_node() {
  AggregateNode n;
  const uint32_t calls = mask_of({1, 2, 3, 4, 5, 6}), blocked = mask_of({8, 9, 10, 11, 12});
  n.aggs = {{"pre", AggKind::kTime, Field::kDuration, 0, mask_of({0})},
            {"calls", AggKind::kTime, Field::kDuration, 0, calls},
            {"all", AggKind::kTime, Field::kDuration, 0, (1u << 14) - 1},
            {"by", AggKind::kTopTask, Field::kDuration, 0, mask_of({0})},
            {"by_t", AggKind::kTopTaskTime, Field::kDuration, 0, mask_of({0})},
            {"n", AggKind::kCount, Field::kDuration, 0, 0},
            {"blk", AggKind::kTime, Field::kDuration, 0, blocked},
            {"by_blk", AggKind::kTopTask, Field::kDuration, 0, blocked | mask_of({0})},
            {"by_blk_t", AggKind::kTopTaskTime, Field::kDuration, 0, blocked | mask_of({0})},
            {"sum", AggKind::kSum, Field::kDuration, 0, 0}};
  return n;
}

// The reference, in integers: the time of the slices whose bucket is in the mask; per task (arg0,
// else arg1; 0 is no task) the time, the top one the most, ties to the smaller id.
double reference_bucket_value(const AggSpec& spec, const std::vector<Event>& ev) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (spec.kind == AggKind::kCount) return static_cast<double>(ev.size());
  if (spec.kind == AggKind::kSum) {
    uint64_t s = 0;
    for (const auto& e : ev) s += e.dur_ns;
    return static_cast<double>(s);
  }
  uint64_t total = 0;
  std::map<uint64_t, uint64_t> by;
  for (const auto& e : ev) {
    if (e.op >= 32 || !(spec.buckets >> e.op & 1)) continue;
    total += e.dur_ns;
    const uint64_t task = e.arg0 ? e.arg0 : e.arg1;
    if (task) by[task] += e.dur_ns;
  }
  if (spec.kind == AggKind::kTime) return static_cast<double>(total);
  uint64_t best = 0, best_ns = 0;
  for (const auto& [task, ns] : by)  // ascending ids: a later one wins only with strictly more
    if (!best || ns > best_ns) best = task, best_ns = ns;
  if (spec.kind == AggKind::kTopTask) return best ? static_cast<double>(best) : nan;
  return static_cast<double>(best_ns);
}

// Random windows of slices, some with tasks tied on purpose (the same total in different pieces),
// against the reference; in any order; and split into three states and merged.
TEST(AggregateBuckets, TimeAndTopTaskAgainstReferenceInAnyOrderAndMerged) {
  const AggregateNode node = bucket_node();
  const AggregateLayout layout(node);
  ASSERT_TRUE(layout.has_buckets());
  const size_t k = node.aggs.size();
  std::mt19937_64 rng(40);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  size_t ties = 0, named = 0, unnamed = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<Event> ev;
    const int n = trial == 0 ? 0 : static_cast<int>(uni(0, 300));
    const uint64_t tasks = uni(1, 20);
    for (int i = 0; i < n; ++i) {
      const auto bucket = static_cast<uint8_t>(uni(0, 13));
      const uint64_t tid = uni(0, tasks);                             // 0: a slice that names no task
      const uint64_t pid = uni(0, 1) ? 0 : tid ? 5000 + tid % 4 : 0;  // its pid, when the span named it
      ev.push_back(slice_event(bucket, uni(1, 50'000'000), pid, bucket == 0 || uni(0, 3) == 0 ? tid : 0));
    }
    if (trial % 3 == 1) {  // two tasks tied at the top: the same large total, cut differently
      const uint64_t a = uni(100, 140), b = a + uni(1, 40), total = uni(20'000'000'000, 30'000'000'000);
      for (uint64_t task : {b, a}) {  // the larger id first
        uint64_t left = total;
        while (left) {
          const uint64_t piece = std::min(left, uni(1, total / 3));
          ev.push_back(slice_event(0, piece, 0, task));
          left -= piece;
        }
      }
    }
    const std::string what = "trial " + std::to_string(trial);
    std::vector<double> want(k);
    for (size_t i = 0; i < k; ++i) want[i] = reference_bucket_value(node.aggs[i], ev);
    if (trial % 3 == 1) {
      EXPECT_GE(want[3], 100) << "the tie is at the top";
      EXPECT_LE(want[3], 140);
    }
    for (int order = 0; order < 3; ++order) {
      if (order) std::shuffle(ev.begin(), ev.end(), rng);
      AggregateState all(&layout),
          part[3] = {AggregateState(&layout), AggregateState(&layout), AggregateState(&layout)};
      for (const auto& e : ev) {
        all.add(e);
        part[uni(0, 2)].add(e);
      }
      std::vector<double> got(k), merged(k);
      all.values(1'000'000'000, got.data());
      expect_row(got.data(), want.data(), k, what + " order " + std::to_string(order));
      part[1].merge(part[2]);
      part[0].merge(part[1]);
      part[0].values(1'000'000'000, merged.data());
      expect_row(merged.data(), want.data(), k, what + " merged, order " + std::to_string(order));
    }
    if (trial % 3 == 1) ++ties;
    if (!std::isnan(want[3])) (want[3] >= 5000 ? named : unnamed)++;
    if (HasFailure()) return;
  }
  EXPECT_GT(ties, 100u);
  EXPECT_GT(named, 50u);
  EXPECT_GT(unnamed, 50u);
}

TEST(AggregateBuckets, EmptyWindowHasNoTimeAndNoTask) {
  const AggregateNode node = bucket_node();
  const AggregateLayout layout(node);
  AggregateState s(&layout);
  s.add(slice_event(7, 500, 0, 0));  // on CPU only: no preempted time, no task
  double v[10];
  s.values(0, v);
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[2], 500);
  EXPECT_TRUE(std::isnan(v[3]));  // top_task: none
  EXPECT_EQ(v[4], 0);             // top_task_time: 0
  // Preempted time that names no task counts in time() but makes no top task.
  s.add(slice_event(0, 300, 0, 0));
  s.values(0, v);
  EXPECT_EQ(v[0], 300);
  EXPECT_TRUE(std::isnan(v[3]));
  EXPECT_EQ(v[4], 0);
}
}  // namespace
}  // namespace ingero
