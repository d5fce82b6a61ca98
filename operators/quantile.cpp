#include "operators/quantile.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <mutex>

namespace ingero {

int SketchIndex::formula(uint64_t v, double log_gamma) {
  return static_cast<int>(std::ceil(std::log(static_cast<double>(v)) / log_gamma));
}

SketchIndex::SketchIndex(double log_gamma) : log_gamma_(log_gamma) {
  cells_.assign(static_cast<size_t>(kTopBits) * kCellsPerPow2, Cell{0, UINT64_MAX});
  for (int e = 0; e < kTopBits; ++e)
    for (uint64_t m = 0; m < kCellsPerPow2; ++m) {
      // The integers v with floor(log2(v)) = e and the 6 bits below the top one equal to m.
      uint64_t lo = 0, hi = 0;
      if (e >= 6) {
        lo = (kCellsPerPow2 + m) << (e - 6);
        hi = ((kCellsPerPow2 + m + 1) << (e - 6)) - 1;
      } else {  // a cell narrower than 1: one integer if (64 + m) / 2^(6-e) is one, else none
        if ((kCellsPerPow2 + m) % (uint64_t{1} << (6 - e)) != 0) continue;
        lo = hi = (kCellsPerPow2 + m) >> (6 - e);
      }
      const int b_lo = formula(lo, log_gamma_), b_hi = formula(hi, log_gamma_);
      Cell& c = cells_[static_cast<size_t>(e) * kCellsPerPow2 + m];
      c.bucket = b_lo;
      if (b_hi == b_lo) continue;
      if (b_hi != b_lo + 1) return;  // alpha too small for two buckets per cell: the formula only
      uint64_t a = lo, b = hi;       // formula(a) == b_lo, formula(b) == b_lo + 1
      while (b - a > 1) {
        const uint64_t mid = a + (b - a) / 2;
        (formula(mid, log_gamma_) == b_lo ? a : b) = mid;
      }
      c.next = b;
    }
  // narrow_cells_, cell i = e * 64 + m of w = 2v + 1. From e = 7 up, the odd w of the cell are
  // 2v + 1 for the v of cell (e - 1, m), which cells_ has; below, a cell holds one integer w at most.
  narrow_cells_.assign(33 * kCellsPerPow2, NarrowCell{kZeroBucket, UINT32_MAX});
  for (int e = 0; e < 33; ++e)
    for (uint64_t m = 0; m < kCellsPerPow2; ++m) {
      NarrowCell& n = narrow_cells_[static_cast<size_t>(e) * kCellsPerPow2 + m];
      if (e >= 7) {
        const Cell& c = cells_[static_cast<size_t>(e - 1) * kCellsPerPow2 + m];
        // next, when there, is at most the cell's last value (below 2^32)
        n = {c.bucket, c.next == UINT64_MAX ? UINT32_MAX : static_cast<uint32_t>(c.next - 1)};
        continue;
      }
      if ((kCellsPerPow2 + m) % (uint64_t{1} << (6 - e)) != 0) continue;  // no integer w
      const uint64_t w = (kCellsPerPow2 + m) >> (6 - e);
      if (w % 2 == 0) continue;  // no v
      const uint64_t v = (w - 1) / 2;
      if (v > 0) n = {formula(v, log_gamma_), UINT32_MAX};  // v = 0 keeps kZeroBucket
    }
  cell_limit_ = (uint64_t{1} << kTopBits) - 1;
}

namespace {

// Sorts n 32-bit values in place, ascending: least-significant-digit radix sort (11, 11 and 10
// bits; a pass whose digit is the same for every value is skipped, so values below 2^22 take two
// passes), std::sort below 512 values. The same order as std::sort, in fewer instructions for
// the exact buffers' sizes (thousands to 65,536 values); needs an n-value scratch buffer.
void sort_u32(uint32_t* v, size_t n) {
  if (n < 512) {
    std::sort(v, v + n);
    return;
  }
  constexpr int kBits[3] = {11, 11, 10};
  constexpr int kShift[3] = {0, 11, 22};
  constexpr size_t kRadix = 2048;  // digit values per pass (the 10-bit pass uses half)
  std::vector<uint32_t> hist(3 * kRadix, 0);
  uint32_t* h0 = hist.data();
  uint32_t* h1 = h0 + kRadix;
  uint32_t* h2 = h1 + kRadix;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = v[i];
    ++h0[x & 0x7ff];
    ++h1[(x >> 11) & 0x7ff];
    ++h2[x >> 22];
  }
  auto scratch = std::make_unique_for_overwrite<uint32_t[]>(n);
  uint32_t* src = v;
  uint32_t* dst = scratch.get();
  for (int pass = 0; pass < 3; ++pass) {
    uint32_t* h = h0 + static_cast<size_t>(pass) * kRadix;
    const int shift = kShift[pass];
    const uint32_t mask = (uint32_t{1} << kBits[pass]) - 1;
    if (h[(src[0] >> shift) & mask] == n) continue;  // one digit value: already in order for it
    uint32_t offset = 0;
    for (size_t d = 0; d < kRadix; ++d) {
      const uint32_t c = h[d];
      h[d] = offset;
      offset += c;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t x = src[i];
      dst[h[(x >> shift) & mask]++] = x;
    }
    std::swap(src, dst);
  }
  if (src != v) std::copy(src, src + n, v);
}

}  // namespace

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
      index_(&SketchIndex::for_alpha(alpha > 0 && alpha < 1 ? alpha : 0.01)),
      alpha_(alpha > 0 && alpha < 1 ? alpha : 0.01),
      log_gamma_(std::log((1 + alpha_) / (1 - alpha_))) {}

