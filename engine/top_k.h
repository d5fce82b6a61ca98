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
// - items() compacts to exactly k first; the order of the kept items after a compaction is
//   unspecified (callers sort). Memory: at most k + k/2 items.
// - Never throws beyond allocation failure.
#pragma once

#include <algorithm>
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
  void compact() {
    auto kth = items_.begin() + static_cast<std::ptrdiff_t>(k_ - 1);
    std::nth_element(items_.begin(), kth, items_.end(), greater_);
    items_.resize(k_);
    threshold_ = items_[k_ - 1];  // the k-th greatest: nothing at or below it can enter
    has_threshold_ = true;
  }

  size_t k_;
  Greater greater_;
  std::vector<T> items_;
  T threshold_{};
  bool has_threshold_ = false;
  uint64_t seen_ = 0;
};

}  // namespace ingero
