// The dense-bucket QuantileState against a reference: the original std::map DDSketch (bucket index
// by the formula ceil(ln(v)/ln(gamma)), kept here as the specification). Random inputs, several
// alphas and exact limits, merges: every quantile, count, min and max must be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "operators/quantile.h"

namespace ingero {
namespace {

// The reference: exact values up to the limit, then a std::map of formula buckets.
class MapSketch {
 public:
  MapSketch(uint32_t limit, double alpha) : limit_(limit), alpha_(alpha), lg_(std::log((1 + alpha) / (1 - alpha))) {}
  void add(uint64_t v) {
    ++n_;
    mn_ = std::min(mn_, v);
    mx_ = std::max(mx_, v);
    if (sketch_) return sk(v, 1);
    vals_.push_back(v);
    if (vals_.size() > limit_) to_sketch();
  }
  void merge(const MapSketch& o) {
    if (!o.n_) return;
    n_ += o.n_;
    mn_ = std::min(mn_, o.mn_);
    mx_ = std::max(mx_, o.mx_);
    if (!sketch_ && !o.sketch_ && vals_.size() + o.vals_.size() <= limit_) {
      vals_.insert(vals_.end(), o.vals_.begin(), o.vals_.end());
      return;
    }
    if (!sketch_) to_sketch();
    if (o.sketch_) {
      zeros_ += o.zeros_;
      for (const auto& [b, c] : o.buckets_) buckets_[b] += c;
    } else {
      for (uint64_t v : o.vals_) sk(v, 1);
    }
  }
  uint64_t quantile(double q) const {
    if (!n_) return 0;
    q = std::clamp(q, 0.0, 1.0);
    uint64_t k = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n_)));
    const double ek = q * static_cast<double>(n_);
    if (std::fabs(ek - std::round(ek)) < 1e-9) k = static_cast<uint64_t>(std::llround(ek));
    k = std::clamp<uint64_t>(k, 1, n_);
    if (!sketch_) {
      auto v = vals_;
      std::sort(v.begin(), v.end());
      return v[k - 1];
    }
    if (k <= zeros_) return 0;
    uint64_t seen = zeros_;
    const double gamma = std::exp(lg_);
    for (const auto& [b, c] : buckets_) {
      seen += c;
      if (seen >= k)
        return std::clamp(static_cast<uint64_t>(std::llround(2.0 * std::pow(gamma, b) / (gamma + 1.0))), mn_, mx_);
    }
    return mx_;
  }
  bool exact() const { return !sketch_; }

 private:
  void sk(uint64_t v, uint64_t c) {
    if (v == 0) zeros_ += c;
    else buckets_[static_cast<int>(std::ceil(std::log(static_cast<double>(v)) / lg_))] += c;
  }
  void to_sketch() {
    sketch_ = true;
    for (uint64_t v : vals_) sk(v, 1);
    vals_.clear();
  }
  uint32_t limit_;
  double alpha_, lg_;
  uint64_t n_ = 0, mn_ = UINT64_MAX, mx_ = 0, zeros_ = 0;
  bool sketch_ = false;
  std::vector<uint64_t> vals_;
  std::map<int, uint64_t> buckets_;
};

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
