// IntervalJoin's compact span storage (blocks of 12-byte spans, operators/interval_join.h
// "Storage") against a plain reference: the buffer as one start-sorted deque of full-width spans
// per key, with the same hit, eviction and prune rules written out directly. Random sequences of
// add_right (in and out of order, equal starts, instants, durations of 2^32 ns and more, start
// and id jumps that no block base can reach, non-zero arg0 arriving late), probe, evict and prune
// must give identical ProbeResults (ids in order) and counters after every step; half the runs
// on a tagged join (off-CPU states, tags arriving late too, a state past kMaxTag) probed with
// random tag masks. Plus the memory the storage promises for in-order spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <unordered_map>
#include <vector>

#include "operators/interval_join.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

// The reference: what IntervalJoin does, with every span kept as {ts, end, id, arg0, tag}.
class RefJoin {
 public:
  RefJoin(JoinKind kind, uint64_t within, bool tagged = false) : kind_(kind), within_(within), tagged_(tagged) {}

  void add_right(uint64_t key, const Event& e) {
    Buf& b = bufs_[key];
    const auto state = static_cast<unsigned>(e.prev_state);
    const unsigned tag = tagged_ ? std::min(state, unsigned{IntervalJoin::kMaxTag}) : 0;
    const S s{e.ts_ns, e.end_ns(), e.id, e.arg0, tag};
    auto it = std::upper_bound(b.spans.begin(), b.spans.end(), s.ts, [](uint64_t ts, const S& x) { return ts < x.ts; });
    b.spans.insert(it, s);
    b.max_dur = std::max(b.max_dur, s.end - s.ts);
    ++buffered_;
  }

  ProbeResult probe(uint64_t key, uint64_t call_ts, uint64_t call_end,
                    uint64_t tag_mask = IntervalJoin::kAllTags) const {
    ProbeResult r;
    auto it = bufs_.find(key);
    if (it == bufs_.end()) return r;
    const uint64_t lo = kind_ == JoinKind::kWithin ? (call_ts > within_ ? call_ts - within_ : 0) : call_ts;
    const uint64_t hi = kind_ == JoinKind::kWithin ? call_end + within_ : call_end;
    std::vector<std::pair<uint64_t, uint64_t>> pieces, hits;
    for (const S& s : it->second.spans) {  // every span: no search bound to get wrong
      const bool hit = s.end == s.ts ? (s.ts >= lo && s.ts <= hi) : (s.ts < hi && s.end > lo);
      if (!hit || !(tag_mask >> s.tag & 1)) continue;
      hits.emplace_back(s.ts, s.id);
      r.right_ns += s.end - s.ts;
      r.sum_arg0 += s.arg0;
      const uint64_t a = std::max(s.ts, call_ts), b = std::min(s.end, call_end);
      if (b > a) pieces.emplace_back(a, b);
    }
    // The ids in start order, equal starts by id (whatever order they were added in).
    std::sort(hits.begin(), hits.end());
    for (const auto& [ts, id] : hits) r.right_ids.push_back(id);
    if (kind_ == JoinKind::kWithin) {
      r.overlap_ns = r.right_ids.empty() ? 0 : call_end - call_ts;
      return r;
    }
    // The union of the pieces, by walking their sorted list.
    std::sort(pieces.begin(), pieces.end());
    uint64_t covered_to = 0;
    for (const auto& [a, b] : pieces) {
      const uint64_t from = std::max(a, covered_to);
      if (b > from) r.overlap_ns += b - from;
      covered_to = std::max(covered_to, b);
    }
    return r;
  }

  void evict(uint64_t watermark, uint64_t retain) {
    if (watermark == std::numeric_limits<uint64_t>::max()) return;
    for (auto& [key, b] : bufs_) {
      while (!b.spans.empty() && b.spans.front().end + retain < watermark) {
        b.spans.pop_front();
        --buffered_;
        ++evicted_;
      }
    }
  }

