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
//   selection over all items; Greater is called only on the items of the cut's bucket). With
//   k >= kHistMinK the histogram is kept up to date as items are accepted (one bucket increment
//   each, 15 KB per capped buffer, under 10 % of its items), so a compaction after the first
//   reads the cut bucket off it and makes one pass of key comparisons over the items instead of
//   computing every item's bucket again.
// - Never throws beyond allocation failure.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
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
    if (has_threshold_) {
      if (!greater_(item, threshold_)) return;  // the common case once capped
      if constexpr (kHasPrimary) {
        // Every held item is at or above the threshold, itself at or above base_: no underflow.
        if (hist_) ++hist_[bucket_of(Greater::primary(item) - base_)];
      }
    }
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
  // Every held item, without compacting: all of them up to k added, else a superset of the k
  // greatest (at most k + k/2 + 1 items: every item not yet dropped), in arrival order when
  // Greater has a primary key. Every item at or above the k-th greatest seen so far is in it.
  std::span<const T> held() const { return {items_.data(), n_}; }
  uint64_t seen() const { return seen_; }
  bool capped() const { return seen_ > k_; }
  size_t k() const { return k_; }

  // How many compactions found the kept histogram wrong and counted afresh: 0 unless TopK has a
  // bug (tests check it).
  uint64_t recounts() const { return recounts_; }

  // Buffers of at least this many items keep their histogram between compactions (a smaller
  // one would spend more on the 15 KB histogram than on its items).
  static constexpr size_t kHistMinK = 512;

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
      if (hist_) compact_with_histogram();
      else compact_by_primary();
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
    // A buffer big enough to keep its histogram starts it here, from this compaction's: the
    // kept items are those of the buckets above b and the m chosen from b.
    if (k_ >= kHistMinK && k_ <= UINT32_MAX / 2) start_histogram(lo, hist, b, static_cast<uint32_t>(m));
  }

  // The kept histogram: for j >= hist_lo_, hist_[j] counts the held items whose key - base_
  // falls in bucket j; no held item (and so no accepted one: the threshold is in hist_lo_) is
  // below hist_lo_, and entries below it are stale, never read.
  void start_histogram(uint64_t base, const uint32_t* hist, unsigned b, uint32_t m) {
    if (!hist_) hist_ = std::make_unique<uint32_t[]>(kBuckets);
    base_ = base;
    hist_[b] = m;
    std::copy(hist + b + 1, hist + kBuckets, hist_.get() + b + 1);
    hist_lo_ = b;
  }

  // The smallest and largest x (key - base) of bucket b: the inverse of bucket_of.
  static uint64_t bucket_first(unsigned b) {
    if (b < (2U << kExactBits)) return b;
    const unsigned drop = (b >> kExactBits) - 1;
    return static_cast<uint64_t>(b - (drop << kExactBits)) << drop;
  }
  static uint64_t bucket_last(unsigned b) {
    if (b < (2U << kExactBits)) return b;
    const unsigned drop = (b >> kExactBits) - 1;
    return bucket_first(b) + ((uint64_t{1} << drop) - 1);
  }

  // compact_by_primary() once the histogram is kept:
  // (1) from hist_lo_ up, the bucket b that holds the k-th greatest item (the buckets passed
  //     hold only dropped items; nothing reads below hist_lo_ again, so they are left as is);
  // (2) one pass over the items, comparing keys with b's key range, gathers b's items;
  // (3) as before, the k - above first of them by Greater (earlier first among equal items) are
  //     kept, the last is the threshold;
  // (4) one pass keeps, in arrival order, the items above b's range and the chosen ones.
  // When b's items were many (coarse buckets far above base_) and b is not an exact bucket, the
  // histogram is rebuilt relative to the new threshold's key (one pass over the k kept items),
  // so the next cut falls in finer buckets.
  void compact_with_histogram() {
    const size_t n = n_;
    uint32_t* const hist = hist_.get();
    size_t below = 0;
    unsigned b = hist_lo_;
    const size_t drop_count = n - k_;  // items to drop: the (drop_count + 1)-th smallest is the cut
    // Left stale: never read again. (The histogram holds n items, more than drop_count: b stops
    // at a bucket that holds some; the bound only keeps a broken count inside the array.)
    while (below + hist[b] <= drop_count && b + 1 < kBuckets) below += hist[b++];
    if (below + hist[b] > n) return recount();
    const size_t in_b = hist[b];
    const size_t above = n - below - in_b;
    const uint64_t key_lo = base_ + bucket_first(b);
    const uint64_t width = bucket_last(b) - bucket_first(b);  // key in b: key - key_lo <= width
    // The top bucket's range may end past 2^64 - 1 once base_ is added: the last key is then the largest.
    const uint64_t key_hi = UINT64_MAX - key_lo < width ? UINT64_MAX : key_lo + width;
    Scratch& s = scratch();
    const T* const in = items_.data();
    // Positions of b's items, without a branch per item (whether an item is in b is as good as
    // random: a branch on it mispredicts often).
    if (s.at.size() < n) s.at.resize(n);
    uint32_t* const at = s.at.data();
    size_t n_cut = 0;
    for (size_t i = 0; i < n; ++i) {
      at[n_cut] = static_cast<uint32_t>(i);
      n_cut += Greater::primary(in[i]) - key_lo <= width ? 1 : 0;
    }
    // The histogram's count of b must be what the items say, and the cut must fall inside b.
    if (n_cut != in_b || above >= k_ || k_ - above > in_b) return recount();
    auto& cut = s.cut;
    cut.clear();
    for (size_t j = 0; j < n_cut; ++j) cut.emplace_back(in[at[j]], at[j]);
    const auto m = static_cast<std::ptrdiff_t>(k_ - above);  // 1 ..= in_b
    const Greater greater = greater_;
    std::nth_element(cut.begin(), cut.begin() + (m - 1), cut.end(), [greater](const auto& x, const auto& y) {
      if (greater(x.first, y.first)) return true;
      return !greater(y.first, x.first) && x.second < y.second;
    });
    threshold_ = cut[static_cast<size_t>(m - 1)].first;
    if (s.chosen.size() < n) s.chosen.resize(n);
    uint8_t* const chosen = s.chosen.data();
    std::memset(chosen, 0, n);
    for (std::ptrdiff_t j = 0; j < m; ++j) chosen[cut[static_cast<size_t>(j)].second] = 1;
    // Branch-free keep pass, as in compact_by_primary.
    size_t i = 0;
    while (i < n && (Greater::primary(in[i]) > key_hi || chosen[i])) ++i;
    T* const out = items_.data();
    size_t kept = i;
    for (; i < n; ++i) {
      out[kept] = in[i];
      kept += static_cast<size_t>(Greater::primary(in[i]) > key_hi) | chosen[i];  // `|`: no branch
    }
    n_ = kept;  // == k
    hist[b] = static_cast<uint32_t>(m);
    hist_lo_ = b;
    if (in_b > k_ / 4 && b >= (2U << kExactBits)) rebase_histogram();
  }

  // A histogram that disagrees with the items (a bug: no input can cause it) must not cost
  // more than this compaction: it is dropped, and compact_by_primary() counts the items afresh
  // and starts it again.
  void recount() {
    ++recounts_;
    hist_.reset();
    compact_by_primary();
  }

  // The histogram again, relative to the threshold's key (a lower bound of every held key).
  void rebase_histogram() {
    base_ = Greater::primary(threshold_);
    uint32_t* const hist = hist_.get();
    std::fill(hist, hist + kBuckets, 0U);
    unsigned lowest = kBuckets - 1;
    for (size_t i = 0; i < n_; ++i) {
      const unsigned bk = bucket_of(Greater::primary(items_[i]) - base_);
      ++hist[bk];
      lowest = std::min(lowest, bk);
    }
    hist_lo_ = lowest;
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
    std::vector<uint8_t> chosen;  // compact_with_histogram: the cut items kept, by position
    std::vector<uint32_t> at;     // compact_with_histogram: the cut items' positions
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
  // The kept histogram (k >= kHistMinK, from the first compaction on; null before and for
  // smaller buffers): bucket counts of key - base_ over the held items.
  std::unique_ptr<uint32_t[]> hist_;
  uint64_t base_ = 0;
  unsigned hist_lo_ = 0;
  uint64_t recounts_ = 0;
};

}  // namespace ingero