QuantileState::QuantileState(const QuantileState& o)
    : size_(o.size_),
      cap_(o.cap_),
      narrow_(o.cap_ ? std::make_unique_for_overwrite<uint32_t[]>(o.cap_) : nullptr),
      count_(o.count_),
      min_(o.min_),
      max_(o.max_),
      scanned_(o.scanned_),
      sorted_size_(o.sorted_size_),
      mode_(o.mode_),
      wide_sorted_(o.wide_sorted_),
      exact_limit_(o.exact_limit_),
      index_(o.index_),
      counts_(o.counts_),
      lowest_(o.lowest_),
      zeros_(o.zeros_),
      wide_(o.wide_),
      alpha_(o.alpha_),
      log_gamma_(o.log_gamma_) {
  if (size_) std::copy(o.narrow_.get(), o.narrow_.get() + size_, narrow_.get());
}

QuantileState& QuantileState::operator=(const QuantileState& o) {
  if (this != &o) *this = QuantileState(o);
  return *this;
}

QuantileState::QuantileState(QuantileState&& o) noexcept
    : size_(o.size_),
      cap_(o.cap_),
      narrow_(std::move(o.narrow_)),
      count_(o.count_),
      min_(o.min_),
      max_(o.max_),
      scanned_(o.scanned_),
      sorted_size_(o.sorted_size_),
      mode_(o.mode_),
      wide_sorted_(o.wide_sorted_),
      exact_limit_(o.exact_limit_),
      index_(o.index_),
      counts_(std::move(o.counts_)),
      lowest_(o.lowest_),
      zeros_(o.zeros_),
      wide_(std::move(o.wide_)),
      partition_(std::move(o.partition_)),
      alpha_(o.alpha_),
      log_gamma_(o.log_gamma_) {
  o.clear();
}

