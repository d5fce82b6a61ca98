#include <gtest/gtest.h>

#include "operators/peer.h"
#include "operators/trend.h"

namespace ingero {
namespace {

TEST(Trend, RisingNeedsConsecutiveWindows) {
  TrendOp t(TrendNode{"p99", 3, TrendMode::kRising, 0});
  Key k;
  EXPECT_FALSE(t.observe(k, 1, 10).holds);
  EXPECT_FALSE(t.observe(k, 2, 20).holds);
  const auto r = t.observe(k, 3, 40);
  EXPECT_TRUE(r.holds);
  EXPECT_DOUBLE_EQ(r.change, 4.0);
  // A skipped window restarts the run.
  EXPECT_FALSE(t.observe(k, 5, 80).holds);
  EXPECT_FALSE(t.observe(k, 6, 90).holds);
  EXPECT_TRUE(t.observe(k, 7, 100).holds);
  // Flat is not rising.
  EXPECT_FALSE(t.observe(k, 8, 100).holds);
}

TEST(Trend, BelowPeak) {
  TrendOp t(TrendNode{"rate", 2, TrendMode::kBelowPeak, 0.6});
  Key k;
  EXPECT_FALSE(t.observe(k, 0, 100).holds);
  EXPECT_FALSE(t.observe(k, 1, 90).holds);
  const auto r = t.observe(k, 2, 50);
  EXPECT_TRUE(r.holds);
  EXPECT_DOUBLE_EQ(r.peak, 100);
  EXPECT_FALSE(t.observe(k, 3, 80).holds);  // peak of (90, 50) is 90; 80 >= 54
}

// A trend that cannot be judged says how much history it had and needed (--why-not reads it).
TEST(Trend, ReportsTheHistoryItHadAndNeeded) {
  TrendOp below(TrendNode{"rate", 3, TrendMode::kBelowPeak, 0.6});
  Key k;
  auto r = below.observe(k, 0, 100);
  EXPECT_EQ(r.history, 0u);
  EXPECT_EQ(r.needed, 3u);
  r = below.observe(k, 1, 100);
  EXPECT_EQ(r.history, 1u);
  below.observe(k, 2, 100);
  r = below.observe(k, 3, 100);
  EXPECT_EQ(r.history, 3u);
  EXPECT_FALSE(r.holds);        // judged: not below the peak
  r = below.observe(k, 5, 10);  // a skipped window restarts the history
  EXPECT_EQ(r.history, 0u);
  EXPECT_FALSE(r.holds);
  TrendOp rising(TrendNode{"p99", 2, TrendMode::kRising, 0});
  r = rising.observe(k, 0, 1);
  EXPECT_EQ(r.history, 1u);
  EXPECT_EQ(r.needed, 2u);
  r = rising.observe(k, 1, 2);
  EXPECT_EQ(r.history, 2u);
  EXPECT_TRUE(r.holds);
}

TEST(Trend, NanBreaksHistory) {
  TrendOp t(TrendNode{"x", 2, TrendMode::kRising, 0});
  Key k;
  t.observe(k, 0, 1);
  t.observe(k, 1, std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(t.observe(k, 2, 5).holds);
}

TEST(Peers, ModifiedZFindsTheStraggler) {
  PeerNode n;
  n.z = 3.5;
  n.floor = 1;
  std::vector<double> v = {60, 61, 59, 60, 62, 84, 60, 61};
  const auto s = evaluate_peers(n, v);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(s[i].outlier, i == 5) << i;
  EXPECT_DOUBLE_EQ(s[0].median, 60.5);
}

TEST(Peers, MadZeroFallsBackAndFloorStopsJitter) {
  PeerNode n;
  n.z = 3.5;
  n.floor = 10;
  // MAD = 0 (most identical): the mean absolute deviation scale is used.
  auto s = evaluate_peers(n, {50, 50, 50, 50, 50, 50, 90});
  EXPECT_TRUE(s[6].outlier);
  // Tiny absolute difference: below the floor, never an outlier.
  s = evaluate_peers(n, {50, 50, 50, 50, 50, 50, 51});
  EXPECT_FALSE(s[6].outlier);
  // All equal: no outlier at all.
  s = evaluate_peers(n, {5, 5, 5});
  for (const auto& x : s) EXPECT_FALSE(x.outlier);
}

TEST(Peers, TooFewPeers) {
  PeerNode n;
  n.min_peers = 3;
  const auto s = evaluate_peers(n, {1, 100});
  EXPECT_FALSE(s[1].outlier);
}

}  // namespace
}  // namespace ingero
