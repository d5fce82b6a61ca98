#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

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

// --- trend X baseline over N windows -----------------------------------------------------------

// The median of v (sorted copy; the mean of the middle two for an even count).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Random sequences of several keys, interleaved, with idle windows (skipped indices), NaN values
// and repeated values (MAD 0), against a brute-force reference: median and MAD of the key's
// previous N values that were not NaN (the current one not included), history = how many, the
// value itself not dropped from it by idle windows.
TEST(TrendBaseline, MedianAndMadOfThePreviousValuesAgainstBruteForce) {
  std::mt19937_64 rng(30);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  size_t checked = 0, skipped_windows = 0, nans = 0, zero_mad = 0;
  for (uint32_t n : {2u, 3u, 5u, 30u}) {
    for (int seq = 0; seq < 50; ++seq) {
      TrendOp t(TrendNode{"share", n, TrendMode::kBaseline, 0});
      std::map<uint32_t, std::deque<double>> hist;  // the reference's history per key
      std::map<uint32_t, uint64_t> window;          // each key's next window index
      for (int step = 0, steps = static_cast<int>(uni(1, 200)); step < steps; ++step) {
        const auto tid = static_cast<uint32_t>(uni(1, 3));
        Key key;
        key.hi = uint64_t{100} << 32 | tid;
        uint64_t& w = window[tid];
        if (uni(0, 4) == 0) {  // idle windows: the key had no row there
          w += uni(1, 50);
          ++skipped_windows;
        }
        double v = 0;
        switch (uni(0, 5)) {
          case 0: v = nan; break;
          case 1: v = 0.25; break;  // repeated: the MAD is often 0
          case 2: v = static_cast<double>(uni(0, 10)); break;
          default: v = std::uniform_real_distribution<double>(0, 1)(rng); break;
        }
        const TrendResult r = t.observe(key, w++, v);
        const std::deque<double>& h = hist[tid];
        SCOPED_TRACE("n " + std::to_string(n) + " seq " + std::to_string(seq) + " step " + std::to_string(step));
        EXPECT_TRUE(r.holds);  // a baseline never drops a row: the rule's requires judge
        EXPECT_EQ(r.history, h.size());
        EXPECT_TRUE(same_value(r.last, v));
        if (h.empty()) {
          EXPECT_TRUE(std::isnan(r.median));
          EXPECT_TRUE(std::isnan(r.mad));
        } else {
          const std::vector<double> prev(h.begin(), h.end());
          const double med = median_of(prev);
          std::vector<double> dev;
          for (double x : prev) dev.push_back(std::fabs(x - med));
          const double mad = median_of(dev);
          EXPECT_EQ(r.median, med);
          EXPECT_EQ(r.mad, mad);
          EXPECT_EQ(r.first, prev.front());
          EXPECT_EQ(r.peak, *std::max_element(prev.begin(), prev.end()));
          EXPECT_TRUE(same_value(r.change, med != 0 ? v / med : nan));
          zero_mad += prev.size() > 2 && mad == 0;
          ++checked;
        }
        if (std::isnan(v)) {
          ++nans;  // not added
        } else {
          hist[tid].push_back(v);
          if (hist[tid].size() > n) hist[tid].pop_front();
        }
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(checked, 5000u);
  EXPECT_GT(skipped_windows, 1000u);
  EXPECT_GT(nans, 1000u);
  EXPECT_GT(zero_mad, 100u);
}

// The same three windows judged against their own baseline, by hand: the median of 10, 20 and 30
// is 20 and its MAD 10; a NaN in between changes nothing; an idle stretch keeps the history.
TEST(TrendBaseline, ByHand) {
  TrendOp t(TrendNode{"share", 3, TrendMode::kBaseline, 0});
  Key k;
  auto r = t.observe(k, 0, 10);
  EXPECT_EQ(r.history, 0u);
  EXPECT_EQ(r.needed, 1u);
  EXPECT_TRUE(std::isnan(r.median));
  t.observe(k, 1, 30);
  t.observe(k, 2, std::numeric_limits<double>::quiet_NaN());
  t.observe(k, 3, 20);
  r = t.observe(k, 500, 99);  // after 496 idle windows
  EXPECT_TRUE(r.holds);
  EXPECT_EQ(r.history, 3u);
  EXPECT_EQ(r.median, 20);
  EXPECT_EQ(r.mad, 10);
  r = t.observe(k, 501, 0);  // the window of 10 fell out: 30, 20, 99
  EXPECT_EQ(r.history, 3u);
  EXPECT_EQ(r.median, 30);
  EXPECT_EQ(r.mad, 10);
}
}  // namespace
}  // namespace ingero
