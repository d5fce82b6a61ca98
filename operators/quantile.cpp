#include "operators/quantile.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

namespace ingero {

int SketchIndex::formula(uint64_t v, double log_gamma) {
  return static_cast<int>(std::ceil(std::log(static_cast<double>(v)) / log_gamma));
}

SketchIndex::SketchIndex(double log_gamma) : log_gamma_(log_gamma), direct_(kDirect, 0) {
  for (uint64_t v = 1; v < kDirect; ++v) direct_[v] = formula(v, log_gamma_);
  cells_.resize(static_cast<size_t>(kTopBits - kDirectBits) * kCellsPerPow2);
  for (int e = kDirectBits; e < kTopBits && cells_ok_; ++e)
    for (uint64_t j = 0; j < kCellsPerPow2; ++j) {
      const uint64_t lo = (kCellsPerPow2 + j) << (e - 6);
      const uint64_t hi = ((kCellsPerPow2 + j + 1) << (e - 6)) - 1;
      const int b_lo = formula(lo, log_gamma_), b_hi = formula(hi, log_gamma_);
      Cell& c = cells_[static_cast<size_t>(e - kDirectBits) * kCellsPerPow2 + j];
      c.bucket = b_lo;
      c.next = UINT64_MAX;
      if (b_hi == b_lo) continue;
      if (b_hi != b_lo + 1) {
        cells_ok_ = false;  // alpha too small for two buckets per cell: use the formula
        break;
      }
      uint64_t a = lo, b = hi;  // formula(a) == b_lo, formula(b) == b_lo + 1
      while (b - a > 1) {
        const uint64_t m = a + (b - a) / 2;
        (formula(m, log_gamma_) == b_lo ? a : b) = m;
      }
      c.next = b;
    }
}

const SketchIndex& SketchIndex::for_alpha(double alpha) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<SketchIndex>> tables;
  const double log_gamma = std::log((1 + alpha) / (1 - alpha));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& t : tables)
    if (t->log_gamma() == log_gamma) return *t;
  tables.push_back(std::make_unique<SketchIndex>(log_gamma));
  return *tables.back();
}

QuantileState::QuantileState(uint32_t exact_limit, double alpha)
    : exact_limit_(exact_limit),
      alpha_(alpha > 0 && alpha < 1 ? alpha : 0.01),
      log_gamma_(std::log((1 + alpha_) / (1 - alpha_))),
      index_(&SketchIndex::for_alpha(alpha_)) {}

void QuantileState::clear() {
  count_ = 0;
  min_ = UINT64_MAX;
  max_ = 0;
  values_.clear();
  sorted_ = true;
  sketch_ = false;
  zeros_ = 0;
  counts_.clear();
  lowest_ = 0;
}

uint64_t QuantileState::bucket_value(int b) const {
  // The midpoint (in relative terms) of bucket b = (gamma^(b-1), gamma^b]: 2*gamma^b/(gamma+1).
  const double gamma = std::exp(log_gamma_);
  return static_cast<uint64_t>(std::llround(2.0 * std::pow(gamma, b) / (gamma + 1.0)));
}

void QuantileState::bucket_add(int b, uint64_t n) {
  if (counts_.empty()) {
    lowest_ = b;
    counts_.assign(1, 0);
  } else if (b < lowest_) {
    // Grow downwards with some slack (empty buckets never change a quantile).
    const size_t grow = static_cast<size_t>(lowest_ - b) + 16;
    counts_.insert(counts_.begin(), grow, 0);
    lowest_ -= static_cast<int>(grow);
  } else if (static_cast<size_t>(b - lowest_) >= counts_.size()) {
    counts_.resize(static_cast<size_t>(b - lowest_) + 16, 0);
  }
  counts_[static_cast<size_t>(b - lowest_)] += n;
}

void QuantileState::sketch_add(uint64_t v, uint64_t n) {
  if (v == 0) zeros_ += n;
  else bucket_add((*index_)(v), n);
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
    for (size_t i = 0; i < other.counts_.size(); ++i)
      if (other.counts_[i]) bucket_add(other.lowest_ + static_cast<int>(i), other.counts_[i]);
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
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (!counts_[i]) continue;
    seen += counts_[i];
    if (seen >= k) return std::clamp(bucket_value(lowest_ + static_cast<int>(i)), min_, max_);
  }
  return max_;
}

}  // namespace ingero
