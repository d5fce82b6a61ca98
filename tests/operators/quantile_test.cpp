#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "operators/op_stats.h"
#include "operators/quantile.h"

namespace ingero {
namespace {

uint64_t nearest_rank(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  k = std::max<size_t>(k, 1);
  return v[k - 1];
}

TEST(Quantile, EmptyIsZero) {
  QuantileState q;
  EXPECT_EQ(q.quantile(0.5), 0u);
  EXPECT_EQ(q.count(), 0u);
  EXPECT_EQ(q.min(), 0u);
}

TEST(Quantile, SingleEvent) {
  QuantileState q;
  q.add(42);
  EXPECT_EQ(q.quantile(0.01), 42u);
  EXPECT_EQ(q.quantile(0.5), 42u);
  EXPECT_EQ(q.quantile(1.0), 42u);
}

TEST(Quantile, NearestRankMatchesIngeroDefinition) {
  // 16 values like the DataLoader trace's cudaLaunchKernel: p99 is the maximum, p50 the 8th.
  std::vector<uint64_t> v;
  for (uint64_t i = 1; i <= 16; ++i) v.push_back(i * 1000);
  QuantileState q;
  for (auto x : std::vector<uint64_t>(v.rbegin(), v.rend())) q.add(x);  // out of order on purpose
  EXPECT_EQ(q.quantile(0.50), 8000u);
  EXPECT_EQ(q.quantile(0.95), 16000u);
  EXPECT_EQ(q.quantile(0.99), 16000u);
  // 20 values: 0.95 * 20 = 19 exactly -> the 19th, not the 20th (floating point must not round up).
  QuantileState q20;
  for (uint64_t i = 1; i <= 20; ++i) q20.add(i);
  EXPECT_EQ(q20.quantile(0.95), 19u);
  EXPECT_EQ(q20.quantile(0.50), 10u);
}

TEST(Quantile, P50CanBeZero) {
  QuantileState q;
  for (int i = 0; i < 6; ++i) q.add(0);
  for (int i = 0; i < 4; ++i) q.add(100);
  EXPECT_EQ(q.quantile(0.5), 0u);
  EXPECT_EQ(q.quantile(0.99), 100u);
  // Also after the switch to the sketch: zeros are kept apart from the log buckets.
  QuantileState s(4, 0.01);
  for (int i = 0; i < 60; ++i) s.add(0);
  for (int i = 0; i < 40; ++i) s.add(1000);
  EXPECT_FALSE(s.exact());
  EXPECT_EQ(s.quantile(0.5), 0u);
  EXPECT_NEAR(static_cast<double>(s.quantile(0.99)), 1000.0, 10.0);
}

TEST(Quantile, SketchStaysWithinRelativeError) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(10.0, 1.5);
  std::vector<uint64_t> v;
  QuantileState q(1000, 0.01);
  for (int i = 0; i < 100000; ++i) {
    const auto x = static_cast<uint64_t>(dist(rng)) + 1;
    v.push_back(x);
    q.add(x);
  }
  ASSERT_FALSE(q.exact());
  for (double p : {0.5, 0.9, 0.95, 0.99, 0.999}) {
    const double truth = static_cast<double>(nearest_rank(v, p));
    const double est = static_cast<double>(q.quantile(p));
    EXPECT_LE(std::fabs(est - truth) / truth, 0.0101) << "p=" << p;
  }
}

TEST(Quantile, MergeEqualsSingleState) {
  QuantileState a, b, all;
  for (uint64_t i = 0; i < 500; ++i) {
    (i % 3 ? a : b).add(i * 7 % 1000);
    all.add(i * 7 % 1000);
  }
  a.merge(b);
  for (double p : {0.5, 0.95, 0.99}) EXPECT_EQ(a.quantile(p), all.quantile(p));
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.max(), all.max());
}

TEST(Quantile, MergeOfSketchesIsOrderIndependent) {
  QuantileState a(10), b(10), c(10), d(10);
  for (uint64_t i = 1; i <= 300; ++i) {
    (i % 2 ? a : b).add(i * 13);
    (i % 2 ? d : c).add(i * 13);
  }
  a.merge(b);
  c.merge(d);
  for (double p : {0.5, 0.99}) EXPECT_EQ(a.quantile(p), c.quantile(p));
}

