#include <gtest/gtest.h>

#include "operators/window.h"

namespace ingero {
namespace {

struct Count {
  int n = 0;
};

WindowNode tumbling(uint64_t size) {
  WindowNode w;
  w.kind = WindowKind::kTumbling;
  w.size_ns = w.slide_ns = size;
  return w;
}

TEST(Window, TumblingAssignsByStartTime) {
  WindowAssigner a(tumbling(10));
  std::vector<uint64_t> ks;
  a.assign(25, [&](uint64_t k) { ks.push_back(k); });
  EXPECT_EQ(ks, std::vector<uint64_t>{2});
  EXPECT_EQ(a.start(2), 20u);
  EXPECT_EQ(a.end(2), 30u);
}

TEST(Window, SlidingEventInEveryOverlappingWindow) {
  WindowNode w;
  w.kind = WindowKind::kSliding;
  w.size_ns = 10;
  w.slide_ns = 5;
  WindowAssigner a(w);
  std::vector<uint64_t> ks;
  a.assign(12, [&](uint64_t k) { ks.push_back(k); });
  EXPECT_EQ(ks, (std::vector<uint64_t>{1, 2}));  // [5,15) and [10,20)
  ks.clear();
  a.assign(3, [&](uint64_t k) { ks.push_back(k); });
  EXPECT_EQ(ks, std::vector<uint64_t>{0});
}

TEST(Window, ClosesOnWatermarkInKeyOrder) {
  WindowStore<Count> s(tumbling(10), 0);
  KeyBy by({Field::kPid});
  Event e;
  for (uint32_t pid : {3u, 1u, 2u}) {
    e.pid = pid;
    e.ts_ns = 5;
    ASSERT_TRUE(s.add(e.ts_ns, by.key_of(e), [](uint64_t, Count& c) { ++c.n; }));
  }
  std::vector<uint32_t> order;
  s.close(9, [&](uint64_t, uint64_t, uint64_t, const Key& k, Count&) { order.push_back(k.pid()); });
  EXPECT_TRUE(order.empty()) << "window [0,10) must stay open below watermark 10";
  s.close(10, [&](uint64_t, uint64_t, uint64_t, const Key& k, Count&) { order.push_back(k.pid()); });
  EXPECT_EQ(order, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(s.open_windows(), 0u);
}

TEST(Window, LatenessDelaysClosing) {
  WindowStore<Count> s(tumbling(10), 5);
  s.add(1, Key{}, [](uint64_t, Count& c) { ++c.n; });
  int closed = 0;
  s.close(14, [&](auto...) { ++closed; });
  EXPECT_EQ(closed, 0);
  s.close(15, [&](auto...) { ++closed; });
  EXPECT_EQ(closed, 1);
}

TEST(Window, LateEventsAreRejectedNotReopened) {
  WindowStore<Count> s(tumbling(10), 0);
  s.add(15, Key{}, [](uint64_t, Count& c) { ++c.n; });
  s.close(20, [](auto...) {});
  EXPECT_FALSE(s.add(12, Key{}, [](uint64_t, Count& c) { ++c.n; }));
  EXPECT_TRUE(s.add(25, Key{}, [](uint64_t, Count& c) { ++c.n; }));
}

TEST(Window, OutOfOrderEventsWithinOpenWindowsAreKept) {
  WindowStore<Count> s(tumbling(10), 0);
  for (uint64_t ts : {17u, 3u, 12u, 8u}) s.add(ts, Key{}, [](uint64_t, Count& c) { ++c.n; });
  std::vector<int> counts;
  s.close_all([&](uint64_t, uint64_t, uint64_t, const Key&, Count& c) { counts.push_back(c.n); });
  EXPECT_EQ(counts, (std::vector<int>{2, 2}));
}

TEST(Window, EmptyWindowsEmitNothing) {
  WindowStore<Count> s(tumbling(10), 0);
  s.add(5, Key{}, [](uint64_t, Count& c) { ++c.n; });
  s.add(95, Key{}, [](uint64_t, Count& c) { ++c.n; });
  std::vector<uint64_t> ks;
  s.close_all([&](uint64_t k, auto...) { ks.push_back(k); });
  EXPECT_EQ(ks, (std::vector<uint64_t>{0, 9}));
}

TEST(Window, WholeTraceWindowClosesOnlyAtTheEnd) {
  WindowNode w;
  w.kind = WindowKind::kWhole;
  WindowStore<Count> s(w, 0);
  s.add(5, Key{}, [](uint64_t, Count& c) { ++c.n; });
  int closed = 0;
  s.close(UINT64_MAX - 1, [&](auto...) { ++closed; });
  EXPECT_EQ(closed, 0);
  s.close(UINT64_MAX, [&](auto...) { ++closed; });
  EXPECT_EQ(closed, 1);
}

TEST(KeyBy, OnlyNamedFieldsAndTotalOrder) {
  KeyBy by({Field::kPid, Field::kOp});
  Event a, b;
  a.pid = b.pid = 7;
  a.tid = 1;
  b.tid = 2;
  a.source = b.source = Source::kCuda;
  a.op = b.op = 3;
  EXPECT_EQ(by.key_of(a), by.key_of(b));
  EXPECT_EQ(by.key_of(a).op(), 3);
  EXPECT_EQ(by.key_of(a).source(), Source::kCuda);  // op implies its source
  EXPECT_EQ(by.key_of(a).tid(), 0u);
  b.rank = 5;
  KeyBy by_rank({Field::kRank});
  EXPECT_EQ(by_rank.key_of(b).rank(), 5);
  a.rank = -1;
  EXPECT_EQ(by_rank.key_of(a).rank(), -1);
}

TEST(KeyBy, ShardOfIsStableAndInRange) {
  for (uint32_t pid = 0; pid < 1000; ++pid) {
    EXPECT_LT(shard_of(pid, 3), 3u);
    EXPECT_EQ(shard_of(pid, 3), shard_of(pid, 3));
  }
  EXPECT_EQ(shard_of(1234, 1), 0u);
}

}  // namespace
}  // namespace ingero
