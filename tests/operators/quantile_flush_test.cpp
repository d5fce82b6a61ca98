// The sketch's one-pass bulk counter (QuantileState::count_narrow, run when the pending buffer is
// flushed) and the 8-byte narrow cell table it reads (SketchIndex::narrow_cells, indexed by the
// cell of 2v + 1 so that 0 has a cell of its own).
// - The table: narrow(v) equals the formula ceil(ln(v) / ln(gamma)) for every v below 2^17, every
//   cell's first and last value +-1 and every bucket edge +-3 up to 2^32, random 32-bit values and
//   UINT32_MAX; 0's cell is kZeroBucket.
// - The counter: counts, min and max are taken in the same pass, and a value is counted without
//   touching min and max only when its bucket lies strictly between theirs. Against the per-value
//   reference (tests/util/quantile_reference.h), batches shaped to hit every edge: values below
//   the first bucket seen, below min_ in min_'s own bucket, above max_ in max_'s bucket, zeros
//   (first, mid-batch, only zeros), values >= 2^32 between batches (max_ beyond the narrow range),
//   the bucket array growing down and up inside one flush, all-equal values, and reads (min, max,
//   quantiles) between adds, which flush early and leave scanned values pending.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "operators/quantile.h"
#include "tests/util/quantile_reference.h"

namespace ingero {
namespace {

using Reference = test::ReferenceQuantiles;

constexpr double kAlphas[] = {0.01, 0.008, 0.02, 0.05, 0.3};

TEST(QuantileFlush, NarrowTableEqualsTheFormula) {
  for (double alpha : kAlphas) {
    const auto& idx = SketchIndex::for_alpha(alpha);
    ASSERT_TRUE(idx.has_cells()) << alpha;
    const double lg = std::log((1 + alpha) / (1 - alpha));
    const auto check = [&](uint64_t v) {
      ASSERT_LT(SketchIndex::narrow_cell(static_cast<uint32_t>(v)), 33u * 64) << v;
      ASSERT_EQ(idx.narrow(static_cast<uint32_t>(v)), SketchIndex::formula(v, lg)) << "alpha=" << alpha << " v=" << v;
    };
    for (uint64_t v = 1; v < (uint64_t{1} << 17); ++v) check(v);
    for (int e = 6; e < 32; ++e)
      for (uint64_t m = 0; m <= 64; ++m) {
        const uint64_t first = (64 + m) << (e - 6);
        for (uint64_t v : {first - 1, first, first + 1})
          if (v <= UINT32_MAX) check(v);
      }
    for (int b = 1;; ++b) {
      const double edge = std::exp(lg * b);
      if (edge > UINT32_MAX - 4.0) break;
      const auto c = static_cast<uint64_t>(edge);
      for (uint64_t v = c > 3 ? c - 3 : 1; v <= c + 3; ++v) check(v);
    }
    std::mt19937_64 rng(11);
    for (int i = 0; i < 200000; ++i) check((static_cast<uint32_t>(rng()) >> (rng() % 32)) | 1);
    check(UINT32_MAX);
    check(UINT32_MAX - 1);
    const SketchIndex::NarrowCell& zero = idx.narrow_cells()[SketchIndex::narrow_cell(0)];
    EXPECT_EQ(zero.bucket, SketchIndex::kZeroBucket);
    EXPECT_EQ(zero.last, UINT32_MAX);
  }
}

void expect_same(const QuantileState& a, const Reference& r, const std::string& what) {
  ASSERT_EQ(a.count(), r.count()) << what;
  ASSERT_EQ(a.exact(), r.exact()) << what;
  ASSERT_EQ(a.min(), r.min()) << what;
  ASSERT_EQ(a.max(), r.max()) << what;
  for (double q : {0.0001, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0})
    ASSERT_EQ(a.quantile(q), r.quantile(q)) << what << " q=" << q;
}

// One batch of values, shaped around the current range [lo, hi] of the values seen so far.
std::vector<uint64_t> batch(int shape, uint64_t lo, uint64_t hi, size_t n, std::mt19937_64& rng) {
  std::vector<uint64_t> out;
  const uint64_t mid = lo + (hi - lo) / 2 + 1;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    switch (shape) {
      case 0: v = 2000 + rng() % 100000; break;                                    // durations
      case 1: v = mid > 1000 ? mid - rng() % (mid / 2) : 1 + rng() % 1000; break;  // a middle
      case 2: v = lo > 1 ? lo - 1 - rng() % (lo / 64 + 1) : 1; break;  // just below the min (same bucket or below)
      case 3: v = hi < UINT32_MAX - 100000 ? hi + 1 + rng() % (hi / 64 + 1) : UINT32_MAX; break;  // just above the max
      case 4: v = rng() % 8 == 0 ? 0 : 5000 + rng() % 1000; break;                                // zeros mid-batch
      case 5: v = 0; break;                                                                       // only zeros
      case 6: v = 777777; break;                                                                  // all equal
      case 7: v = i % 2 ? 1 + rng() % 50 : UINT32_MAX - rng() % 50; break;  // both directions at once
      case 8: v = static_cast<uint32_t>(rng()) >> (rng() % 32); break;      // every magnitude, zeros too
      default: v = (uint64_t{1} << 32) + rng() % 1000000; break;            // >= 2^32: counted at once
    }
    if (shape <= 8 && v > UINT32_MAX) v = UINT32_MAX;
    out.push_back(v);
  }
  return out;
}

TEST(QuantileFlush, EdgesOfTheWindowAgainstThePerValueReference) {
  std::mt19937_64 rng(2026);
  for (int trial = 0; trial < 360; ++trial) {
    // 0.005: no cells, the scan-then-count path (count_values), as a control.
    const double alpha = trial % 6 == 5 ? 0.005 : kAlphas[trial % 5];
    const uint32_t limit = std::vector<uint32_t>{0, 1, 50, 3000}[trial % 4];
    QuantileState a(limit, alpha);
    Reference r(limit, alpha);
    std::string shapes;
    const int batches = 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < batches; ++k) {
      const int shape = static_cast<int>(rng() % 10);
      shapes += std::to_string(shape) + " ";
      // Sizes around the pending buffer's (4096 values, reached by doubling from 64).
      const size_t n = std::vector<size_t>{1, 7, 63, 64, 65, 4095, 4096, 4097, 9000}[rng() % 9];
      const uint64_t lo = r.count() ? r.min() : 100000, hi = r.count() ? r.max() : 100000;
      for (uint64_t v : batch(shape, lo, hi, n, rng)) {
        a.add(v);
        r.add(v);
        if (rng() % 3000 == 0) {  // a read mid-batch: flushes early (min/max scan the tail first)
          ASSERT_EQ(a.min(), r.min()) << "trial " << trial << " shapes " << shapes;
          ASSERT_EQ(a.max(), r.max()) << "trial " << trial << " shapes " << shapes;
        }
      }
      if (rng() % 2) expect_same(a, r, "trial " + std::to_string(trial) + " shapes " + shapes);
    }
    expect_same(a, r, "trial " + std::to_string(trial) + " shapes " + shapes);
  }
}

