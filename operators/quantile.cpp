#include "operators/quantile.h"

#include <algorithm>
#include <cmath>

namespace ingero {

QuantileState::QuantileState(uint32_t exact_limit, double alpha)
    : exact_limit_(exact_limit),
      alpha_(alpha > 0 && alpha < 1 ? alpha : 0.01),
      log_gamma_(std::log((1 + alpha_) / (1 - alpha_))) {}

void QuantileState::clear() {
  count_ = 0;
  min_ = UINT64_MAX;
  max_ = 0;
  values_.clear();
  sorted_ = true;
  sketch_ = false;
  zeros_ = 0;
  buckets_.clear();
}

int QuantileState::bucket_of(uint64_t v) const {
  return static_cast<int>(std::ceil(std::log(static_cast<double>(v)) / log_gamma_));
}

uint64_t QuantileState::bucket_value(int b) const {
  // The midpoint (in relative terms) of bucket b = (gamma^(b-1), gamma^b]: 2*gamma^b/(gamma+1).
  const double gamma = std::exp(log_gamma_);
  return static_cast<uint64_t>(std::llround(2.0 * std::pow(gamma, b) / (gamma + 1.0)));
}

void QuantileState::sketch_add(uint64_t v, uint64_t n) {
  if (v == 0)
    zeros_ += n;
  else
    buckets_[bucket_of(v)] += n;
}

void QuantileState::to_sketch() {
  sketch_ = true;
  for (uint64_t v : values_) sketch_add(v, 1);
  values_.clear();
  values_.shrink_to_fit();
}

void QuantileState::add(uint64_t v) {
  ++count_;
  min_ = std::min(min_, v);
  max_ = std::max(max_, v);
  if (sketch_) {
    sketch_add(v, 1);
    return;
  }
  if (!values_.empty() && v < values_.back()) sorted_ = false;
  values_.push_back(v);
  if (values_.size() > exact_limit_) to_sketch();
}

void QuantileState::merge(const QuantileState& other) {
  if (other.count_ == 0) return;
  count_ += other.count_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  if (!sketch_ && !other.sketch_ && values_.size() + other.values_.size() <= exact_limit_) {
    values_.insert(values_.end(), other.values_.begin(), other.values_.end());
    sorted_ = false;
    return;
  }
  if (!sketch_) to_sketch();
  if (other.sketch_) {
    zeros_ += other.zeros_;
    for (const auto& [b, n] : other.buckets_) buckets_[b] += n;
  } else {
    for (uint64_t v : other.values_) sketch_add(v, 1);
  }
}

uint64_t QuantileState::quantile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the k-th smallest with k = ceil(q*n), at least 1.
  uint64_t k = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  // Guard against q*n landing a hair above an integer through floating point (0.95*20 = 19.000...).
  const double exact_k = q * static_cast<double>(count_);
  if (std::fabs(exact_k - std::round(exact_k)) < 1e-9) k = static_cast<uint64_t>(std::llround(exact_k));
  k = std::clamp<uint64_t>(k, 1, count_);
  if (!sketch_) {
    if (!sorted_) {
      std::sort(values_.begin(), values_.end());
      sorted_ = true;
    }
    return values_[k - 1];
  }
  if (k <= zeros_) return 0;
  uint64_t seen = zeros_;
  for (const auto& [b, n] : buckets_) {
    seen += n;
    if (seen >= k) return std::clamp(bucket_value(b), min_, max_);
  }
  return max_;
}

}  // namespace ingero
