// The dense-bucket QuantileState against a reference: the original std::map DDSketch (bucket index
// by the formula ceil(ln(v)/ln(gamma)), kept here as the specification). Random inputs, several
// alphas and exact limits, merges: every quantile, count, min and max must be identical. The
// QuantileWidth tests add the 32/64-bit exact buffer, the exact -> sketch transition and merge()
// in every combination, also against a sorted vector.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "operators/quantile.h"
#include "tests/util/quantile_reference.h"

namespace ingero {
namespace {

using MapSketch = test::ReferenceQuantiles;

// Values over many magnitudes: zeros, small ints, log-uniform up to 2^50, clustered durations.
uint64_t draw(std::mt19937_64& rng, int mode) {
  switch (mode % 4) {
    case 0: return rng() % 5 == 0 ? 0 : rng() % 5000;
    case 1: return static_cast<uint64_t>(std::exp2(std::uniform_real_distribution<double>(0, 50)(rng)));
    case 2: return static_cast<uint64_t>(std::lognormal_distribution<double>(11.0, 2.0)(rng));
    default: return 1000000 + rng() % 1000;
  }
}

void expect_same(const QuantileState& a, const MapSketch& b, const std::string& what) {
  ASSERT_EQ(a.exact(), b.exact()) << what;
  for (double q : {0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0})
    ASSERT_EQ(a.quantile(q), b.quantile(q)) << what << " q=" << q;
}

TEST(QuantileDense, IndexMatchesFormula) {
  for (double alpha : {0.01, 0.02, 0.05, 0.1, 0.2, 0.008, 0.005}) {
    const auto& idx = SketchIndex::for_alpha(alpha);
    const double lg = std::log((1 + alpha) / (1 - alpha));
    for (uint64_t v = 1; v < (1u << 18); ++v) ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << alpha << " v=" << v;
    // Around every bucket boundary up to 2^50, and at every power of two +- 2.
    for (int b = 1;; ++b) {
      const double edge = std::exp(lg * b);
      if (edge > std::exp2(50)) break;
      const auto c = static_cast<uint64_t>(edge);
      for (uint64_t v = c > 3 ? c - 3 : 1; v <= c + 3; ++v)
        ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << alpha << " v=" << v;
    }
    for (int e = 12; e < 52; ++e)
      for (int64_t d = -2; d <= 2; ++d) {
        const uint64_t v = (uint64_t{1} << e) + static_cast<uint64_t>(d);
        ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << alpha << " v=" << v;
      }
    std::mt19937_64 rng(static_cast<uint64_t>(alpha * 1e6));
    for (int i = 0; i < 300000; ++i) {
      const uint64_t v = std::max<uint64_t>(1, draw(rng, 1));
      ASSERT_EQ(idx(v), SketchIndex::formula(v, lg)) << alpha << " v=" << v;
    }
  }
}

TEST(QuantileDense, RandomStreamsMatchMapSketch) {
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const double alpha = std::vector<double>{0.01, 0.01, 0.02, 0.05, 0.005}[trial % 5];
    const uint32_t limit = std::vector<uint32_t>{0, 4, 100, 1000, 65536}[(trial / 5) % 5];
    const int n = static_cast<int>(rng() % 20000);
    QuantileState a(limit, alpha);
    MapSketch b(limit, alpha);
    for (int i = 0; i < n; ++i) {
      const uint64_t v = draw(rng, trial + i / 1000);
      a.add(v);
      b.add(v);
    }
    expect_same(a, b, "trial " + std::to_string(trial));
    ASSERT_EQ(a.count(), static_cast<uint64_t>(n));
  }
}

TEST(QuantileDense, RandomMergesMatchMapSketch) {
  std::mt19937_64 rng(777);
  for (int trial = 0; trial < 100; ++trial) {
    const uint32_t limit = std::vector<uint32_t>{10, 500, 3000}[trial % 3];
    std::vector<QuantileState> parts;
    std::vector<MapSketch> refs;
    for (int p = 0; p < 4; ++p) {
      parts.emplace_back(limit, 0.01);
      refs.emplace_back(limit, 0.01);
      const int n = static_cast<int>(rng() % 2000);
      for (int i = 0; i < n; ++i) {
        const uint64_t v = draw(rng, trial + p);
        parts.back().add(v);
        refs.back().add(v);
      }
    }
    for (int p = 1; p < 4; ++p) {
      parts[0].merge(parts[static_cast<size_t>(p)]);
      refs[0].merge(refs[static_cast<size_t>(p)]);
    }
    expect_same(parts[0], refs[0], "merge trial " + std::to_string(trial));
  }
}

}  // namespace
}  // namespace ingero

