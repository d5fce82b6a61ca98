// TopK: the k "greatest" items of a stream under a strict total order, in bounded memory.
//
// Contract:
// - `Greater(a, b)` is a strict total order ("a ranks above b"); items that compare equal both
//   ways must be interchangeable (identical for every reader). T is default-constructible and
//   cheap to copy (the engine's calls: 24 or 32 bytes).
// - While at most k items have been added, all are kept in arrival order.
// - Past k, the kept set is exactly the k greatest items seen (as a binary heap of size k would
//   keep), whatever the arrival order; of items equal both ways, the earliest are kept. Items are
//   appended while they beat the current threshold (the k-th greatest at the last compaction)
//   and compacted in bulk when k/2 + 1 extra have piled up: a few ns per rejected item instead
//   of a heap's ~100 ns per replacement.
// - items() compacts to exactly k first. When Greater has a `primary(item)` key (below), a
//   compaction keeps the items in arrival order; otherwise their order after a compaction is
//   unspecified. The returned vector may be reordered by the caller (later adds go on from the
//   new order) but not resized.
// - Memory: at most k + k/2 + 1 items (slots grow by doubling up to k, as push_back would, then
//   once to k + k/2 + 1), plus per-thread compaction scratch reused by every compaction on the
//   thread (with `primary`: 2 bytes per held item and the items of one histogram bucket).
// - Optional `static uint64_t Greater::primary(const T&)`: a key that orders items coarsely,
//   consistent with Greater (primary(a) > primary(b) implies greater(a, b); greater(a, b) implies
//   primary(a) >= primary(b)); e.g. a call's duration when slowness is ordered by duration first.
//   A compaction then selects on a log-linear histogram of the keys (no comparison sort or
//   selection over all items; Greater is called only on the items of the cut's bucket).
// - Never throws beyond allocation failure.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace ingero {

template <typename T, typename Greater>
class TopK {
 public:
  explicit TopK(size_t k, Greater greater = Greater{}) : k_(k ? k : 1), limit_(k_ + k_ / 2 + 1), greater_(greater) {}

  // Inlined where it is called (the engine's per-call feed loop): the threshold reject, the
  // store and the compaction check are a few instructions; growing and compacting are out of
  // line. (No threshold exists before the first compaction, which comes after the k-th item.)
  [[gnu::always_inline]] void add(const T& item) {
    ++seen_;
    if (has_threshold_ && !greater_(item, threshold_)) return;  // the common case once capped
    if (n_ == slots_) grow();
    items_[n_] = item;
    if (++n_ >= limit_) compact();
  }

  // The kept items: all of them (arrival order) up to k added, else exactly the k greatest.
  // Small where it is inlined (the work is out of line in settle()): a bigger items() makes the
  // compiler stop inlining the engine's per-event routing loop in runtime.cpp.
  std::vector<T>& items() {
    if (n_ > k_ || n_ != items_.size()) settle();
    return items_;
  }
  uint64_t seen() const { return seen_; }
  bool capped() const { return seen_ > k_; }
  size_t k() const { return k_; }

 private:
  static constexpr bool kHasPrimary = requires(const T& t) {
    { Greater::primary(t) } -> std::convertible_to<uint64_t>;
  };

  // items()' work: compacts to k if more are held, and drops unused slots from the vector's
  // size (not its allocation).
  [[gnu::noinline]] void settle() {
    if (n_ > k_) compact();
    items_.resize(n_);
    slots_ = n_;
  }

  // Makes room for one more item: the slots double up to k (as push_back's capacity would), and
  // past k are exactly k + k/2 + 1 (no doubling to 2k: a quarter less memory for a capped buffer).
  // Slots freed from the size by items() are reused first.
  [[gnu::noinline]] void grow() {
    const size_t want = std::max(std::clamp<size_t>(2 * n_, std::min<size_t>(4, limit_), limit_), items_.capacity());
    items_.reserve(want);  // exact: resize alone would round the allocation up
    items_.resize(want);
    slots_ = want;
  }

  // Keeps exactly the k greatest items; the k-th greatest becomes the threshold (nothing at or
  // below it can enter).
  [[gnu::noinline]] void compact() {
    if constexpr (kHasPrimary) {
      compact_by_primary();
    } else {
      auto kth = items_.begin() + static_cast<std::ptrdiff_t>(k_ - 1);
      std::nth_element(items_.begin(), kth, items_.begin() + static_cast<std::ptrdiff_t>(n_), greater_);
      threshold_ = items_[k_ - 1];
      n_ = k_;
    }
    has_threshold_ = true;
  }

  // Log-linear buckets of x = key - lo: x itself below 2^(kExactBits + 1), else x's top
  // kExactBits + 1 bits and their position (relative precision 2^-kExactBits), kBuckets in all
  // for any 64-bit x. Non-decreasing in x, so a higher bucket holds only greater keys; keys
  // close to lo (the last threshold's, where the next cut usually is) get the finest buckets.
  static constexpr unsigned kExactBits = 6;
  static constexpr unsigned kBuckets = (65 - kExactBits) << kExactBits;
  static unsigned bucket_of(uint64_t x) {
    // drop: how many low bits are given up (the top set bit's index minus kExactBits, with the
    // bit kExactBits forced on so that small x are kept whole).
    const auto drop = static_cast<unsigned>(63 - std::countl_zero(x | (uint64_t{1} << kExactBits))) - kExactBits;
    return (drop << kExactBits) + static_cast<unsigned>(x >> drop);
  }

