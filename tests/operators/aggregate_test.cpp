#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace ingero