  void prune(uint64_t floor, const std::unordered_map<uint64_t, std::vector<IntervalJoin::CallRange>>& candidates) {
    const uint64_t reach = kind_ == JoinKind::kWithin ? within_ : 0;
    if (floor <= reach) return;
    const uint64_t below = floor - reach;
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    for (auto& [key, b] : bufs_) {
      const std::vector<IntervalJoin::CallRange>* calls = nullptr;
      if (auto c = candidates.find(key); c != candidates.end()) calls = &c->second;
      // Droppable: ends before `below` and meets no candidate's widened closed range.
      std::vector<bool> drop(b.spans.size());
      for (size_t i = 0; i < b.spans.size(); ++i) {
        const S& s = b.spans[i];
        bool met = false;
        if (calls) {
          for (const auto& call : *calls) {
            const uint64_t lo = call.ts > reach ? call.ts - reach : 0;
            const uint64_t hi = call.end > kMax - reach ? kMax : call.end + reach;
            met = met || (lo <= s.end && s.ts <= hi);
          }
        }
        drop[i] = s.end < below && !met;
      }
      // All or none per start.
      std::unordered_map<uint64_t, bool> start_kept;
      for (size_t i = 0; i < b.spans.size(); ++i) start_kept[b.spans[i].ts] = start_kept[b.spans[i].ts] || !drop[i];
      for (size_t i = 0; i < b.spans.size(); ++i) drop[i] = drop[i] && !start_kept[b.spans[i].ts];
      std::deque<S> kept;
      for (size_t i = 0; i < b.spans.size(); ++i) {
        if (drop[i]) {
          ++pruned_;
          --buffered_;
        } else {
          kept.push_back(b.spans[i]);
        }
      }
      b.spans.swap(kept);
    }
  }

  size_t buffered() const { return buffered_; }
  uint64_t evicted() const { return evicted_ + pruned_; }
  uint64_t pruned() const { return pruned_; }
  // The n-th span of a key in start order (for picking equal starts and probe ranges).
  const std::deque<uint64_t> starts(uint64_t key) const {
    std::deque<uint64_t> out;
    if (auto it = bufs_.find(key); it != bufs_.end()) {
      for (const S& s : it->second.spans) out.push_back(s.ts);
    }
    return out;
  }

 private:
  struct S {
    uint64_t ts, end, id, arg0;
    unsigned tag;
  };
  struct Buf {
    std::deque<S> spans;
    uint64_t max_dur = 0;
  };
  JoinKind kind_;
  uint64_t within_;
  bool tagged_;
  std::unordered_map<uint64_t, Buf> bufs_;
  size_t buffered_ = 0;
  uint64_t evicted_ = 0, pruned_ = 0;
};

using test::span_event;

constexpr uint64_t k2p32 = uint64_t{1} << 32;