namespace ingero {
namespace {

// The exact buffer's width (32-bit until a value >= 2^32, then 64-bit), the exact -> sketch
// transition and merge() in every combination, against two references: a sorted vector
// (nearest rank) while exact, and MapSketch (the std::map DDSketch above) throughout.

// Values that stress the 32/64-bit boundary and the sketch's table limits.
uint64_t draw_wide(std::mt19937_64& rng, int mode) {
  static const uint64_t kEdges[] = {0,
                                    1,
                                    4095,
                                    4096,
                                    UINT32_MAX - 1,
                                    UINT32_MAX,
                                    uint64_t{1} << 32,
                                    (uint64_t{1} << 32) + 1,
                                    (uint64_t{1} << 43) - 1,
                                    uint64_t{1} << 43,
                                    (uint64_t{1} << 53) + 1,
                                    uint64_t{1} << 63,
                                    UINT64_MAX - 1,
                                    UINT64_MAX};
  switch (mode % 3) {
    case 0: return kEdges[rng() % std::size(kEdges)];
    case 1: return rng() % 16 == 0 ? (uint64_t{1} << 32) - 8 + rng() % 16 : 2000 + rng() % 100000;
    default: return rng() % 64 == 0 ? kEdges[rng() % std::size(kEdges)] : draw(rng, static_cast<int>(rng() % 4));
  }
}

uint64_t sorted_rank(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  const double ek = q * static_cast<double>(v.size());
  auto k = static_cast<uint64_t>(std::ceil(ek));
  if (std::fabs(ek - std::round(ek)) < 1e-9) k = static_cast<uint64_t>(std::llround(ek));
  k = std::clamp<uint64_t>(k, 1, v.size());
  return v[k - 1];
}

constexpr double kQs[] = {0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0};

// a against both references; `values` is every value a has seen (in any order).
void expect_matches(const QuantileState& a, const MapSketch& ref, const std::vector<uint64_t>& values,
                    const std::string& what) {
  ASSERT_EQ(a.count(), values.size()) << what;
  expect_same(a, ref, what);
  if (values.empty()) return;
  ASSERT_EQ(a.min(), *std::min_element(values.begin(), values.end())) << what;
  ASSERT_EQ(a.max(), *std::max_element(values.begin(), values.end())) << what;
  if (!a.exact()) return;
  ASSERT_EQ(a.wide(), a.max() > UINT32_MAX) << what;
  for (double q : kQs) ASSERT_EQ(a.quantile(q), sorted_rank(values, q)) << what << " q=" << q;
}

TEST(QuantileWidth, RandomStreamsAroundTwoToThe32) {
  std::mt19937_64 rng(4242);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t limit = std::vector<uint32_t>{0, 1, 5, 64, 1000, 65536}[trial % 6];
    const int n = static_cast<int>(rng() % 3000);
    QuantileState a(limit, 0.01);
    MapSketch ref(limit, 0.01);
    std::vector<uint64_t> seen;
    for (int i = 0; i < n; ++i) {
      const uint64_t v = draw_wide(rng, trial / 6 + i / 500);
      a.add(v);
      ref.add(v);
      seen.push_back(v);
    }
    expect_matches(a, ref, seen, "trial " + std::to_string(trial));
  }
}

TEST(QuantileWidth, WidensOnFirstValueAtOrAbove2To32AndStaysExact) {
  QuantileState a(100, 0.01);
  std::vector<uint64_t> seen;
  for (uint64_t v : {uint64_t{UINT32_MAX}, uint64_t{7}, uint64_t{0}, uint64_t{UINT32_MAX} - 1}) {
    a.add(v);
    seen.push_back(v);
  }
  EXPECT_TRUE(a.exact());
  EXPECT_FALSE(a.wide());
  a.add(uint64_t{1} << 32);
  seen.push_back(uint64_t{1} << 32);
  EXPECT_TRUE(a.exact());
  EXPECT_TRUE(a.wide());
  for (uint64_t v : {uint64_t{3}, uint64_t{UINT64_MAX}, uint64_t{1} << 32}) {
    a.add(v);
    seen.push_back(v);
  }
  for (double q : kQs) EXPECT_EQ(a.quantile(q), sorted_rank(seen, q)) << q;
  EXPECT_EQ(a.quantile(1.0), UINT64_MAX);
  EXPECT_EQ(a.quantile(0.01), 0u);
}

TEST(QuantileWidth, ExactUpToTheLimitThenSketch) {
  for (uint32_t limit : {1u, 4u, 7u, 100u, 4096u}) {
    for (bool wide : {false, true}) {
      QuantileState a(limit, 0.01);
      MapSketch ref(limit, 0.01);
      std::vector<uint64_t> seen;
      std::mt19937_64 rng(limit * 2 + wide);
      for (uint32_t i = 0; i < limit; ++i) {
        const uint64_t v = (wide && i == limit / 2 ? (uint64_t{1} << 40) : 0) + rng() % 50000;
        a.add(v);
        ref.add(v);
        seen.push_back(v);
      }
      const std::string what = "limit " + std::to_string(limit) + (wide ? " wide" : " narrow");
      ASSERT_TRUE(a.exact()) << what;
      ASSERT_EQ(a.wide(), wide) << what;
      expect_matches(a, ref, seen, what);
      a.add(0);  // value limit + 1, a zero: counted apart from the buckets
      ref.add(0);
      seen.push_back(0);
      ASSERT_FALSE(a.exact()) << what;
      expect_matches(a, ref, seen, what + " +1");
      for (int i = 0; i < 50; ++i) {
        const uint64_t v = draw_wide(rng, i);
        a.add(v);
        ref.add(v);
        seen.push_back(v);
      }
      expect_matches(a, ref, seen, what + " +51");
    }
  }
}

// One state of a given kind: empty, narrow (exact, < 2^32), wide (exact, a value >= 2^32) or
// sketch (past the limit), with its reference and the values it saw.
struct Built {
  QuantileState q;
  MapSketch ref;
  std::vector<uint64_t> seen;
};

Built build(int kind, uint32_t limit, uint32_t n, std::mt19937_64& rng) {
  Built b{QuantileState(limit, 0.01), MapSketch(limit, 0.01), {}};
  if (kind == 0) return b;
  const uint32_t count = kind == 3 ? limit + 1 + n : std::min(n, limit);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t v = rng() % 8 == 0 ? draw_wide(rng, static_cast<int>(i)) % (uint64_t{1} << 32) : 1000 + rng() % 90000;
    if (kind == 2 && i == count / 2) v = (uint64_t{1} << 32) + rng() % 1000;
    b.q.add(v);
    b.ref.add(v);
    b.seen.push_back(v);
  }
  return b;
}

