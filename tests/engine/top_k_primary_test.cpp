// TopK (engine/top_k.h) with a primary key (Greater::primary): the compaction that selects on
// the keys and breaks ties among the items with the k-th key must keep the set the binary heap
// keeps, and keep the kept items in arrival order.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/top_k.h"
#include "tests/util/top_k_reference.h"

namespace ingero {
namespace {

struct Item {
  uint64_t dur, ts, id, seq;  // seq: arrival position, not part of the order
};
bool same(const Item& a, const Item& b) { return a.dur == b.dur && a.ts == b.ts && a.id == b.id; }

// Slowest first: duration, then time, then id. Items equal in all three compare equal both ways.
struct Greater {
  static uint64_t primary(const Item& x) { return x.dur; }
  bool operator()(const Item& a, const Item& b) const {
    if (a.dur != b.dur) return a.dur > b.dur;
    if (a.ts != b.ts) return a.ts > b.ts;
    return a.id > b.id;
  }
};
// The same order without a primary key: TopK's nth_element compaction.
struct GreaterPlain {
  bool operator()(const Item& a, const Item& b) const { return Greater{}(a, b); }
};

using test::heap_top_k;

// The items as a comparable list: sorted by the order, arrival positions dropped (items equal
// both ways are interchangeable).
std::vector<std::vector<uint64_t>> canonical(std::vector<Item> v) {
  std::sort(v.begin(), v.end(), Greater{});
  std::vector<std::vector<uint64_t>> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back({x.dur, x.ts, x.id});
  return out;
}

TEST(TopKPrimary, EqualsTheHeapAndKeepsArrivalOrder) {
  std::mt19937_64 rng(777);
  for (int round = 0; round < 600; ++round) {
    const size_t k = 1 + rng() % 80;
    const size_t n = rng() % 3000;
    // Durations from a narrow range make many primary ties; sometimes whole items repeat.
    const uint64_t dur_spread = 1 + rng() % (round % 3 == 0 ? 3 : (round % 3 == 1 ? 40 : 1000000));
    const uint64_t spread = 1 + rng() % (round % 4 == 0 ? 3 : 100000);
    std::vector<Item> in;
    // Some rounds put the keys anywhere in 64 bits, or in a narrow band far from zero (the
    // histogram's range and shift), or on a few values with one far outlier.
    const int mode = round % 11;
    for (size_t i = 0; i < n; ++i) {
      uint64_t dur = rng() % dur_spread;
      if (mode == 3) dur = rng() >> (rng() % 64);
      if (mode == 5) dur = UINT64_MAX - rng() % dur_spread;
      if (mode == 8 && rng() % 500 == 0) dur = UINT64_MAX;
      in.push_back({dur, rng() % spread, rng() % 3, 0});
    }
    if (round % 5 == 0) std::sort(in.begin(), in.end(), [](auto& a, auto& b) { return a.ts < b.ts; });
    if (round % 7 == 0) std::sort(in.begin(), in.end(), [](auto& a, auto& b) { return Greater{}(b, a); });
    for (size_t i = 0; i < n; ++i) in[i].seq = i;
    TopK<Item, Greater> top(k);
    TopK<Item, GreaterPlain> plain(k);
    for (const auto& x : in) {
      top.add(x);
      plain.add(x);
      // Read the items midway sometimes: items() compacts, later adds go on from there.
      if (x.seq % 997 == 996) {
        ASSERT_EQ(canonical(top.items()), canonical(plain.items())) << "round " << round;
      }
    }
    ASSERT_EQ(top.seen(), n);
    const auto& got = top.items();
    ASSERT_EQ(canonical(got), canonical(heap_top_k(in, k, Greater{}))) << "round " << round << " k " << k << " n " << n;
    ASSERT_EQ(canonical(got), canonical(plain.items())) << "round " << round;
    for (size_t i = 1; i < got.size(); ++i) ASSERT_LT(got[i - 1].seq, got[i].seq) << "arrival order, round " << round;
    for (size_t i = 0; i < got.size() && n <= k; ++i) ASSERT_TRUE(same(got[i], in[i]));
  }
}

TEST(TopKPrimary, RepeatedItemsFillTheCutExactly) {
  // Twenty copies of one item at the cut: exactly k items kept, the greater ones all in.
  TopK<Item, Greater> top(5);
  for (uint64_t i = 0; i < 20; ++i) top.add({7, 7, 1, i});
  top.add({9, 0, 0, 20});
  top.add({7, 8, 0, 21});
  for (uint64_t i = 0; i < 20; ++i) top.add({7, 7, 1, 22 + i});
  const auto& got = top.items();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].seq, 0u);  // copies of {7, 7, 1}, the earliest of them, in arrival order
  EXPECT_EQ(got[1].seq, 1u);
  EXPECT_EQ(got[2].seq, 2u);
  EXPECT_EQ(got[3].seq, 20u);  // {9, 0, 0}
  EXPECT_EQ(got[4].seq, 21u);  // {7, 8, 0}
}

}  // namespace
}  // namespace ingero
