// TopK: the k "greatest" items of a stream under a strict total order, in bounded memory.
//
// Contract:
// - `Greater(a, b)` is a strict total order ("a ranks above b"); items that compare equal both
//   ways must be interchangeable (identical for every reader).
// - While at most k items have been added, all are kept in arrival order.
// - Past k, the kept set is exactly the k greatest items seen (as a binary heap of size k would
//   keep), whatever the arrival order. Items are appended while they beat the current threshold
//   (the k-th greatest at the last compaction) and compacted in bulk (nth_element) when k/2
//   extra have piled up: ~10 ns per rejected item instead of a heap's ~100 ns per replacement.
// - items() compacts to exactly k first. When Greater has a `primary(item)` key (below), a
//   compaction keeps the items in arrival order; otherwise their order after a compaction is
//   unspecified. Memory: at most k + k/2 items (plus, with `primary`, a per-thread list of the
//   items of one histogram bucket, reused by every compaction on the thread).
// - Optional `static uint64_t Greater::primary(const T&)`: a key that orders items coarsely,
//   consistent with Greater (primary(a) > primary(b) implies greater(a, b); greater(a, b) implies
//   primary(a) >= primary(b)); e.g. a call's duration when slowness is ordered by duration first.
//   A compaction then finds the cut from a histogram of the keys, orders by Greater only the
//   items in the cut's histogram bucket, and keeps the items above the cut in one ordered pass.
// - Never throws beyond allocation failure.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ingero {

template <typename T, typename Greater>
class TopK {
 public:
  explicit TopK(size_t k, Greater greater = Greater{}) : k_(k ? k : 1), greater_(greater) {}

  // Inlined where it is called (the engine's per-call feed loop): the append and the threshold
  // reject are a few instructions; the rest is out of line (append).
  [[gnu::always_inline]] void add(const T& item) {
    ++seen_;
    if (seen_ <= k_) {
      items_.push_back(item);
      return;
    }
    if (has_threshold_ && !greater_(item, threshold_)) return;  // the common case once capped
    append(item);
  }

  // The kept items: all of them (arrival order) up to k added, else exactly the k greatest.
  std::vector<T>& items() {
    if (items_.size() > k_) compact();
    return items_;
  }
  uint64_t seen() const { return seen_; }
  bool capped() const { return seen_ > k_; }
  size_t k() const { return k_; }

 private:
  // add() past the first k items of one that beats the threshold (or comes before the first
  // compaction): out of line, so add() stays small where it is inlined.
  [[gnu::noinline]] void append(const T& item) {
    // Past k it never holds more than k + k/2 + 1 items: one exact reservation instead of the
    // vector's doubling (2k slots), a quarter less memory for a capped buffer. (No threshold
    // exists yet at the (k + 1)-th item: the first compaction comes later.)
    if (seen_ == k_ + 1) items_.reserve(k_ + k_ / 2 + 1);
    items_.push_back(item);
    if (items_.size() >= k_ + k_ / 2 + 1) compact();
  }
  static constexpr bool kHasPrimary = requires(const T& t) {
    { Greater::primary(t) } -> std::convertible_to<uint64_t>;
  };
  // Keeps exactly the k greatest items; the k-th greatest becomes the threshold (nothing at or
  // below it can enter).
  void compact() {
    if constexpr (kHasPrimary) {
      compact_by_primary();
    } else {
      auto kth = items_.begin() + static_cast<std::ptrdiff_t>(k_ - 1);
      std::nth_element(items_.begin(), kth, items_.end(), greater_);
      items_.resize(k_);
      threshold_ = items_[k_ - 1];
    }
    has_threshold_ = true;
  }
  // compact() with a primary key, in four branch-light passes over the items (no comparison
  // sort or selection over all of them): (1) the keys' range; (2) a histogram of the keys in
  // kBuckets equal ranges, scanned from the top to the bucket that holds the k-th greatest key;
  // every item of a higher bucket is kept (`above` of them); (3) the items of that bucket,
  // selected by Greater (nth_element over a few items): the (k - above)-th greatest of them is
  // the threshold; (4) one pass keeps, in arrival order, every item greater than the threshold
  // and as many items equal to it (both ways: interchangeable) as fill k. The kept set is the
  // one nth_element over all the items keeps.
  void compact_by_primary() {
    static constexpr unsigned kBucketBits = 11, kBuckets = 1u << kBucketBits;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const T& item : items_) {
      const uint64_t key = Greater::primary(item);
      lo = std::min(lo, key);
      hi = std::max(hi, key);
    }
    const auto width = static_cast<int>(std::bit_width(hi - lo));
    const int shift = width > static_cast<int>(kBucketBits) ? width - static_cast<int>(kBucketBits) : 0;
    uint32_t hist[kBuckets] = {};
    for (const T& item : items_) ++hist[(Greater::primary(item) - lo) >> shift];
    size_t above = 0;
    unsigned b = kBuckets - 1;
    while (above + hist[b] < k_) above += hist[b--];  // stops: the buckets hold more than k items
    std::vector<T>& cut = scratch();
    cut.clear();
    for (const T& item : items_)
      if (((Greater::primary(item) - lo) >> shift) == b) cut.push_back(item);
    const auto mth = cut.begin() + static_cast<std::ptrdiff_t>(k_ - above - 1);
    std::nth_element(cut.begin(), mth, cut.end(), greater_);
    threshold_ = *mth;
    // Of the k - above slots of this bucket, the items greater than the threshold take some;
    // the rest go to items equal to it, the earliest first.
    size_t equal_slots = k_ - above;
    for (auto it = cut.begin(); it != mth; ++it)
      if (greater_(*it, threshold_)) --equal_slots;
    size_t out = 0;
    for (size_t i = 0, n = items_.size(); i < n; ++i) {
      const T& item = items_[i];
      bool keep = ((Greater::primary(item) - lo) >> shift) > b || greater_(item, threshold_);
      if (!keep && equal_slots > 0 && !greater_(threshold_, item)) {
        --equal_slots;
        keep = true;
      }
      if (keep) items_[out++] = item;
    }
    items_.resize(out);  // == k
  }
  // A compaction's list of the items in the threshold's bucket, kept per thread between
  // compactions (not per TopK: its memory is not held by every buffer).
  static std::vector<T>& scratch() {
    static thread_local std::vector<T> v;
    return v;
  }

  size_t k_;
  Greater greater_;
  std::vector<T> items_;
  T threshold_{};
  bool has_threshold_ = false;
  uint64_t seen_ = 0;
};

}  // namespace ingero