QuantileState& QuantileState::operator=(QuantileState&& o) noexcept {
  if (this == &o) return *this;
  size_ = o.size_;
  cap_ = o.cap_;
  narrow_ = std::move(o.narrow_);
  count_ = o.count_;
  min_ = o.min_;
  max_ = o.max_;
  scanned_ = o.scanned_;
  sorted_size_ = o.sorted_size_;
  mode_ = o.mode_;
  wide_sorted_ = o.wide_sorted_;
  exact_limit_ = o.exact_limit_;
  index_ = o.index_;
  counts_ = std::move(o.counts_);
  lowest_ = o.lowest_;
  zeros_ = o.zeros_;
  wide_ = std::move(o.wide_);
  partition_ = std::move(o.partition_);
  alpha_ = o.alpha_;
  log_gamma_ = o.log_gamma_;
  o.clear();
  return *this;
}

void QuantileState::clear() noexcept {
  size_ = cap_ = 0;
  narrow_.reset();
  count_ = 0;
  min_ = UINT64_MAX;
  max_ = 0;
  scanned_ = sorted_size_ = 0;
  partition_.reset();
  mode_ = Mode::kNarrow;
  wide_sorted_ = true;
  counts_.clear();
  lowest_ = 0;
  zeros_ = 0;
  std::vector<uint64_t>().swap(wide_);
}

void QuantileState::scan_tail() const {
  // A loop the compiler vectorises: no branch per value.
  const uint32_t* values = narrow_.get();
  uint32_t lo = UINT32_MAX, hi = 0;
  for (size_t i = scanned_; i < size_; ++i) {
    lo = std::min(lo, values[i]);
    hi = std::max(hi, values[i]);
  }
  count_ += size_ - scanned_;
  min_ = std::min<uint64_t>(min_, lo);
  max_ = std::max<uint64_t>(max_, hi);
  scanned_ = size_;
}

uint64_t QuantileState::bucket_value(int b) const {
  // The midpoint (in relative terms) of bucket b = (gamma^(b-1), gamma^b]: 2*gamma^b/(gamma+1).
  const double gamma = std::exp(log_gamma_);
  return static_cast<uint64_t>(std::llround(2.0 * std::pow(gamma, b) / (gamma + 1.0)));
}

void QuantileState::bucket_add(int b, uint64_t n) const {
  if (counts_.empty()) {
    lowest_ = b;
    counts_.assign(1, 0);
  } else if (b < lowest_) {
    // Grow downwards with some slack (empty buckets never change a quantile).
    const size_t grow = static_cast<size_t>(lowest_ - b) + 16;
    counts_.insert(counts_.begin(), grow, 0);
    lowest_ -= static_cast<int64_t>(grow);
  } else if (static_cast<size_t>(b - lowest_) >= counts_.size()) {
    counts_.resize(static_cast<size_t>(b - lowest_) + 16, 0);
  }
  counts_[static_cast<size_t>(b - lowest_)] += n;
}

void QuantileState::sketch_add(uint64_t v, uint64_t n) const {
  if (v == 0) zeros_ += n;
  else bucket_add((*index_)(v), n);
}

QuantileState::Window QuantileState::window() const {
  if (max_ == 0) return {nullptr, 0, 0};  // no non-zero value yet (min_ <= max_ from here on)
  const int b_max = (*index_)(max_);
  bucket_add(b_max, 0);
  int64_t first = lowest_;
  if (min_ > 0) {
    const int b_min = (*index_)(min_);
    bucket_add(b_min, 0);
    first = int64_t{b_min} + 1;
  }
  if (b_max <= first) return {nullptr, 0, 0};
  return {counts_.data() + (first - lowest_), static_cast<uint32_t>(b_max - first), static_cast<int32_t>(first)};
}

[[gnu::noinline, gnu::cold]] QuantileState::Window QuantileState::count_edge(uint32_t v, int32_t b, Window w) const {
  if (v == 0) {
    ++zeros_;
    if (min_ == 0) return w;
    min_ = 0;
    return window();
  }
  bool changed = false;
  const auto j = static_cast<uint64_t>(int64_t{b} - lowest_);  // below lowest_ wraps: out of range
  if (j < counts_.size()) {
    ++counts_[j];
  } else {
    bucket_add(b, 1);
    changed = true;
  }
  if (v < min_) min_ = v, changed = true;
  if (v > max_) max_ = v, changed = true;
  return changed ? window() : w;
}

