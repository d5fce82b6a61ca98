// Quantiles: exact nearest-rank for small samples, DDSketch for large ones.
//
// Contract:
// - Input: non-negative values (durations in ns), any order.
// - Exact mode keeps every value up to `exact_limit` in a flat buffer (sorted lazily, at query
//   time); quantile(q) is the value at index ceil(q*n)-1 of the sorted sample (nearest rank),
//   which is what Ingero reports, so replayed numbers match Ingero's and SQL over the stored events.
//   The buffer holds 32-bit values while every value fits (durations below 2^32 ns, about 4.29 s:
//   the common case, half the memory) and widens itself to 64-bit on the first larger value; the
//   width is invisible in every result. A 32-bit buffer is sorted by a radix sort (same order as
//   std::sort, fewer instructions); it grows by doubling, never past `exact_limit` values.
// - Past `exact_limit` values the state converts itself to a DDSketch (logarithmic buckets with
//   gamma = (1+alpha)/(1-alpha), bucket index ceil(ln(v)/ln(gamma))): every quantile it returns is
//   within relative error `alpha` of the true nearest-rank value. Memory is then
//   O(log(max/min)/alpha) buckets, not O(n). The value that would exceed the limit converts the
//   buffer first, so the buffer never grows past `exact_limit` values.
// - Buckets are a dense array of counts over [lowest, highest] index (one add = one increment),
//   and the index of a value comes from a per-alpha table (SketchIndex) that returns exactly
//   ceil(ln(v)/ln(gamma)) as the formula computes it: outputs are identical to a std::map of
//   buckets fed by the formula (tests/operators/quantile_dense_test.cpp compares both).
// - add() of a value below 2^32 is one inline store, in both modes: into the exact buffer, or in
//   sketch mode into a pending buffer (up to kPending values) that is counted into the buckets in
//   bulk when it fills and before any read of the buckets. count, min and max of the stored values
//   are taken in bulk too: by the first read that needs them (a vectorised pass), or, when values
//   are counted into buckets (a flush, the conversion to a sketch), in the counting pass itself,
//   where a value whose bucket lies strictly between min's and max's buckets costs one increment
//   (the index is non-decreasing, so it can move neither). The exact buffer is sorted at query
//   time only if a value was appended out of order since the last sort.
//   Deferring changes no bucket, count, min or max, so every result is what per-value work gives
//   (tests/operators/quantile_pending_test.cpp checks reads between adds, merges and copies
//   against a per-value reference). Values >= 2^32, growing, widening and converting take one
//   out-of-line call.
// - A query of a large exact 32-bit buffer (2048+ values) does not sort it all: it buckets the
//   buffer by value once (64 parts per power of two) and sorts only the parts queries land in; the
//   k-th smallest value is the same whichever way it is found.
// - Reads are const but may do that deferred work (mutable members): as before, a state must not
//   be read from two threads at once.
// - Copies are deep; a moved-from state is empty (as after clear()).
// - merge() is exact when both sides are exact and fit the limit; otherwise sketch + sketch.
// - Zero values are counted apart (a log bucket cannot hold 0), so p50 = 0 is reported as 0.
// - Single-threaded; one instance per key/window. SketchIndex tables are shared, immutable and
//   built once per alpha (thread-safe).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ingero {

