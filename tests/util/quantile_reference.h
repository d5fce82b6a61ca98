// The reference quantile model the quantile tests compare QuantileState (operators/quantile.h)
// with (tests/operators/quantile_dense_test.cpp, quantile_pending_test.cpp): exact values up to
// `limit`, then a std::map of formula buckets ceil(ln(v) / ln(gamma)) with gamma = (1 + alpha) /
// (1 - alpha); nearest-rank quantiles, a bucket answered by 2 gamma^b / (gamma + 1) clamped to
// [min, max]. Slow and obviously right: every value is kept or bucketed one at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace ingero::test {

class ReferenceQuantiles {
 public:
  ReferenceQuantiles(uint32_t limit, double alpha) : limit_(limit), lg_(std::log((1 + alpha) / (1 - alpha))) {}
  void add(uint64_t v) {
    ++n_;
    mn_ = std::min(mn_, v);
    mx_ = std::max(mx_, v);
    if (sketch_) return bucket(v, 1);
    vals_.push_back(v);
    if (vals_.size() > limit_) to_sketch();
  }
  void merge(const ReferenceQuantiles& o) {
    if (!o.n_) return;
    n_ += o.n_;
    mn_ = std::min(mn_, o.mn_);
    mx_ = std::max(mx_, o.mx_);
    if (!sketch_ && !o.sketch_ && vals_.size() + o.vals_.size() <= limit_) {
      vals_.insert(vals_.end(), o.vals_.begin(), o.vals_.end());
      return;
    }
    if (!sketch_) to_sketch();
    zeros_ += o.zeros_;  // o is exact (no zeros or buckets yet) or a sketch (no values)
    for (const auto& [b, c] : o.buckets_) buckets_[b] += c;
    for (uint64_t v : o.vals_) bucket(v, 1);
  }
  uint64_t quantile(double q) const {
    if (!n_) return 0;
    q = std::clamp(q, 0.0, 1.0);
    const double ek = q * static_cast<double>(n_);
    auto k = static_cast<uint64_t>(std::ceil(ek));
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
  uint64_t count() const { return n_; }
  uint64_t min() const { return n_ ? mn_ : 0; }
  uint64_t max() const { return mx_; }
  bool exact() const { return !sketch_; }

 private:
  void bucket(uint64_t v, uint64_t c) {
    if (v == 0) zeros_ += c;
    else buckets_[static_cast<int>(std::ceil(std::log(static_cast<double>(v)) / lg_))] += c;
  }
  void to_sketch() {
    sketch_ = true;
    for (uint64_t v : vals_) bucket(v, 1);
    vals_.clear();
  }
  uint32_t limit_;
  double lg_;
  uint64_t n_ = 0, mn_ = UINT64_MAX, mx_ = 0, zeros_ = 0;
  bool sketch_ = false;
  std::vector<uint64_t> vals_;
  std::map<int, uint64_t> buckets_;
};

}  // namespace ingero::test
