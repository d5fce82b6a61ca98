// SketchIndex's table (cells found from the bits of double(v)) against the formula it replaces,
// ceil(ln(v) / ln(gamma)): every value below 2^16, every cell's first and last value, and every
// bucket edge +- 3 up to 2^45 (past the table's end, where the formula answers), for several
// alphas including one below 0.008 (no table). Plus lookup()'s contract at 0 and at 2^43.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "operators/quantile.h"

namespace ingero {
namespace {

constexpr double kAlphas[] = {0.01, 0.008, 0.02, 0.05, 0.1, 0.3, 0.005};

TEST(QuantileIndex, EveryValueBelow2To16) {
  for (double alpha : kAlphas) {
    const auto& idx = SketchIndex::for_alpha(alpha);
    const double lg = std::log((1 + alpha) / (1 - alpha));
    for (uint64_t v = 1; v < (uint64_t{1} << 16); ++v)
      ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << "alpha=" << alpha << " v=" << v;
  }
}

TEST(QuantileIndex, CellEdgesAndBucketEdges) {
  for (double alpha : kAlphas) {
    const auto& idx = SketchIndex::for_alpha(alpha);
    const double lg = std::log((1 + alpha) / (1 - alpha));
    // First and last value of every 1/64-of-a-power-of-two cell, and one either side.
    for (int e = 6; e < 46; ++e)
      for (uint64_t m = 0; m <= 64; ++m) {
        const uint64_t first = (64 + m) << (e - 6);
        for (uint64_t v : {first - 1, first, first + 1})
          ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << "alpha=" << alpha << " v=" << v;
      }
    for (int b = 1;; ++b) {
      const double edge = std::exp(lg * b);
      if (edge > std::exp2(45)) break;
      const auto c = static_cast<uint64_t>(edge);
      for (uint64_t v = c > 3 ? c - 3 : 1; v <= c + 3; ++v)
        ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << "alpha=" << alpha << " v=" << v;
    }
    std::mt19937_64 rng(7);
    for (int i = 0; i < 200000; ++i) {
      const uint64_t v = (rng() >> (rng() % 64)) | 1;  // every magnitude up to 2^64
      ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << "alpha=" << alpha << " v=" << v;
    }
  }
}

TEST(QuantileIndex, LookupAnswersExactlyTheTableRange) {
  const auto& idx = SketchIndex::for_alpha(0.01);
  int b = -7;
  EXPECT_FALSE(idx.lookup(0, b));  // zero has no bucket
  EXPECT_EQ(b, -7);
  EXPECT_TRUE(idx.lookup(1, b));
  EXPECT_EQ(b, 0);
  EXPECT_TRUE(idx.lookup((uint64_t{1} << 43) - 1, b));
  EXPECT_FALSE(idx.lookup(uint64_t{1} << 43, b));
  EXPECT_FALSE(idx.lookup(UINT64_MAX, b));
  // Below alpha 0.008 a cell could span three buckets: no table, the formula answers.
  EXPECT_FALSE(SketchIndex::for_alpha(0.005).lookup(1000, b));
}

}  // namespace
}  // namespace ingero
