// Quantiles: exact nearest-rank for small samples, DDSketch for large ones.
//
// Contract:
// - Input: non-negative values (durations in ns), any order.
// - Exact mode keeps every value up to `exact_limit`; quantile(q) is the value at index
//   ceil(q*n)-1 of the sorted sample (nearest rank), which is what Ingero reports, so replayed
//   numbers match Ingero's and SQL over the stored events.
// - Past `exact_limit` values the state converts itself to a DDSketch (logarithmic buckets with
//   gamma = (1+alpha)/(1-alpha)): every quantile it returns is within relative error `alpha` of
//   the true nearest-rank value. Memory is then O(log(max/min)/alpha) buckets, not O(n).
// - merge() is exact when both sides are exact and fit the limit; otherwise sketch + sketch.
// - Zero values are counted apart (a log bucket cannot hold 0), so p50 = 0 is reported as 0.
// - Single-threaded; one instance per key/window.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace ingero {

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
  int bucket_of(uint64_t v) const;
  uint64_t bucket_value(int b) const;

  uint32_t exact_limit_;
  double alpha_;
  double log_gamma_;
  uint64_t count_ = 0, min_ = UINT64_MAX, max_ = 0;
  mutable std::vector<uint64_t> values_;   // exact mode; sorted lazily
  mutable bool sorted_ = true;
  bool sketch_ = false;
  uint64_t zeros_ = 0;
  std::map<int, uint64_t> buckets_;        // sketch mode: bucket index -> count
};

}  // namespace ingero
