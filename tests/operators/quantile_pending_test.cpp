// QuantileState's deferred work against a per-value reference: add() only stores a 32-bit value;
// count, min and max of those values are taken in bulk (scan), the exact buffer is sorted from
// the last sorted prefix, and in sketch mode the stored values wait in a pending buffer that is
// counted into the buckets when it fills or before a read. The reference does everything at once
// per value (exact values up to the limit, then a std::map of buckets by the formula
// ceil(ln(v)/ln(gamma))), so any value counted twice, lost, or read before it is counted shows.
// Reads come at random points between adds, on copies, and through merges, where the pending
// buffer and the unscanned tail are not empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "operators/quantile.h"
#include "tests/util/quantile_reference.h"

namespace ingero {
namespace {

using Reference = test::ReferenceQuantiles;

constexpr double kQs[] = {0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0};

void expect_same(const QuantileState& a, const Reference& r, const std::string& what) {
  ASSERT_EQ(a.count(), r.count()) << what;  // before any other read: count() alone
  ASSERT_EQ(a.exact(), r.exact()) << what;
  ASSERT_EQ(a.min(), r.min()) << what;
  ASSERT_EQ(a.max(), r.max()) << what;
  for (double q : kQs) ASSERT_EQ(a.quantile(q), r.quantile(q)) << what << " q=" << q;
}

// Durations (mostly 2-100 us, a tail to 20 ms), zeros, ascending runs and a rare value >= 2^32.
uint64_t draw(std::mt19937_64& rng, uint64_t& run) {
  switch (rng() % 16) {
    case 0: return 0;
    case 1: return (uint64_t{1} << 32) + rng() % 1000 * (rng() % 64 == 0);
    case 2: return 1000000 + rng() % 20000000;
    case 3: return run += rng() % 100;  // ascending
    default: return 2000 + rng() % 100000;
  }
}

TEST(QuantilePending, ReadsBetweenAddsMatchThePerValueReference) {
  std::mt19937_64 rng(2026);
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t limit = std::vector<uint32_t>{0, 1, 100, 1000, 65536}[trial % 5];
    const bool no_wide = trial % 2 == 0;  // half the trials stay below 2^32 (narrow, then sketch)
    QuantileState a(limit, trial % 3 == 0 ? 0.02 : 0.01);
    Reference r(limit, trial % 3 == 0 ? 0.02 : 0.01);
    uint64_t run = 0;
    const int n = 1000 + static_cast<int>(rng() % 30000);
    for (int i = 0; i < n; ++i) {
      uint64_t v = draw(rng, run);
      if (no_wide) v %= uint64_t{1} << 32;
      a.add(v);
      r.add(v);
      if (rng() % 2000 == 0) {
        const std::string what = "trial " + std::to_string(trial) + " after " + std::to_string(i + 1);
        expect_same(a, r, what);
      } else if (rng() % 500 == 0) {
        ASSERT_EQ(a.count(), r.count()) << trial << " " << i;  // count alone, nothing scanned
      }
    }
    expect_same(a, r, "trial " + std::to_string(trial) + " end");
  }
}

TEST(QuantilePending, AscendingInputAndSortedPrefix) {
  // Sorted once, then more values: ascending ones keep it sorted, a smaller one needs a sort.
  QuantileState a(100000, 0.01);
  Reference r(100000, 0.01);
  for (uint64_t v = 10; v < 5000; v += 3) {
    a.add(v);
    r.add(v);
  }
  expect_same(a, r, "ascending");
  for (uint64_t v = 5000; v < 9000; v += 7) {
    a.add(v);
    r.add(v);
  }
  expect_same(a, r, "ascending continued after a query");
  a.add(11);
  r.add(11);
  expect_same(a, r, "one smaller value");
  for (uint64_t v = 20000; v > 15000; v -= 5) {
    a.add(v);
    r.add(v);
  }
  expect_same(a, r, "descending");
}

// Large exact buffers (2048+ values) are bucketed by value range and only the queried parts are
// sorted: skewed inputs (one outlier stretching the range, two far clusters, duplicates, the
// 32-bit extremes), queries at many ranks, appends after the bucketing, copies and moves.
TEST(QuantilePending, LargeExactBufferRanksAgainstASortedCopy) {
  std::mt19937_64 rng(31);
  for (int shape = 0; shape < 6; ++shape)
    for (uint32_t n : {2047u, 2048u, 5000u, 40000u}) {
      QuantileState a(65536, 0.01);
      Reference r(65536, 0.01);
      auto value = [&](uint32_t i) -> uint64_t {
        switch (shape) {
          case 0: return 2000 + rng() % 100000;                                        // uniform
          case 1: return i == n / 3 ? UINT32_MAX : 1000 + rng() % 50;                  // one outlier
          case 2: return rng() % 2 ? rng() % 100 : (uint64_t{1} << 31) + rng() % 100;  // two clusters
          case 3: return rng() % 7;                                                    // duplicates
          case 4: return rng() % 3 == 0 ? 0 : UINT32_MAX - rng() % 3;                  // the extremes
          default:
            return static_cast<uint64_t>(std::exp2(std::uniform_real_distribution<double>(0, 32)(rng))) %
                   (uint64_t{1} << 32);
        }
      };
      for (uint32_t i = 0; i < n; ++i) {
        const uint64_t v = value(i);
        a.add(v);
        r.add(v);
      }
      const std::string what = "shape " + std::to_string(shape) + " n " + std::to_string(n);
      ASSERT_TRUE(a.exact()) << what;
      for (int i = 0; i < 200; ++i) {  // many ranks, in random order
        const double q = std::uniform_real_distribution<double>(0.0001, 1.0)(rng);
        ASSERT_EQ(a.quantile(q), r.quantile(q)) << what << " q=" << q;
      }
      expect_same(a, r, what);
      QuantileState copy(a);  // the copy holds the bucketed (not sorted) buffer
      expect_same(copy, r, what + " copy");
      for (uint32_t i = 0; i < 100; ++i) {  // appends after the bucketing: bucketed again
        const uint64_t v = value(i);
        a.add(v);
        r.add(v);
      }
      expect_same(a, r, what + " +100");
      QuantileState moved(std::move(a));
      expect_same(moved, r, what + " moved");
    }
}

// A state of the given kind with values left in its pending buffer / unscanned tail.
struct Built {
  QuantileState q;
  Reference r;
};

Built build(int kind, std::mt19937_64& rng) {
  const uint32_t limit = 2000;
  Built b{QuantileState(limit, 0.01), Reference(limit, 0.01)};
  const uint32_t n = kind == 0   ? 0
                     : kind == 3 ? limit + 1 + static_cast<uint32_t>(rng() % 9000)
                                 : 1 + static_cast<uint32_t>(rng() % 900);
  uint64_t run = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t v = draw(rng, run) % (uint64_t{1} << 32);
    if (kind == 2 && i == n / 2) v = (uint64_t{1} << 33) + rng() % 1000;
    b.q.add(v);
    b.r.add(v);
  }
  return b;
}