// One random run: returns the number of probes that hit (so the caller can check the runs test
// something).
// With `spill`, the join spills sealed blocks to it (IntervalJoin "Spill").
size_t run_one(uint32_t seed, JoinKind kind, bool tagged, SpillFile* spill = nullptr) {
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  auto chance = [&](unsigned pct) { return pick(100) < pct; };
  const uint64_t within = kind == JoinKind::kWithin ? pick(3) * 500 : 0;
  IntervalJoin join(kind, within, tagged);
  join.set_spill(spill);
  RefJoin ref(kind, within, tagged);
  const unsigned keys = 1 + static_cast<unsigned>(pick(3));
  // Per run, how often each shape appears, so some runs are dense in one of them.
  const unsigned p_late = static_cast<unsigned>(pick(40)), p_equal = static_cast<unsigned>(pick(15));
  const unsigned p_long = static_cast<unsigned>(pick(6)), p_jump = static_cast<unsigned>(pick(3));
  const unsigned p_idgap = static_cast<unsigned>(pick(4)), p_instant = static_cast<unsigned>(pick(20));
  const size_t arg0_from = pick(3000);   // non-zero arg0 only from this step on (maybe never)
  const size_t state_from = pick(2000);  // states other than kUnknown (tag 0) from this step on
  const uint64_t t0 = chance(10) ? std::numeric_limits<uint64_t>::max() / 2 : 1'700'000'000'000'000'000ull;
  std::vector<uint64_t> now(keys, t0), next_id(keys, 1000 + pick(1u << 30));
  uint64_t watermark = t0;
  size_t hits = 0;
  const size_t steps = 1500 + pick(2500);
  for (size_t step = 0; step < steps; ++step) {
    const uint64_t key = pick(keys);
    const uint64_t r = pick(100);
    if (r < 70) {  // a span
      uint64_t ts = now[key] + pick(2000);
      if (chance(p_jump)) ts = now[key] + k2p32 + pick(3) * k2p32 - 1 + pick(3);  // past any block base
      if (chance(p_late)) ts = now[key] > 200'000 ? now[key] - pick(chance(20) ? 200'000 : 5000) : now[key];
      if (chance(p_equal)) {
        const auto st = ref.starts(key);
        if (!st.empty()) ts = st[pick(st.size())];
      }
      now[key] = std::max(now[key], ts);
      uint64_t dur = pick(3000);
      if (chance(p_instant)) dur = 0;
      if (chance(p_long)) dur = k2p32 - 2 + pick(4) + (chance(30) ? pick(k2p32) : 0);  // around and past 2^32 - 1
      uint64_t id = next_id[key]++;
      if (chance(p_idgap)) {  // ids at and past the 32-bit signed reach of a base, both ways
        const uint64_t gap = (uint64_t{1} << 31) - 2 + pick(4);
        id = chance(50) ? id + gap : id - gap;
        if (chance(30)) id = rng();
        if (chance(50)) next_id[key] = id + 1;
      }
      const uint64_t arg0 = step >= arg0_from && chance(30) ? 1 + pick(1u << 20) : 0;
      Event e = span_event(ts, dur, id, arg0);
      if (step >= state_from) e.prev_state = static_cast<OffCpuState>(chance(3) ? 70 : pick(5));
      join.add_right(key, e);
      ref.add_right(key, e);
    } else if (r < 93) {  // a probe near recent spans, or anywhere in the buffer
      uint64_t ts = now[key] > 10'000 ? now[key] - pick(10'000) : now[key];
      if (chance(30)) {
        const auto st = ref.starts(key);
        if (!st.empty()) ts = st[pick(st.size())] + pick(3) - 1;
      }
      const uint64_t end = ts + (chance(10) ? 0 : pick(chance(5) ? 2 * k2p32 : 3000));
      // Every tag, or a random subset (bit 63: the tag of every state past kMaxTag).
      const uint64_t mask = chance(40) ? IntervalJoin::kAllTags : (pick(32) | (chance(20) ? uint64_t{1} << 63 : 0));
      const ProbeResult a = join.probe(key, ts, end, mask), b = ref.probe(key, ts, end, mask);
      EXPECT_EQ(a.right_ids, b.right_ids) << "seed " << seed << " step " << step;
      EXPECT_EQ(a.overlap_ns, b.overlap_ns) << "seed " << seed << " step " << step;
      EXPECT_EQ(a.right_ns, b.right_ns) << "seed " << seed << " step " << step;
      EXPECT_EQ(a.sum_arg0, b.sum_arg0) << "seed " << seed << " step " << step;
      hits += !b.right_ids.empty();
    } else if (r < 97) {  // evict at a rising watermark
      watermark = std::max(watermark, now[pick(keys)] - pick(20'000));
      const uint64_t retain = pick(3) * 1000;
      const uint64_t wm = chance(5) ? std::numeric_limits<uint64_t>::max() : watermark;  // the final one
      join.evict(wm, retain);
      ref.evict(wm, retain);
    } else {  // prune below a floor, keeping some calls' spans
      const uint64_t floor = now[pick(keys)] - pick(50'000);
      std::unordered_map<uint64_t, std::vector<IntervalJoin::CallRange>> cands;
      for (uint64_t k = 0; k < keys; ++k) {
        const size_t n = pick(20);
        for (size_t c = 0; c < n; ++c) {
          const uint64_t ts = floor > 100'000 ? floor - pick(100'000) : floor;
          cands[k].push_back({ts, ts + pick(chance(20) ? 0 : 4000)});
        }
      }
      auto copy = cands;
      join.prune(floor, copy);
      ref.prune(floor, cands);
    }
    EXPECT_EQ(join.buffered(), ref.buffered()) << "seed " << seed << " step " << step;
    EXPECT_EQ(join.evicted(), ref.evicted()) << "seed " << seed << " step " << step;
    EXPECT_EQ(join.pruned(), ref.pruned()) << "seed " << seed << " step " << step;
    if (::testing::Test::HasFailure()) return hits;
  }
  // At the end, every span of every key, through one probe over all time.
  for (uint64_t k = 0; k < keys; ++k) {
    EXPECT_EQ(join.probe(k, 0, std::numeric_limits<uint64_t>::max() - within).right_ids,
              ref.probe(k, 0, std::numeric_limits<uint64_t>::max() - within).right_ids)
        << "seed " << seed;
  }
  return hits;
}