TEST(OpStats, MergeAcrossShardsEqualsOneAccumulator) {
  OpStatsAccumulator one, s1, s2;
  for (uint64_t i = 0; i < 1000; ++i) {
    Event e;
    e.source = i % 4 ? Source::kCuda : Source::kDriver;
    e.op = static_cast<uint8_t>(1 + i % 3);
    e.dur_ns = (i * 7919) % 5000;
    e.ret = i % 97 == 0 ? 2 : 0;
    one.add(e);
    (i % 2 ? s1 : s2).add(e);
  }
  s1.merge(s2);
  const auto a = one.results(), b = s1.results();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].count, b[i].count);
    EXPECT_EQ(a[i].p50_ns, b[i].p50_ns);
    EXPECT_EQ(a[i].p99_ns, b[i].p99_ns);
    EXPECT_EQ(a[i].total_ns, b[i].total_ns);
    EXPECT_EQ(a[i].errors, b[i].errors);
  }
}

TEST(OpStats, RandomEventsAgainstReferenceAndShardMerges) {
  // Any source byte (the table grows to the highest one seen), exact quantiles against a sorted
  // vector per (source, op), totals, errors, and three shards merged in either order.
  std::mt19937_64 rng(31);
  const uint8_t sources[] = {1, 3, 4, 9, 0, 200, 255};
  struct Ref {
    std::vector<uint64_t> d;
    uint64_t total = 0, errors = 0;
  };
  std::map<std::pair<int, int>, Ref> ref;
  OpStatsAccumulator one(1u << 20),
      s[3] = {OpStatsAccumulator(1u << 20), OpStatsAccumulator(1u << 20), OpStatsAccumulator(1u << 20)};
  for (int i = 0; i < 20000; ++i) {
    Event e;
    e.source = static_cast<Source>(sources[rng() % std::size(sources)]);
    e.op = static_cast<uint8_t>(rng() % 4 == 0 ? 255 : rng() % 5);
    e.dur_ns = rng() % 50 == 0 ? (uint64_t{1} << 32) + rng() % 3 : rng() % 100000;
    e.ret = rng() % 10 == 0 ? -1 : 0;
    one.add(e);
    s[rng() % 3].add(e);
    auto& r = ref[{static_cast<int>(e.source), e.op}];
    r.d.push_back(e.dur_ns);
    r.total += e.dur_ns;
    r.errors += e.ret != 0;
  }
  OpStatsAccumulator merged_a(1u << 20), merged_b(1u << 20);
  for (int i : {0, 1, 2}) merged_a.merge(s[i]);
  for (int i : {2, 0, 1}) merged_b.merge(s[i]);
  for (const auto* acc : {&one, &merged_a, &merged_b}) {
    const auto res = acc->results();
    ASSERT_EQ(res.size(), ref.size());
    size_t i = 0;
    for (const auto& [key, r] : ref) {  // std::map order = (source, op) order
      const OpStats& st = res[i++];
      ASSERT_EQ(static_cast<int>(st.source), key.first);
      ASSERT_EQ(st.op, key.second);
      EXPECT_EQ(st.count, r.d.size());
      EXPECT_EQ(st.p50_ns, nearest_rank(r.d, 0.50));
      EXPECT_EQ(st.p95_ns, nearest_rank(r.d, 0.95));
      EXPECT_EQ(st.p99_ns, nearest_rank(r.d, 0.99));
      EXPECT_EQ(st.min_ns, *std::min_element(r.d.begin(), r.d.end()));
      EXPECT_EQ(st.max_ns, *std::max_element(r.d.begin(), r.d.end()));
      EXPECT_EQ(st.total_ns, r.total);
      EXPECT_EQ(st.errors, r.errors);
      EXPECT_TRUE(st.exact);
    }
  }
}

TEST(OpStats, TotalSaturatesInsteadOfWrapping) {
  OpStatsAccumulator acc;
  Event e;
  e.source = Source::kCuda;
  e.op = 1;
  e.dur_ns = UINT64_MAX - 5;
  acc.add(e);
  acc.add(e);
  EXPECT_EQ(acc.results()[0].total_ns, UINT64_MAX);
}

}  // namespace
}  // namespace ingero