TEST(QuantilePending, MergeAndCopyWithPendingValues) {
  const char* names[] = {"empty", "narrow", "wide", "sketch"};
  std::mt19937_64 rng(77);
  for (int rep = 0; rep < 6; ++rep)
    for (int ka = 0; ka < 4; ++ka)
      for (int kb = 0; kb < 4; ++kb) {
        const std::string what = std::string(names[ka]) + " <- " + names[kb] + " rep " + std::to_string(rep);
        Built a = build(ka, rng);
        Built b = build(kb, rng);
        QuantileState copy_b(b.q);  // a copy keeps b's pending values as they are
        a.q.merge(b.q);
        a.r.merge(b.r);
        expect_same(a.q, a.r, what);
        expect_same(b.q, b.r, what + " (merged-from side)");
        expect_same(copy_b, b.r, what + " (copy of the merged-from side)");
        for (int i = 0; i < 3000; ++i) {  // more values after the merge, then read again
          const uint64_t v = 2000 + rng() % 100000;
          a.q.add(v);
          a.r.add(v);
          copy_b.add(v);
        }
        expect_same(a.q, a.r, what + " +3000");
        ASSERT_EQ(copy_b.count(), b.r.count() + 3000) << what;
      }
}

}  // namespace
}  // namespace ingero