// v -> ceil(ln(v) / ln(gamma)) for v >= 1, bit-identical to evaluating that formula in double
// precision, without a log per value for v < 2^43 (about 2.4 hours in ns).
// - 1 <= v < 2^43: cells of 1/64 of a power of two, found from the bits of double(v) (exact below
//   2^53): the exponent and the 6 mantissa bits below the leading one, (bits >> 46) = (1023 + e)
//   * 64 + those bits, so one conversion and one shift replace a count-leading-zeros and its
//   arithmetic. Below 64 a cell holds at most one integer. A cell spans at most two buckets when
//   alpha >= 0.008 (ln(1 + 1/64) < ln(gamma)), so it holds its first bucket and the first value of
//   the next one, found by binary search over the formula. Exactness rests on the formula being
//   non-decreasing in integer v there: ln(v+1) - ln(v) ~ 1/v exceeds 30 ulps of ln(v) for
//   v < 2^43, more than libm's error, and division by ln(gamma) > 0 and ceil are monotone.
// - Zero, larger values, or an alpha below 0.008 (cells would span more buckets): the formula.
class SketchIndex {
 public:
  static const SketchIndex& for_alpha(double alpha);  // alpha already sanitised, in (0, 1)
  explicit SketchIndex(double log_gamma);
  static int formula(uint64_t v, double log_gamma);  // the reference definition
  int operator()(uint64_t v) const {
    int b = 0;
    return lookup(v, b) ? b : formula(v, log_gamma_);
  }
  // The table part alone: sets b and returns true when a table answers for v, false when only
  // the formula does (v = 0, v >= 2^43, or an alpha below 0.008). Keeps callers' fast paths
  // call-free.
  bool lookup(uint64_t v, int& b) const {
    if (v - 1 < cell_limit_) {  // 1 <= v < 2^43 (v = 0 wraps), and the cells are valid
      // v < 2^43 converts exactly through int64_t (no unsigned-conversion fix-up).
      const uint64_t bits = std::bit_cast<uint64_t>(static_cast<double>(static_cast<int64_t>(v)));
      const Cell& c = cells_[(bits >> 46) - kFirstCell];
      b = v >= c.next ? c.bucket + 1 : c.bucket;
      return true;
    }
    return false;
  }
  // lookup() for a 32-bit v >= 1 once has_cells(): no range check (every such v has a cell).
  // For bulk loops; v = 0 is outside its contract (the caller counts zeros apart).
  bool has_cells() const { return cell_limit_ != 0; }
  int narrow(uint32_t v) const {
    const NarrowCell& c = narrow_cells()[narrow_cell(v)];
    return v > c.last ? c.bucket + 1 : c.bucket;
  }
  // A second table for bulk loops over 32-bit values, zero included, 8 bytes a cell (half the
  // cache footprint of Cell, and an index the addressing mode scales). Once has_cells(): for
  // 1 <= v < 2^32, index(v) = c.bucket + (v > c.last) with c = narrow_cells()[narrow_cell(v)];
  // for v = 0, c.bucket is kZeroBucket and c.last UINT32_MAX (a bucket no value has, so a loop
  // can send zeros down its out-of-range path instead of testing each value).
  // narrow_cell(v) is the cell of 2v + 1 (exact in a double: below 2^33): for v >= 64 the cell of
  // v one power of two up (the extra low bit lies below the 6 bits kept), for v < 64 a cell holding
  // v alone, and 0 lands in a cell of its own (2v + 1 = 1); one lea replaces a zero test.
  struct NarrowCell {
    int32_t bucket;  // bucket of the cell's first value (kZeroBucket for 0's cell)
    uint32_t last;   // the cell's last value in that bucket (UINT32_MAX: every value of the cell)
  };
  static constexpr int32_t kZeroBucket = INT32_MIN;
  static uint64_t narrow_cell(uint32_t v) {  // in [0, 33 * 64)
    const auto w = static_cast<int64_t>(2 * uint64_t{v} + 1);
    return (std::bit_cast<uint64_t>(static_cast<double>(w)) >> 46) - kFirstCell;
  }
  const NarrowCell* narrow_cells() const { return narrow_cells_.data(); }  // empty: !has_cells()
  double log_gamma() const { return log_gamma_; }

 private:
  static constexpr int kTopBits = 43;
  static constexpr uint64_t kCellsPerPow2 = 64;
  static constexpr uint64_t kFirstCell = uint64_t{1023} * kCellsPerPow2;  // double(1) >> 46
  struct Cell {
    int bucket;     // bucket of the cell's first value
    uint64_t next;  // first value of the cell in bucket + 1 (UINT64_MAX: none)
  };
  double log_gamma_;
  uint64_t cell_limit_ = 0;               // 2^43 - 1 once the cells are built and valid, else 0 (no lookups)
  std::vector<Cell> cells_;               // kTopBits * kCellsPerPow2: cell e * 64 + m
  std::vector<NarrowCell> narrow_cells_;  // 33 * 64, indexed by narrow_cell(v), once valid
};

class QuantileState {
 public:
  explicit QuantileState(uint32_t exact_limit = 65536, double alpha = 0.01);
  QuantileState(const QuantileState& o);
  QuantileState& operator=(const QuantileState& o);
  QuantileState(QuantileState&& o) noexcept;  // leaves o empty (as after clear())
  QuantileState& operator=(QuantileState&& o) noexcept;
  ~QuantileState() = default;

  // Inline: one 32-bit store (the exact buffer, or the sketch's pending values) and nothing else:
  // count, min and max of the values stored this way are taken in bulk later (scan()). Every
  // other case is one call.
  [[gnu::always_inline]] void add(uint64_t v) {
    if (v <= UINT32_MAX && size_ < cap_) {  // 32-bit, room left (cap_ is 0 in kWide mode)
      narrow_[size_++] = static_cast<uint32_t>(v);
    } else {
      add_rest(v);
    }
  }
  void merge(const QuantileState& other);
  // Nearest-rank quantile, q in (0, 1]; 0 for an empty state.
  uint64_t quantile(double q) const;
  uint64_t count() const { return count_ + (size_ - scanned_); }
  uint64_t min() const {
    scan();
    return count_ ? min_ : 0;
  }
  uint64_t max() const {
    scan();
    return max_;
  }
  bool exact() const { return mode_ != Mode::kSketch; }
  // Exact mode with 64-bit values (a value of 2^32 or more was seen); for tests and memory figures.
  bool wide() const { return mode_ == Mode::kWide; }
  double alpha() const { return alpha_; }
  void clear() noexcept;