TEST(QuantileWidth, MergeInEveryCombination) {
  const char* names[] = {"empty", "narrow", "wide", "sketch"};
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 12; ++trial) {
    const uint32_t limit = std::vector<uint32_t>{8, 300, 2000}[trial % 3];
    for (int ka = 0; ka < 4; ++ka)
      for (int kb = 0; kb < 4; ++kb)
        // Sizes that fit the limit together, and sizes that do not.
        for (uint32_t na : {limit / 4, limit - 1}) {
          Built a = build(ka, limit, na, rng);
          const Built b = build(kb, limit, static_cast<uint32_t>(rng() % limit) + 1, rng);
          a.q.merge(b.q);
          a.ref.merge(b.ref);
          a.seen.insert(a.seen.end(), b.seen.begin(), b.seen.end());
          const std::string what = std::string(names[ka]) + "+" + names[kb] + " limit " + std::to_string(limit) +
                                   " n " + std::to_string(na) + " trial " + std::to_string(trial);
          expect_matches(a.q, a.ref, a.seen, what);
          ASSERT_EQ(a.q.exact(), a.seen.size() <= limit && ka != 3 && kb != 3) << what;
          // Adding after a merge keeps both in step (the buffer's room and order are re-derived).
          for (int i = 0; i < 20; ++i) {
            const uint64_t v = draw_wide(rng, i);
            a.q.add(v);
            a.ref.add(v);
            a.seen.push_back(v);
          }
          expect_matches(a.q, a.ref, a.seen, what + " then 20 adds");
        }
  }
}

TEST(QuantileWidth, SortedInputAndQueriesBetweenAdds) {
  // The lazily kept "sorted" flag: ascending input is never sorted again, and a query between
  // adds (which sorts the buffer) must not lose later values or their order.
  QuantileState a(1000, 0.01);
  std::vector<uint64_t> seen;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 600; ++i) {
    const uint64_t v = i < 200 ? static_cast<uint64_t>(i) * 3 : rng() % 1000;
    a.add(v);
    seen.push_back(v);
    if (i % 37 == 0) {
      for (double q : kQs) ASSERT_EQ(a.quantile(q), sorted_rank(seen, q)) << i << " q=" << q;
    }
  }
  for (double q : kQs) ASSERT_EQ(a.quantile(q), sorted_rank(seen, q)) << q;
}

TEST(QuantileWidth, CopyMoveAndClear) {
  std::mt19937_64 rng(11);
  for (int kind = 0; kind < 4; ++kind) {
    Built b = build(kind, 500, 300, rng);
    QuantileState copy(b.q);
    expect_matches(copy, b.ref, b.seen, "copy");
    QuantileState assigned(3, 0.05);
    assigned = b.q;
    expect_matches(assigned, b.ref, b.seen, "assigned");
    copy.add(12345);  // the copy owns its buffer: the original is unchanged
    expect_matches(b.q, b.ref, b.seen, "original after copy.add");
    QuantileState moved(std::move(assigned));
    expect_matches(moved, b.ref, b.seen, "moved");
    EXPECT_EQ(assigned.count(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    assigned.add(7);
    EXPECT_EQ(assigned.quantile(0.5), 7u);
    moved.clear();
    EXPECT_EQ(moved.count(), 0u);
    EXPECT_TRUE(moved.exact());
    moved.add(1u << 20);
    EXPECT_EQ(moved.quantile(0.99), 1u << 20);
  }
}

}  // namespace
}  // namespace ingero
