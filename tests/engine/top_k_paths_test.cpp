// TopK (engine/top_k.h): the append path (slots grown out of line, reused after items()) and the
// log-linear histogram compaction with a primary key, against the heap reference
// (tests/util/top_k_reference.h) and an exact arrival-order model: the kept items must be, in
// arrival order, the earliest copies of the reference's multiset. Streams with heavy ties,
// all-equal primaries, keys anywhere in 64 bits, time-ordered calls like the engine's, and
// k = 1, 2, 3 and large.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "engine/top_k.h"
#include "tests/util/top_k_reference.h"

namespace ingero {
namespace {

struct Item {
  uint64_t dur, ts, id, seq;  // seq: arrival position, not part of the order
};
using Value = std::tuple<uint64_t, uint64_t, uint64_t>;
Value value(const Item& x) { return {x.dur, x.ts, x.id}; }

// Slowest first: duration, then time, then id (Slower's shape). Equal in all three: equal both
// ways, and interchangeable for the order (seq is only the test's bookkeeping).
struct Greater {
  static uint64_t primary(const Item& x) { return x.dur; }
  bool operator()(const Item& a, const Item& b) const { return value(a) > value(b); }
};
struct GreaterPlain {  // the same order, no primary key: the nth_element compaction
  bool operator()(const Item& a, const Item& b) const { return value(a) > value(b); }
};

// What the kept items must be, in arrival order: of each value the reference keeps c times, the
// first c copies in the stream.
std::vector<uint64_t> expected_seqs(const std::vector<Item>& in, size_t k) {
  std::map<Value, size_t> want;
  for (const auto& x : test::heap_top_k(in, k, Greater{})) ++want[value(x)];
  std::vector<uint64_t> seqs;
  for (const auto& x : in) {
    auto it = want.find(value(x));
    if (it != want.end() && it->second > 0) {
      --it->second;
      seqs.push_back(x.seq);
    }
  }
  return seqs;
}
std::vector<uint64_t> seqs_of(const std::vector<Item>& v) {
  std::vector<uint64_t> s;
  s.reserve(v.size());
  for (const auto& x : v) s.push_back(x.seq);
  return s;
}
std::vector<Value> sorted_values(const std::vector<Item>& v) {
  std::vector<Value> s;
  s.reserve(v.size());
  for (const auto& x : v) s.push_back(value(x));
  std::sort(s.begin(), s.end());
  return s;
}

// Duration generators: each makes a different histogram shape for the compaction.
enum class Shape { kAllEqual, kFewValues, kNarrowHigh, kAnywhere, kExactRegion, kSmallRange, kCyclic, kTailed, kCount };

std::vector<Item> make_stream(std::mt19937_64& rng, Shape shape, size_t n, bool time_ordered) {
  std::vector<Item> in;
  in.reserve(n);
  const uint64_t base = rng() % 1000000;
  const uint64_t period = 1 + rng() % 300;
  for (size_t i = 0; i < n; ++i) {
    uint64_t dur = 0;
    switch (shape) {
      case Shape::kAllEqual: dur = base; break;
      case Shape::kFewValues: dur = base + rng() % 3; break;
      case Shape::kNarrowHigh: dur = UINT64_MAX - rng() % 50; break;
      case Shape::kAnywhere: dur = rng() >> (rng() % 64); break;
      case Shape::kExactRegion: dur = rng() % 64; break;
      case Shape::kSmallRange: dur = base + rng() % 300; break;                        // across the exact buckets' end
      case Shape::kCyclic: dur = 2000 + (i % period) * 2654435761ULL % 100000; break;  // like the trace generator
      case Shape::kTailed: dur = rng() % 100 == 0 ? 1000000 + rng() % 20000000 : 2000 + rng() % 100000; break;
      case Shape::kCount: break;
    }
    // Time-ordered streams (the engine's calls) make every later tie on the duration greater;
    // otherwise times and ids repeat, so whole items repeat (equal both ways).
    const uint64_t ts = time_ordered ? i : rng() % 4;
    in.push_back({dur, ts, time_ordered ? rng() : rng() % 2, i});
  }
  return in;
}

// One stream through TopK with and without the primary key, reading items() at a few points.
void check_stream(const std::vector<Item>& in, size_t k, const std::string& what) {
  TopK<Item, Greater> top(k);
  TopK<Item, GreaterPlain> plain(k);
  std::vector<Item> prefix;
  for (const auto& x : in) {
    top.add(x);
    plain.add(x);
    prefix.push_back(x);
    if (x.seq % 1999 == 1998) {  // items() compacts and frees slots; later adds reuse them
      ASSERT_EQ(seqs_of(top.items()), expected_seqs(prefix, k)) << what << " midway at " << x.seq;
      ASSERT_EQ(sorted_values(plain.items()), sorted_values(top.items())) << what << " midway at " << x.seq;
    }
  }
  ASSERT_EQ(top.seen(), in.size());
  ASSERT_EQ(top.capped(), in.size() > k);
  ASSERT_EQ(top.recounts(), 0u) << what << ": the kept histogram disagreed with the items";
  const auto& got = top.items();
  ASSERT_EQ(got.size(), std::min(k, in.size())) << what;
  ASSERT_EQ(seqs_of(got), expected_seqs(in, k)) << what;
  ASSERT_EQ(sorted_values(plain.items()), sorted_values(got)) << what;
}

// `rounds` streams: round r has shape r % kCount, k from `ks` (one k per block of kCount rounds),
// n_of(rng, k) items, in time order when ordered(r).
template <class NOf, class Ordered>
void check_rounds(uint64_t seed, const std::vector<size_t>& ks, int rounds, NOf n_of, Ordered ordered) {
  std::mt19937_64 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    const auto shape = static_cast<Shape>(round % static_cast<int>(Shape::kCount));
    const size_t k = ks[static_cast<size_t>(round / static_cast<int>(Shape::kCount)) % ks.size()];
    const size_t n = n_of(rng, k);
    const bool time_ordered = ordered(round);
    const auto in = make_stream(rng, shape, n, time_ordered);
    check_stream(in, k,
                 "round " + std::to_string(round) + " shape " + std::to_string(static_cast<int>(shape)) + " k " +
                     std::to_string(k) + " n " + std::to_string(n) + (time_ordered ? " time-ordered" : " repeating"));
  }
}

TEST(TopKPaths, EqualsTheReferenceInArrivalOrderOnEveryShape) {
  check_rounds(
      20261123, {1, 2, 3, 4, 7, 64, 100, 1000}, 240,
      [](std::mt19937_64& rng, size_t k) { return rng() % (k * 8 + 50); },
      [](int round) { return (round / 3) % 2 == 0; });
}

TEST(TopKPaths, LargeKOnEngineLikeStreams) {
  // The engine's shape: calls in time order, k in the thousands, durations cycling (every later
  // tie beats the threshold) with a 1 % tail.
  std::mt19937_64 rng(5);
  for (const Shape shape : {Shape::kCyclic, Shape::kTailed, Shape::kAllEqual, Shape::kFewValues}) {
    const auto in = make_stream(rng, shape, 60000, true);
    check_stream(in, 4096, "shape " + std::to_string(static_cast<int>(shape)));
  }
}

TEST(TopKPaths, KeptHistogramEqualsTheReferenceOnEveryShape) {
  // k >= kHistMinK: compactions after the first read the cut off the histogram kept as items
  // are accepted. Every shape, both orders, k on both sides of the bound; items() is read (and
  // compacts) midway. kNarrowHigh puts keys where a bucket's range ends past 2^64.
  using Top = TopK<Item, Greater>;
  const std::vector<size_t> ks = {Top::kHistMinK - 1, Top::kHistMinK, Top::kHistMinK + 1, 700, 2048};
  check_rounds(
      20261124, ks, 2 * static_cast<int>(Shape::kCount) * static_cast<int>(ks.size()),
      [](std::mt19937_64& rng, size_t k) { return k * 6 + rng() % (k * 4); }, [](int round) { return round % 2 == 0; });
}

TEST(TopKPaths, KeptHistogramRebasesWhenItsCutBucketIsCoarse) {
  // The first compaction's smallest key is 1000, every later key is within 3000 of 10^12 (or of
  // 2^64, where the cut bucket's key range, 1000 + its x range, ends past 2^64): relative to 1000
  // they share a few coarse buckets, so the cut bucket holds most items until the histogram is
  // rebuilt relative to the threshold. Ascending, descending and random runs.
  std::mt19937_64 rng(11);
  const size_t k = 1024;
  for (int run = 0; run < 6; ++run) {
    const uint64_t center = run < 3 ? 1000000000000ULL : UINT64_MAX - 3000;
    std::vector<Item> in;
    in.push_back({1000, 0, 0, 0});
    for (uint64_t i = 1; i < 40000; ++i) {
      const uint64_t off = run % 3 == 0 ? i % 3000 : run % 3 == 1 ? 2999 - i % 3000 : rng() % 3000;
      in.push_back({center + off, i, rng(), i});
    }
    check_stream(in, k, "coarse run " + std::to_string(run));
  }
}

TEST(TopKPaths, AscendingAndDescendingStreams) {
  // Ascending: every item beats the threshold (the most compactions); descending: none does.
  for (const size_t k : {1, 2, 3, 50}) {
    std::vector<Item> up, down;
    for (uint64_t i = 0; i < 2000; ++i) {
      up.push_back({i / 3, i, 0, i});
      down.push_back({(2000 - i) / 3, 0, 0, i});
    }
    check_stream(up, k, "ascending k " + std::to_string(k));
    check_stream(down, k, "descending k " + std::to_string(k));
  }
}

TEST(TopKPaths, AnItemJustBelowWhatKHeldItemsReachIsKeptOnlyOnceTheyAreK) {
  // After the first compaction of an ascending block, `extra` items far above it, then one
  // probe item anywhere near the block's top k: the probe must be kept exactly when fewer than
  // k items beat it. (A drop rule that counts one item too few, or a bucket edge off by one,
  // fails here.)
  for (const size_t k : {8, 64, 200}) {
    const size_t limit = k + k / 2 + 1;  // the first compaction's size
    for (size_t extra = 0; extra <= k / 8 + 3; ++extra) {
      for (uint64_t probe = 1000 + limit - k - 2; probe <= 1000 + limit - k + k / 8 + 3; ++probe) {
        std::vector<Item> in;
        for (uint64_t i = 0; i < limit; ++i) in.push_back({1000 + i, in.size(), 0, in.size()});
        for (size_t i = 0; i < extra; ++i) in.push_back({1000000, in.size(), 0, in.size()});
        in.push_back({probe, in.size(), 0, in.size()});
        TopK<Item, Greater> top(k);
        for (const auto& x : in) top.add(x);
        ASSERT_EQ(seqs_of(top.items()), expected_seqs(in, k)) << "k " << k << " extra " << extra << " probe " << probe;
      }
    }
  }
}

TEST(TopKPaths, CopiesEqualBothWaysKeepTheEarliest) {
  // 100 copies of one item with k = 3 through several compactions: the first three copies.
  TopK<Item, Greater> top(3);
  for (uint64_t i = 0; i < 100; ++i) top.add({5, 5, 5, i});
  EXPECT_EQ(seqs_of(top.items()), (std::vector<uint64_t>{0, 1, 2}));
  top.add({5, 6, 0, 100});  // greater (later time): replaces the last copy
  EXPECT_EQ(seqs_of(top.items()), (std::vector<uint64_t>{0, 1, 100}));
}

TEST(TopKPaths, MemoryStaysAtKPlusHalf) {
  // A capped buffer holds k + k/2 + 1 slots (the doubling stops at k), whatever is read between.
  TopK<Item, Greater> top(16384);
  for (uint64_t i = 0; i < 16384; ++i) top.add({i % 777, i, 0, i});
  EXPECT_EQ(top.items().capacity(), 16384u) << "doubling up to k, as push_back";
  for (uint64_t i = 16384; i < 200000; ++i) {
    top.add({i % 777, i, 0, i});
    if (i % 50000 == 0) {
      EXPECT_EQ(top.items().size(), 16384u);
    }
  }
  EXPECT_EQ(top.items().size(), 16384u);
  EXPECT_EQ(top.items().capacity(), 16384u + 8192u + 1u);
}

TEST(TopKPaths, CallerReorderingItemsKeepsTheSet) {
  // CallBuffer sorts the returned items by time in place; adds after that must still keep the
  // k greatest.
  std::mt19937_64 rng(9);
  std::vector<Item> in;
  for (uint64_t i = 0; i < 5000; ++i) in.push_back({rng() % 300, rng() % 10, rng() % 2, i});
  TopK<Item, Greater> top(100);
  for (size_t i = 0; i < in.size(); ++i) {
    top.add(in[i]);
    if (i % 700 == 699) {
      auto& v = top.items();
      std::sort(v.begin(), v.end(), [](const Item& a, const Item& b) { return a.seq > b.seq; });
    }
  }
  EXPECT_EQ(sorted_values(top.items()), sorted_values(test::heap_top_k(in, 100, Greater{})));
}

}  // namespace
}  // namespace ingero
