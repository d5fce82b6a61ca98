#include <gtest/gtest.h>

#include <cmath>

#include "operators/interval_join.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

Event span(uint64_t ts, uint64_t dur, uint64_t id, uint64_t arg0 = 0) { return test::span_event(ts, dur, id, arg0); }

TEST(IntervalJoin, OverlapIsAUnionPerCall) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  j.add_right(1, span(100, 50, 1));     // [100,150)
  j.add_right(1, span(120, 50, 2));     // [120,170) overlaps the first
  j.add_right(1, span(300, 10, 3));     // outside
  const auto r = j.probe(1, 110, 200);  // call [110,200)
  EXPECT_EQ(r.overlap_ns, 60u);         // [110,170)
  EXPECT_EQ(r.right_ids, (std::vector<uint64_t>{1, 2}));
}

TEST(IntervalJoin, KeysAreSeparate) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  j.add_right(2, span(100, 50, 1));  // another thread
  EXPECT_EQ(j.probe(1, 100, 150).overlap_ns, 0u);
  EXPECT_TRUE(j.probe(1, 100, 150).right_ids.empty());
}

TEST(IntervalJoin, TouchingIsNotOverlapping) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  j.add_right(1, span(200, 50, 1));
  EXPECT_TRUE(j.probe(1, 100, 200).right_ids.empty());
}

TEST(IntervalJoin, LongSpanStartingEarlyIsFound) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  j.add_right(1, span(0, 1000, 1));
  for (uint64_t i = 0; i < 100; ++i) j.add_right(1, span(10 + i, 1, 100 + i));
  const auto r = j.probe(1, 900, 950);
  EXPECT_EQ(r.overlap_ns, 50u);
  EXPECT_EQ(r.right_ids, std::vector<uint64_t>{1});
}

TEST(IntervalJoin, OutOfOrderInsertStaysSorted) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  j.add_right(1, span(500, 10, 2));
  j.add_right(1, span(100, 10, 1));  // arrives late (a span closed by a switch-in)
  EXPECT_EQ(j.probe(1, 95, 115).right_ids, std::vector<uint64_t>{1});
}

// Spans that start at the same instant are listed by id whatever order they were added in: a pid
// shard adds its own host-wide events before those another shard owns, a one-thread run in batch
// order, and a join's exemplar keeps only the first five ids (engine_parity_fuzz found four
// threads naming other retransmits than one thread did).
TEST(IntervalJoin, SpansStartingTogetherAreListedById) {
  for (const JoinKind kind : {JoinKind::kWithin, JoinKind::kOverlap}) {
    IntervalJoin j(kind, 100);
    j.add_right(0, span(1000, 20, 9));
    j.add_right(0, span(1000, 20, 4));
    j.add_right(0, span(900, 500, 7));  // earlier start: first, whatever its id
    j.add_right(0, span(1000, 20, 6));
    j.add_right(0, span(1050, 20, 1));
    j.add_right(0, span(1050, 20, 3));
    j.add_right(0, span(1050, 20, 2));
    const auto r = j.probe(0, 990, 1100);
    EXPECT_EQ(r.right_ids, (std::vector<uint64_t>{7, 4, 6, 9, 1, 2, 3}))
        << (kind == JoinKind::kWithin ? "within" : "overlap");
  }
  // Across blocks (256 spans each): a run of equal starts split between two blocks.
  IntervalJoin big(JoinKind::kOverlap, 0);
  for (uint64_t i = 0; i < 250; ++i) big.add_right(0, span(i, 1, 10000 + i));
  for (uint64_t id = 20; id > 0; --id) big.add_right(0, span(5000, 10, id));
  std::vector<uint64_t> want;
  for (uint64_t id = 1; id <= 20; ++id) want.push_back(id);
  EXPECT_EQ(big.probe(0, 5000, 5010).right_ids, want);
}