  // compact() with a primary key, in branch-light passes (no comparison sort or selection over
  // all the items):
  // (1) lo, a lower bound of the keys: the threshold's key (every held item is at or above the
  //     threshold), or, at the first compaction, the smallest key;
  // (2) each item's bucket (bucket_of(key - lo), noted per item) and a histogram of them; from
  //     the top, the bucket b that holds the k-th greatest item: every item of a higher bucket
  //     is kept (`above` of them);
  // (3) the items of bucket b (with their positions), ordered by Greater and, among items equal
  //     both ways, by arrival: the k - above first of them are kept (their bucket is noted as
  //     b + 1), the last of those is the threshold;
  // (4) one pass keeps, in arrival order, every item whose noted bucket is above b.
  // The kept set is the k greatest, of equal items the earliest: the set nth_element over all
  // the items, ties broken by arrival, keeps.
  void compact_by_primary() {
    const size_t n = n_;
    uint64_t lo = 0;
    if (has_threshold_) {
      lo = Greater::primary(threshold_);
    } else {
      lo = UINT64_MAX;
      for (size_t i = 0; i < n; ++i) lo = std::min<uint64_t>(lo, Greater::primary(items_[i]));
    }
    Scratch& s = scratch();
    if (s.bucket.size() < n) s.bucket.resize(n);
    uint16_t* const bucket = s.bucket.data();
    static_assert(kBuckets <= UINT16_MAX, "a bucket (and b + 1) fits 16 bits");
    uint32_t hist[kBuckets] = {};
    const T* const in = items_.data();
    for (size_t i = 0; i < n; ++i) {
      const unsigned bk = bucket_of(Greater::primary(in[i]) - lo);
      bucket[i] = static_cast<uint16_t>(bk);
      ++hist[bk];
    }
    size_t above = 0;
    unsigned b = kBuckets - 1;
    while (above + hist[b] < k_) above += hist[b--];  // stops: the buckets hold more than k items
    // (3) The cut bucket's items; nth_element over them, earlier first among equal items.
    auto& cut = s.cut;
    cut.clear();
    for_each_equal(bucket, n, static_cast<uint16_t>(b), [&](size_t i) { cut.emplace_back(in[i], i); });
    const auto m = static_cast<std::ptrdiff_t>(k_ - above);  // 1 ..= hist[b]
    const Greater greater = greater_;
    std::nth_element(cut.begin(), cut.begin() + (m - 1), cut.end(), [greater](const auto& x, const auto& y) {
      if (greater(x.first, y.first)) return true;
      return !greater(y.first, x.first) && x.second < y.second;
    });
    threshold_ = cut[static_cast<size_t>(m - 1)].first;
    for (std::ptrdiff_t j = 0; j < m; ++j) bucket[cut[static_cast<size_t>(j)].second] = static_cast<uint16_t>(b + 1);
    // (4) Branch-free keep pass: every item is written, the write position advances when kept.
    // Items before the first dropped one stay where they are.
    size_t i = 0;
    while (i < n && bucket[i] > b) ++i;
    T* const out = items_.data();
    size_t kept = i;
    for (; i < n; ++i) {
      out[kept] = in[i];
      kept += bucket[i] > b ? 1 : 0;
    }
    n_ = kept;  // == k
  }

  // Calls fn(i) for every i < n with v[i] == want, in increasing i: four entries at a time
  // (SWAR: a lane of v ^ want is zero where they are equal), most words have no match.
  template <class Fn>
  static void for_each_equal(const uint16_t* v, size_t n, uint16_t want, Fn&& fn) {
    constexpr uint64_t kOnes = 0x0001000100010001ULL, kHighs = 0x8000800080008000ULL;
    const uint64_t pattern = kOnes * want;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      uint64_t word = 0;
      std::memcpy(&word, v + i, sizeof word);
      const uint64_t x = word ^ pattern;
      if (((x - kOnes) & ~x & kHighs) == 0) continue;  // no lane is zero (exact test)
      for (size_t j = i; j < i + 4; ++j)
        if (v[j] == want) fn(j);
    }
    for (; i < n; ++i)
      if (v[i] == want) fn(i);
  }

  // A compaction's per-item buckets and its cut bucket's items with their positions, kept per
  // thread between compactions (not per TopK: its memory is not held by every buffer).
  struct Scratch {
    std::vector<uint16_t> bucket;
    std::vector<std::pair<T, size_t>> cut;
  };
  static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
  }

  size_t k_;
  size_t limit_;  // a compaction runs when this many items are held (k + k/2 + 1)
  Greater greater_;
  std::vector<T> items_;  // items_[0, n_) are held; [n_, slots_) are free slots
  size_t n_ = 0;
  size_t slots_ = 0;
  T threshold_{};
  bool has_threshold_ = false;
  uint64_t seen_ = 0;
};

}  // namespace ingero