// The bucket array grows both ways inside one flush, starting from a sketch whose buckets cover a
// narrow middle: the batch's first values are in the middle, then far below and far above.
TEST(QuantileFlush, ArrayGrowsDownAndUpMidFlush) {
  for (double alpha : kAlphas) {
    QuantileState a(0, alpha);
    Reference r(0, alpha);
    for (uint64_t v : {50000u, 50001u, 50002u}) {  // the first flush: one or two buckets
      a.add(v);
      r.add(v);
    }
    expect_same(a, r, "start");
    std::vector<uint64_t> vals;
    vals.reserve(400);
    for (int i = 0; i < 100; ++i) vals.push_back(50000 + static_cast<uint64_t>(i));
    for (uint64_t v = 40000; v >= 2; v = v * 9 / 10) vals.push_back(v);                    // down, one by one
    for (uint64_t v = 60000; v < (uint64_t{1} << 32); v = v * 11 / 10) vals.push_back(v);  // up, one by one
    vals.push_back(1);
    vals.push_back(UINT32_MAX);
    vals.push_back(0);
    for (uint64_t v : vals) {
      a.add(v);
      r.add(v);
    }
    expect_same(a, r, "alpha " + std::to_string(alpha));
  }
}

// Values below min_ inside min_'s own bucket (and above max_ inside max_'s) must still move min
// and max: only buckets strictly inside may skip the comparison.
TEST(QuantileFlush, MinAndMaxMoveInsideTheirOwnBuckets) {
  QuantileState a(0, 0.01);
  Reference r(0, 0.01);
  const auto feed = [&](uint64_t v, int times) {
    for (int i = 0; i < times; ++i) {
      a.add(v);
      r.add(v);
    }
  };
  feed(100000, 10);
  feed(1000000, 10);
  expect_same(a, r, "range set");
  // Same buckets as the min and max (bucket width about 2 %), one unit beyond them.
  feed(99999, 5000);
  feed(1000001, 5000);
  expect_same(a, r, "one unit beyond");
  feed(99990, 1);
  feed(1000010, 1);
  expect_same(a, r, "ten units beyond, one value each");
}

}  // namespace
}  // namespace ingero