 private:
  // kNarrow: exact, values in narrow_[0, size_); kWide: exact, values in wide_;
  // kSketch: zeros_ + counts_ + the pending values in narrow_[0, size_).
  enum class Mode : uint8_t { kNarrow, kWide, kSketch };
  // Sketch mode's pending buffer holds at most this many values (16 KB: stays in L1/L2 while
  // several states are fed in turn, and bounds the memory a sketch state adds).
  static constexpr uint32_t kPending = 4096;
  void tally(uint64_t v) {  // count_, min_ and max_ take v in (a value that add() did not store)
    ++count_;
    min_ = v < min_ ? v : min_;
    max_ = v > max_ ? v : max_;
  }
  // count_, min_ and max_ take in narrow_[scanned_, size_) (the values add() stored since).
  void scan() const {
    if (scanned_ != size_) scan_tail();
  }
  void scan_tail() const;
  void add_rest(uint64_t v);  // add() past the inline case: flush/grow, widen, convert, or >= 2^32
  void grow_narrow();
  void widen();
  void to_sketch();
  // Counts n values into the buckets (zeros apart). Every value must be in [min_, max_]: this
  // state's own values, scanned. For 64-bit values, or an index without cells (32-bit values with
  // cells take count_narrow).
  template <typename T>
  void count_values(const T* values, size_t n) const;
  // count_values() for 32-bit values once index_->has_cells(), in one pass: counts them into the
  // buckets (zeros apart) and takes them into min_ and max_ (not count_: the caller's), so the
  // values need not be scanned first. A value whose bucket lies strictly between those of min_ and
  // max_ can change neither (the index is non-decreasing): only its count is added, in a loop with
  // no other work; the rest (the edges, or outside the array) take the careful path.
  void count_narrow(const uint32_t* values, size_t n) const;
  // count_narrow()'s fast window: buckets [lo, lo + span), all in counts_ (counts[j] is bucket
  // lo + j), strictly between min_'s and max_'s buckets (from lowest_ up when min_ is 0); empty
  // (span 0) until a non-zero value is seen.
  struct Window {
    uint64_t* counts;
    uint32_t span;
    int32_t lo;
  };
  Window window() const;  // the current one; sizes counts_ to hold min_'s and max_'s buckets
  // A value outside the window (b: its bucket, kZeroBucket for 0): counted, taken into min_ and
  // max_; returns the window, recomputed if min_, max_ or the array changed.
  Window count_edge(uint32_t v, int32_t b, Window w) const;
  void flush_pending() const;  // sketch mode: counts the pending values in (count, min, max too)
  void sketch_add(uint64_t v, uint64_t n) const;
  void bucket_add(int b, uint64_t n) const;
  uint64_t bucket_value(int b) const;
  size_t exact_size() const { return mode_ == Mode::kWide ? wide_.size() : size_; }

  // Hot members first: add()'s 32-bit path reads only the first 16 bytes.
  // narrow_'s values and capacity: kNarrow: the exact buffer (cap_ <= exact_limit_); kSketch: the
  // pending values (cap_ <= kPending; a const read may count them in and set size_ to 0); kWide: 0.
  mutable uint32_t size_ = 0;
  uint32_t cap_ = 0;
  std::unique_ptr<uint32_t[]> narrow_;  // exact mode while every value < 2^32; sorted lazily
  // Every value but narrow_[scanned_, size_): their number, smallest and largest.
  mutable uint64_t count_ = 0, min_ = UINT64_MAX, max_ = 0;
  mutable uint32_t scanned_ = 0;
  // kNarrow: narrow_[0, sorted_size_) is in ascending order (sorted iff sorted_size_ == size_).
  mutable uint32_t sorted_size_ = 0;
  Mode mode_ = Mode::kNarrow;
  mutable bool wide_sorted_ = true;  // kWide: wide_ is in ascending order
  uint32_t exact_limit_;
  const SketchIndex* index_;
  // Sketch mode: counts_[i] = values in bucket lowest_ + i (dense over the buckets seen), plus the
  // pending values. Mutable: a const read counts the pending values in first.
  mutable std::vector<uint64_t> counts_;
  mutable int64_t lowest_ = 0;
  mutable uint64_t zeros_ = 0;
  mutable std::vector<uint64_t> wide_;  // exact mode after a value >= 2^32; sorted lazily
  // kNarrow, at least kPartitionMin values: instead of a full sort, the first query buckets the
  // buffer into kParts parts by value (0, then 64 parts per power of two: one counting pass, one
  // scatter) and each query sorts only the part holding its rank. Valid while `size` == size_
  // (no value appended since).
  static constexpr uint32_t kParts = 2049;
  static constexpr uint32_t kPartitionMin = 2048;
  struct Partition {
    uint32_t size = 0;            // size_ when partitioned
    std::vector<uint32_t> start;  // part p is narrow_[start[p], start[p + 1]); kParts + 1
    std::vector<bool> sorted;     // part p is in ascending order
  };
  mutable std::unique_ptr<Partition> partition_;
  void partition() const;                  // buckets narrow_[0, size_) into parts (size_ >= 2)
  uint32_t narrow_rank(uint64_t k) const;  // the k-th smallest (1-based) of narrow_[0, size_)
  double alpha_;
  double log_gamma_;
};

}  // namespace ingero
