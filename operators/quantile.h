// Quantiles: exact nearest-rank for small samples, DDSketch for large ones.
//
// Contract:
// - Input: non-negative values (durations in ns), any order.
// - Exact mode keeps every value up to `exact_limit` in a flat vector (sorted lazily, at query
//   time); quantile(q) is the value at index ceil(q*n)-1 of the sorted sample (nearest rank),
//   which is what Ingero reports, so replayed numbers match Ingero's and SQL over the stored events.
// - Past `exact_limit` values the state converts itself to a DDSketch (logarithmic buckets with
//   gamma = (1+alpha)/(1-alpha), bucket index ceil(ln(v)/ln(gamma))): every quantile it returns is
//   within relative error `alpha` of the true nearest-rank value. Memory is then
//   O(log(max/min)/alpha) buckets, not O(n).
// - Buckets are a dense array of counts over [lowest, highest] index (one add = one increment),
//   and the index of a value comes from a per-alpha table (SketchIndex) that returns exactly
//   ceil(ln(v)/ln(gamma)) as the formula computes it: outputs are identical to a std::map of
//   buckets fed by the formula (tests/operators/quantile_dense_test.cpp compares both).
// - merge() is exact when both sides are exact and fit the limit; otherwise sketch + sketch.
// - Zero values are counted apart (a log bucket cannot hold 0), so p50 = 0 is reported as 0.
// - Single-threaded; one instance per key/window. SketchIndex tables are shared, immutable and
//   built once per alpha (thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ingero {

// v -> ceil(ln(v) / ln(gamma)) for v >= 1, bit-identical to evaluating that formula in double
// precision, without a log per value for v < 2^43 (about 2.4 hours in ns).
// - v < 4096: a direct table.
// - 4096 <= v < 2^43: cells of 1/64 of a power of two; a cell spans at most two buckets when
//   alpha >= 0.008 (ln(1 + 1/64) < ln(gamma)), so it holds its first bucket and the first value of
//   the next one, found by binary search over the formula. Exactness rests on the formula being
//   non-decreasing in integer v there: ln(v+1) - ln(v) ~ 1/v exceeds 30 ulps of ln(v) for
//   v < 2^43, more than libm's error, and division by ln(gamma) > 0 and ceil are monotone.
// - Larger values, or an alpha below 0.008 (cells would span more buckets): the formula itself.
class SketchIndex {
 public:
  static const SketchIndex& for_alpha(double alpha);  // alpha already sanitised, in (0, 1)
  explicit SketchIndex(double log_gamma);
  static int formula(uint64_t v, double log_gamma);  // the reference definition
  int operator()(uint64_t v) const {
    if (v < kDirect) return direct_[v];
    if (v < kCellEnd && cells_ok_) {
      const int e = 63 - __builtin_clzll(v);
      const Cell& c = cells_[static_cast<size_t>(e - kDirectBits) * kCellsPerPow2 + ((v >> (e - 6)) & 63)];
      return v >= c.next ? c.bucket + 1 : c.bucket;
    }
    return formula(v, log_gamma_);
  }
  double log_gamma() const { return log_gamma_; }

 private:
  static constexpr int kDirectBits = 12;
  static constexpr uint64_t kDirect = uint64_t{1} << kDirectBits;
  static constexpr int kTopBits = 43;
  static constexpr uint64_t kCellEnd = uint64_t{1} << kTopBits;
  static constexpr size_t kCellsPerPow2 = 64;
  struct Cell {
    int bucket;     // bucket of the cell's first value
    uint64_t next;  // first value of the cell in bucket + 1 (UINT64_MAX: none)
  };
  double log_gamma_;
  bool cells_ok_ = true;
  std::vector<int> direct_;
  std::vector<Cell> cells_;
};

class QuantileState {
 public:
  explicit QuantileState(uint32_t exact_limit = 65536, double alpha = 0.01);

  void add(uint64_t v);
  void merge(const QuantileState& other);
  // Nearest-rank quantile, q in (0, 1]; 0 for an empty state.
  uint64_t quantile(double q) const;
  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  bool exact() const { return !sketch_; }
  double alpha() const { return alpha_; }
  void clear();

 private:
  void to_sketch();
  void sketch_add(uint64_t v, uint64_t n);
  void bucket_add(int b, uint64_t n);
  uint64_t bucket_value(int b) const;

  uint32_t exact_limit_;
  double alpha_;
  double log_gamma_;
  const SketchIndex* index_;
  uint64_t count_ = 0, min_ = UINT64_MAX, max_ = 0;
  mutable std::vector<uint64_t> values_;  // exact mode; sorted lazily
  mutable bool sorted_ = true;
  bool sketch_ = false;
  uint64_t zeros_ = 0;
  // Sketch mode: counts_[i] = values in bucket lowest_ + i (dense over the buckets seen).
  std::vector<uint64_t> counts_;
  int lowest_ = 0;
};

}  // namespace ingero
