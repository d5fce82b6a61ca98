// TopK (engine/top_k.h) against the binary heap it replaced, on randomized streams with ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/top_k.h"
#include "tests/util/top_k_reference.h"

namespace ingero {
namespace {

struct Item {
  uint64_t dur, ts, id;
  bool operator==(const Item& o) const { return dur == o.dur && ts == o.ts && id == o.id; }
};
struct Greater {
  bool operator()(const Item& a, const Item& b) const {
    if (a.dur != b.dur) return a.dur > b.dur;
    if (a.ts != b.ts) return a.ts > b.ts;
    return a.id > b.id;
  }
};

using test::heap_top_k;

std::vector<Item> sorted(std::vector<Item> v) {
  std::sort(v.begin(), v.end(), Greater{});
  return v;
}

TEST(TopK, EqualsTheHeapOnRandomStreams) {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 400; ++round) {
    const size_t k = 1 + rng() % 64;
    const size_t n = rng() % 2000;
    const uint64_t spread = 1 + rng() % (round % 3 == 0 ? 4 : 100000);  // many ties sometimes
    std::vector<Item> in;
    for (size_t i = 0; i < n; ++i) in.push_back({rng() % spread, rng() % spread, rng() % 3});
    if (round % 5 == 0) std::sort(in.begin(), in.end(), [](auto& a, auto& b) { return a.ts < b.ts; });
    if (round % 7 == 0) std::sort(in.begin(), in.end(), Greater{});  // worst case: ascending reject
    TopK<Item, Greater> top(k);
    for (const auto& x : in) top.add(x);
    const auto ref = heap_top_k(in, k, Greater{});
    ASSERT_EQ(top.seen(), n);
    ASSERT_EQ(top.capped(), n > k);
    if (n <= k) {
      ASSERT_EQ(top.items(), in) << "arrival order kept under the cap";
    } else {
      ASSERT_EQ(sorted(top.items()), sorted(ref)) << "round " << round << " k " << k << " n " << n;
    }
  }
}

TEST(TopK, ItemsCanBeReadThenAddedTo) {
  TopK<Item, Greater> top(3);
  for (uint64_t i = 0; i < 10; ++i) top.add({i, i, 0});
  EXPECT_EQ(sorted(top.items()), (std::vector<Item>{{9, 9, 0}, {8, 8, 0}, {7, 7, 0}}));
  top.add({100, 0, 0});
  top.add({1, 0, 0});
  EXPECT_EQ(sorted(top.items()), (std::vector<Item>{{100, 0, 0}, {9, 9, 0}, {8, 8, 0}}));
}

}  // namespace
}  // namespace ingero