void QuantileState::count_narrow(const uint32_t* values, size_t n) const {
  const SketchIndex::NarrowCell* cells = index_->narrow_cells();
  Window w = window();
#pragma GCC unroll 4
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = values[i];
    const SketchIndex::NarrowCell& c = cells[SketchIndex::narrow_cell(v)];
    // The bucket's place in the window (below lo, or 0's kZeroBucket, wraps: out of it).
    const uint32_t j = static_cast<uint32_t>(c.bucket) - static_cast<uint32_t>(w.lo) + (v > c.last ? 1 : 0);
    if (j < w.span) [[likely]] {
      ++w.counts[j];
    } else {
      w = count_edge(v, static_cast<int32_t>(j + static_cast<uint32_t>(w.lo)), w);
    }
  }
}

template <typename T>
void QuantileState::count_values(const T* values, size_t n) const {
  if (n == 0) return;
  if (max_ == 0) {  // only zeros: max_ covers every value of this state
    zeros_ += n;
    return;
  }
  const SketchIndex& index = *index_;
  // Size the array once: index() is non-decreasing, so every value lies in [index(min_),
  // index(max_)] (with a zero seen, min_ is 0 and a value below the array grows it when it comes).
  // The bound check in the loop only keeps such a value, or a broken index, inside the array.
  if (min_ > 0) bucket_add(index(min_), 0);
  bucket_add(index(max_), 0);
  // Locals: the increments are uint64_t stores, which the compiler must assume may change lowest_.
  uint64_t* counts = counts_.data();
  size_t size = counts_.size();
  int64_t lowest = lowest_;
  uint64_t zeros = 0;
  auto count_one = [&](int b) {
    const auto j = static_cast<uint64_t>(b - lowest);  // below lowest wraps: out of range
    if (j < size) [[likely]] {
      ++counts[j];
    } else {
      bucket_add(b, 1);
      counts = counts_.data();
      size = counts_.size();
      lowest = lowest_;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const uint64_t v = values[i];
    int b = 0;
    if (!index.lookup(v, b)) {  // zero, or a value only the formula answers
      if (v == 0) {
        ++zeros;
        continue;
      }
      b = index(v);
    }
    count_one(b);
  }
  zeros_ += zeros;
}

void QuantileState::flush_pending() const {
  if (index_->has_cells()) {  // one pass: count_narrow takes min and max itself
    count_ += size_ - scanned_;
    count_narrow(narrow_.get(), size_);
  } else {
    scan();
    count_values(narrow_.get(), size_);
  }
  size_ = scanned_ = 0;
}

void QuantileState::grow_narrow() {
  // Doubling from 4 values, never past exact_limit_ (the buffer never holds more).
  const uint32_t cap = static_cast<uint32_t>(
      std::min<uint64_t>(std::max<uint64_t>(uint64_t{cap_} * 2, 4), exact_limit_));
  auto grown = std::make_unique_for_overwrite<uint32_t[]>(cap);
  std::copy(narrow_.get(), narrow_.get() + size_, grown.get());
  narrow_ = std::move(grown);
  cap_ = cap;
}

void QuantileState::widen() {
  scan();
  wide_.reserve(std::max<size_t>(cap_, size_ + 1));
  wide_.assign(narrow_.get(), narrow_.get() + size_);
  wide_sorted_ = sorted_size_ == size_;
  narrow_.reset();
  size_ = cap_ = scanned_ = sorted_size_ = 0;
  partition_.reset();
  mode_ = Mode::kWide;
}

void QuantileState::to_sketch() {
  // The buffer's values, counted in bulk; the pending buffer starts empty (add_rest allocates it).
  if (mode_ == Mode::kNarrow && index_->has_cells()) {  // one pass: count_narrow takes min and max
    count_ += size_ - scanned_;
    count_narrow(narrow_.get(), size_);
  } else {
    scan();
    if (mode_ == Mode::kWide) count_values(wide_.data(), wide_.size());
    else count_values(narrow_.get(), size_);
  }
  mode_ = Mode::kSketch;
  narrow_.reset();
  size_ = cap_ = scanned_ = sorted_size_ = 0;
  partition_.reset();
  std::vector<uint64_t>().swap(wide_);
}

void QuantileState::add_rest(uint64_t v) {
  if (mode_ == Mode::kSketch) {
    if (v > UINT32_MAX) {  // too wide for the pending buffer: counted at once
      sketch_add(v, 1);
      tally(v);
      return;
    }
    // The pending buffer is full (or not there yet): count it in, then give it room, doubling
    // from 64 values up to kPending.
    flush_pending();
    if (cap_ < kPending) {
      cap_ = std::min<uint32_t>(std::max<uint32_t>(cap_ * 2, 64), kPending);
      narrow_ = std::make_unique_for_overwrite<uint32_t[]>(cap_);
    }
    narrow_[size_++] = static_cast<uint32_t>(v);  // scanned later, as add()'s values
    return;
  }
  if (exact_size() >= exact_limit_) {  // v is value exact_limit + 1: the buffer becomes a sketch
    to_sketch();
    sketch_add(v, 1);
    tally(v);
    return;
  }
  if (mode_ == Mode::kNarrow && v <= UINT32_MAX) {  // the buffer is full: grow it
    grow_narrow();
    narrow_[size_++] = static_cast<uint32_t>(v);
    return;
  }
  if (mode_ == Mode::kNarrow) widen();  // the first value >= 2^32 (widen() scans: max_ is current)
  wide_sorted_ = wide_sorted_ && v >= max_;
  wide_.push_back(v);
  tally(v);
}

void QuantileState::merge(const QuantileState& other) {
  if (other.count() == 0) return;
  scan();
  other.scan();
  if (exact() && other.exact() && exact_size() + other.exact_size() <= exact_limit_) {
    if (mode_ == Mode::kNarrow && other.mode_ == Mode::kWide) widen();
    if (mode_ == Mode::kWide) {
      if (other.mode_ == Mode::kWide) wide_.insert(wide_.end(), other.wide_.begin(), other.wide_.end());
      else wide_.insert(wide_.end(), other.narrow_.get(), other.narrow_.get() + other.size_);
      wide_sorted_ = false;
    } else {
      while (cap_ - size_ < other.size_) grow_narrow();  // fits: size_ + other.size_ <= exact_limit_
      std::copy(other.narrow_.get(), other.narrow_.get() + other.size_, narrow_.get() + size_);
      size_ += other.size_;
      scanned_ = size_;  // other's values are in other.count_, min_ and max_, added below
    }
  } else {
    if (exact()) to_sketch();
    if (!other.exact()) {
      other.flush_pending();  // its pending values into its own buckets (they lie in its [min, max])
      zeros_ += other.zeros_;
      for (size_t i = 0; i < other.counts_.size(); ++i)
        if (other.counts_[i]) bucket_add(static_cast<int>(other.lowest_ + static_cast<int64_t>(i)), other.counts_[i]);
    } else if (other.mode_ == Mode::kWide) {
      for (uint64_t v : other.wide_) sketch_add(v, 1);
    } else if (index_->has_cells()) {
      // In bulk, as a flush counts pending values (count_ is added below). The engine merges
      // every closed window's state into the per-op statistics, many of them exact and small.
      count_narrow(other.narrow_.get(), other.size_);
    } else {
      for (size_t i = 0; i < other.size_; ++i) sketch_add(other.narrow_[i], 1);
    }
  }
  count_ += other.count_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

namespace {

// The part of a 32-bit value: 0 for 0, else its power of two and the 6 bits below the leading one
// (1/64 of an octave), read from the bits of double(v) as SketchIndex does; in [1, 2048) for
// v >= 1. Non-decreasing in v, so part order is value order; log-scaled, so a skewed sample (a
// long tail of durations) still spreads over many parts.
inline uint32_t part_of(uint32_t v) {
  const uint64_t bits = std::bit_cast<uint64_t>(static_cast<double>(v));
  const auto cell = static_cast<int64_t>(bits >> 46) - (int64_t{1023} * 64 - 1);  // 1 for v = 1
  return static_cast<uint32_t>(std::max<int64_t>(cell, 0));                       // 0 for v = 0
}

}  // namespace

void QuantileState::partition() const {
  if (!partition_) partition_ = std::make_unique<Partition>();
  Partition& p = *partition_;
  p.start.assign(kParts + 1, 0);
  uint32_t* start = p.start.data();
  uint32_t* values = narrow_.get();
  const size_t n = size_;
  // Each value's part, computed once (16 bits: kParts <= 65536), counted per part.
  auto parts = std::make_unique_for_overwrite<uint16_t[]>(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t part = part_of(values[i]);
    parts[i] = static_cast<uint16_t>(part);
    ++start[part + 1];
  }
  for (size_t d = 1; d <= kParts; ++d) start[d] += start[d - 1];
  // Scatter through a copy of the start offsets (start[] keeps each part's beginning).
  std::vector<uint32_t> next(p.start.begin(), p.start.end() - 1);
  auto scratch = std::make_unique_for_overwrite<uint32_t[]>(n);
  for (size_t i = 0; i < n; ++i) scratch[next[parts[i]]++] = values[i];
  std::copy(scratch.get(), scratch.get() + n, values);
  p.sorted.assign(kParts, false);
  p.size = size_;
  sorted_size_ = 0;  // the buffer is now in part order, not sorted
}

uint32_t QuantileState::narrow_rank(uint64_t k) const {
  uint32_t* values = narrow_.get();
  const bool partitioned = partition_ && partition_->size == size_;
  if (!partitioned) {
    if (sorted_size_ != size_) {
      // Values appended since the last sort: already in order (ascending input) needs no sort.
      size_t i = std::max<size_t>(sorted_size_, 1);
      while (i < size_ && values[i - 1] <= values[i]) ++i;
      if (i < size_) {
        if (size_ >= kPartitionMin) {
          partition();
          return narrow_rank(k);
        }
        sort_u32(values, size_);
      }
      sorted_size_ = size_;
    }
    return values[k - 1];
  }
  // The part holding rank k: the last part starting at or before index k - 1.
  Partition& p = *partition_;
  const auto it = std::upper_bound(p.start.begin(), p.start.end(), static_cast<uint32_t>(k - 1));
  const auto part = static_cast<size_t>(it - p.start.begin()) - 1;
  if (!p.sorted[part]) {
    sort_u32(values + p.start[part], p.start[part + 1] - p.start[part]);
    p.sorted[part] = true;
  }
  return values[k - 1];
}

uint64_t QuantileState::quantile(double q) const {
  if (count() == 0) return 0;
  scan();
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the k-th smallest with k = ceil(q*n), at least 1.
  uint64_t k = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  // Guard against q*n landing a hair above an integer through floating point (0.95*20 = 19.000...).
  const double exact_k = q * static_cast<double>(count_);
  if (std::fabs(exact_k - std::round(exact_k)) < 1e-9) k = static_cast<uint64_t>(std::llround(exact_k));
  k = std::clamp<uint64_t>(k, 1, count_);
  if (mode_ == Mode::kWide) {
    if (!wide_sorted_) std::sort(wide_.begin(), wide_.end());
    wide_sorted_ = true;
    return wide_[k - 1];
  }
  if (mode_ == Mode::kNarrow) return narrow_rank(k);
  if (size_) flush_pending();
  if (k <= zeros_) return 0;
  uint64_t seen = zeros_;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (!counts_[i]) continue;
    seen += counts_[i];
    if (seen >= k) return std::clamp(bucket_value(static_cast<int>(lowest_ + static_cast<int64_t>(i))), min_, max_);
  }
  return max_;
}

}  // namespace ingero