// A horizon: spans starting at or after it do not count, whatever they overlap; one starting just
// before it counts whole (its overlap is not cut at the horizon).
TEST(IntervalJoin, SpansFromTheHorizonOnDoNotCount) {
  IntervalJoin over(JoinKind::kOverlap, 0);
  over.add_right(1, span(100, 50, 1));  // [100, 150)
  over.add_right(1, span(199, 20, 2));  // [199, 219): starts just before the horizon
  over.add_right(1, span(200, 10, 3));  // at the horizon
  over.add_right(1, span(250, 10, 4));
  const auto r = over.probe(1, 90, 300, IntervalJoin::kAllTags, 200);
  EXPECT_EQ(r.right_ids, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(r.overlap_ns, 70u);                                                      // 50 + 20
  EXPECT_EQ(over.probe(1, 90, 300).right_ids, (std::vector<uint64_t>{1, 2, 3, 4}));  // no horizon
  EXPECT_TRUE(over.probe(1, 90, 300, IntervalJoin::kAllTags, 100).right_ids.empty());

  IntervalJoin within(JoinKind::kWithin, 100);
  within.add_right(0, span(1150, 0, 1));  // instants after the call, inside `within`
  within.add_right(0, span(1160, 0, 2));
  EXPECT_EQ(within.probe(0, 1000, 1100, IntervalJoin::kAllTags, 1160).right_ids, std::vector<uint64_t>{1});
  const auto none = within.probe(0, 1000, 1100, IntervalJoin::kAllTags, 1150);
  EXPECT_TRUE(none.right_ids.empty());
  EXPECT_EQ(none.overlap_ns, 0u);
}

TEST(IntervalJoin, WithinCountsInstantsNearTheCall) {
  IntervalJoin j(JoinKind::kWithin, 100);
  j.add_right(0, span(1150, 0, 1, 4096));  // 50 after the call ends
  j.add_right(0, span(2000, 0, 2));        // too far
  const auto r = j.probe(0, 1000, 1100);
  EXPECT_EQ(r.right_ids, std::vector<uint64_t>{1});
  EXPECT_EQ(r.overlap_ns, 100u);  // a hit covers the whole call
  EXPECT_EQ(r.sum_arg0, 4096u);
}

TEST(IntervalJoin, EvictionBoundsMemory) {
  IntervalJoin j(JoinKind::kOverlap, 0);
  for (uint64_t i = 0; i < 1000; ++i) j.add_right(i % 4, span(i * 10, 5, i));
  j.evict(10000, 100);  // keep spans ending at or after 9900
  EXPECT_LT(j.buffered(), 20u);
  EXPECT_GT(j.evicted(), 980u);
  j.evict(UINT64_MAX, 0);  // the final watermark never evicts: windows close first
  EXPECT_GT(j.buffered(), 0u);
}

TEST(JoinOutcome, ShareAndExemplars) {
  JoinOutcome o;
  ProbeResult hit;
  hit.overlap_ns = 80;
  hit.right_ids = {7};
  ProbeResult miss;
  o.add(1, 100, hit, 2);
  o.add(2, 100, miss, 2);
  ProbeResult bigger;
  bigger.overlap_ns = 95;
  bigger.right_ids = {8, 9};
  o.add(3, 100, bigger, 2);
  EXPECT_EQ(o.calls, 3u);
  EXPECT_EQ(o.hit_calls, 2u);
  EXPECT_EQ(o.tail_ns, 300u);
  EXPECT_EQ(o.overlap_ns, 175u);
  EXPECT_NEAR(o.share(), 175.0 / 300.0, 1e-12);
  ASSERT_EQ(o.exemplars.size(), 2u);
  EXPECT_EQ(o.exemplars[0].call_id, 3u);  // longest overlap first
  EXPECT_EQ(o.right_ids.size(), 3u);
  JoinOutcome empty;
  EXPECT_TRUE(std::isnan(empty.share()));
}

}  // namespace
}  // namespace ingero