TEST(IntervalJoinStorage, RandomSequencesMatchTheReference) {
  size_t hits = 0;
  for (uint32_t seed = 1; seed <= 120 && !HasFailure(); ++seed) {
    hits += run_one(seed, seed % 3 == 0 ? JoinKind::kWithin : JoinKind::kOverlap, seed % 2 == 0);
  }
  EXPECT_GT(hits, 10'000u);  // the probes found spans, so the ids compared are not all empty
}

// The same random sequences with sealed blocks in a spill file: every sealed block (a budget of
// one byte), or those past a budget of a few blocks (some in memory, some not). Probes, prunes
// and evictions read them back, out-of-order inserts and partial evictions bring them back into
// memory: the same answers and counts as the reference.
TEST(IntervalJoinStorage, SpilledBlocksMatchTheReference) {
  size_t hits = 0;
  uint64_t blocks_out = 0, reads = 0;
  for (uint32_t seed = 1; seed <= 80 && !HasFailure(); ++seed) {
    SpillFile spill(seed % 2 ? 1 : 16 << 10);
    hits += run_one(seed, seed % 3 == 0 ? JoinKind::kWithin : JoinKind::kOverlap, seed % 4 < 2, &spill);
    EXPECT_EQ(spill.counters().errors + spill.counters().read_errors, 0u) << "seed " << seed;
    blocks_out += spill.counters().blocks_out;
    reads += spill.counters().reads;
  }
  EXPECT_GT(hits, 5'000u);
  EXPECT_GT(blocks_out, 500u);  // the runs did spill, and read back
  EXPECT_GT(reads, 1'000u);
}

// Where no spill file can be made, the blocks stay in memory and every answer is the same.
TEST(IntervalJoinStorage, UnusableSpillDirectoryKeepsSpansInMemory) {
  uint64_t failed = 0;
  for (uint32_t seed = 1; seed <= 10 && !HasFailure(); ++seed) {
    SpillFile spill(1, "/nonexistent-dir-for-ingero-test");
    run_one(seed, JoinKind::kOverlap, seed % 2 == 0, &spill);
    EXPECT_EQ(spill.counters().blocks_out, 0u);
    EXPECT_LE(spill.counters().errors, 1u);  // one failed creation, then the file takes nothing
    failed += spill.counters().errors;
  }
  EXPECT_GT(failed, 5u);  // most runs sealed a block, and tried
}

// A long in-order run under a budget: the blocks in memory stay near the budget (plus the last
// block and the headers of spilled ones) while the spans in all grow, and every span is still found.
TEST(IntervalJoinStorage, SpillKeepsResidentBytesNearTheBudget) {
  constexpr size_t kBudget = 64 << 10;
  SpillFile spill(kBudget);
  IntervalJoin join(JoinKind::kOverlap, 0);
  join.set_spill(&spill);
  const size_t n = 200'000;
  for (size_t i = 0; i < n; ++i) join.add_right(7, span_event(1'000'000 + i * 1000, 400, 5000 + i, i % 3 ? 0 : 9));
  ASSERT_EQ(join.buffered(), n);
  EXPECT_GT(join.spilled_blocks(), 500u);
  EXPECT_LE(spill.resident(), kBudget + 8192);
  // Headers of ~780 blocks (under 200 bytes each, with the blocks vector) and one open block.
  EXPECT_LT(join.span_bytes(), kBudget + 8192 + 200 * (n / 256));
  const ProbeResult all = join.probe(7, 0, 1'000'000 + n * 1000);
  ASSERT_EQ(all.right_ids.size(), n);
  EXPECT_EQ(all.right_ids.front(), 5000u);
  EXPECT_EQ(all.right_ids.back(), 5000 + n - 1);
  EXPECT_EQ(all.sum_arg0, 9 * ((n + 2) / 3));
  EXPECT_EQ(all.right_ns, 400 * n);
}

// The in-order case the engine feeds most (off-CPU spans of one thread, arg0 0): 12 bytes a span
// plus the blocks' headers, against 24 bytes for full-width spans.
TEST(IntervalJoinStorage, InOrderSpansTakeAboutTwelveBytes) {
  IntervalJoin join(JoinKind::kOverlap, 0);
  const size_t n = 100'000;
  for (size_t i = 0; i < n; ++i) join.add_right(7, span_event(1'000'000 + i * 1000, 400 + i % 300, 5000 + 3 * i, 0));
  ASSERT_EQ(join.buffered(), n);
  const double per_span = static_cast<double>(join.span_bytes()) / static_cast<double>(n);
  EXPECT_GE(per_span, 12.0);
  EXPECT_LT(per_span, 13.0);
  // And a non-zero arg0 costs 8 bytes a span in the blocks given one, not in the others.
  IntervalJoin io(JoinKind::kOverlap, 0);
  for (size_t i = 0; i < n; ++i)
    io.add_right(7, span_event(1'000'000 + i * 1000, 400, 5000 + i, i >= n / 2 ? 4096 : 0));
  const double io_per_span = static_cast<double>(io.span_bytes()) / static_cast<double>(n);
  EXPECT_GT(io_per_span, 15.5);
  EXPECT_LT(io_per_span, 17.0);
}

}  // namespace
}  // namespace ingero
