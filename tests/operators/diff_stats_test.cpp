// operators/diff_stats.h: the Mann-Whitney U test `diff` judges noise with, against values worked
// out by hand (normal approximation with tie and continuity corrections).
#include "operators/diff_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

using ingero::diff::mann_whitney;

TEST(MannWhitney, FullySeparatedSamples) {
  const std::vector<double> a{1, 2, 3, 4, 5}, b{6, 7, 8, 9, 10};
  const auto t = mann_whitney(a, b);
  EXPECT_DOUBLE_EQ(t.u, 0);
  // mu = 12.5, var = 25 * 11 / 12, z = (12.5 - 0.5) / sqrt(var) = 2.5067, p = 0.01219
  EXPECT_NEAR(t.z, 12.0 / std::sqrt(25.0 * 11 / 12), 1e-9);
  EXPECT_NEAR(t.p, 0.01219, 1e-4);
  const auto r = mann_whitney(b, a);  // the other way round: the same p, the opposite sign
  EXPECT_NEAR(r.p, t.p, 1e-12);
  EXPECT_LT(r.z, 0);
}

TEST(MannWhitney, TiesUseAverageRanksAndShrinkTheVariance) {
  const std::vector<double> a{1, 2, 2, 3}, b{2, 3, 3, 4};
  // Ranks: 1 -> 1; 2,2,2 -> 3; 3,3,3 -> 6; 4 -> 8. R(a) = 1 + 3 + 3 + 6 = 13, U = 13 - 10 = 3.
  // ties: 2 groups of 3 -> sum t^3 - t = 48; var = 16/12 * (9 - 48/56) = 10.857; z = (8-3-0.5)/3.295
  const auto t = mann_whitney(a, b);
  EXPECT_DOUBLE_EQ(t.u, 3);
  EXPECT_NEAR(t.z, 4.5 / std::sqrt(16.0 / 12 * (9 - 48.0 / 56)), 1e-9);
  EXPECT_NEAR(t.p, std::erfc(t.z / std::sqrt(2.0)), 1e-12);
}

TEST(MannWhitney, SameDistributionIsNotSignificantAndTooFewIsNoTest) {
  std::vector<double> a, b;
  for (int i = 0; i < 200; ++i) {
    a.push_back((i * 37) % 101);
    b.push_back((i * 53 + 7) % 101);
  }
  EXPECT_GT(mann_whitney(a, b).p, 0.2);
  const std::vector<double> x{1, 2}, y{3, 4, 5};
  EXPECT_DOUBLE_EQ(mann_whitney(x, y).p, 1);
  const std::vector<double> same{5, 5, 5, 5};
  EXPECT_DOUBLE_EQ(mann_whitney(same, same).p, 1);
}

}  // namespace

namespace {

TEST(Welch, MeansOfUnequalVariances) {
  const std::vector<double> a{1, 2, 3, 4, 5}, b{2, 4, 6, 8, 10};
  // means 3 and 6, variances 2.5 and 10: se = sqrt(0.5 + 2) = 1.5811, z = 1.8974
  const auto t = ingero::diff::welch(a, b);
  EXPECT_NEAR(t.z, 3 / std::sqrt(2.5), 1e-9);
  EXPECT_NEAR(t.p, std::erfc(t.z / std::sqrt(2.0)), 1e-12);
  const std::vector<double> same{5, 5, 5, 5};
  EXPECT_DOUBLE_EQ(ingero::diff::welch(same, same).p, 1);
}

}  // namespace
