// ChainRecordSeries (operators/chain_annotate.h), the compact per-thread store of the chain
// annotator, against the structure it replaced: a std::deque of records kept sorted by start time
// (late records inserted after their equals), popped from the front, and queried by binary search
// for the records that start in [start, end). Randomized: in-order and late inserts (inside the
// open tail and deep inside sealed blocks), equal timestamps, durations over 32 bits, stack tuples
// beyond the series' table, pops to empty and back, and window queries after every step. The same
// runs again with a SpillFile (operators/spill_file.h) that takes sealed blocks beyond a small
// resident budget, and with drop_before() beside pop_front(); and the SpillFile on its own: slot
// reuse, a directory it cannot use, and writes the file-size limit refuses (nothing accepted lost).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "operators/chain_annotate.h"
#include "operators/spill_file.h"

namespace ingero {
namespace {

// The old store, as chain_annotate.cpp had it before the compact series.
struct Reference {
  std::deque<ChainRecord> recs;
  uint64_t max_dur = 0;
  bool insert(const ChainRecord& r) {
    bool in_order = true;
    if (recs.empty() || recs.back().ts <= r.ts) {
      recs.push_back(r);
    } else {
      auto it = std::upper_bound(recs.begin(), recs.end(), r.ts,
                                 [](uint64_t ts, const ChainRecord& x) { return ts < x.ts; });
      recs.insert(it, r);
      in_order = false;
    }
    max_dur = std::max(max_dur, r.dur);
    return in_order;
  }
  void pop_front() {
    recs.pop_front();
    if (recs.empty()) max_dur = 0;
  }
  std::vector<ChainRecord> window(uint64_t start, uint64_t end) const {
    auto lo = std::lower_bound(recs.begin(), recs.end(), start,
                               [](const ChainRecord& x, uint64_t ts) { return x.ts < ts; });
    auto hi = std::lower_bound(lo, recs.end(), end, [](const ChainRecord& x, uint64_t ts) { return x.ts < ts; });
    return {lo, hi};
  }
};

std::vector<ChainRecord> window(const ChainRecordSeries& s, uint64_t start, uint64_t end) {
  std::vector<ChainRecord> out;
  s.for_each(start, end, [&out](const ChainRecord& r) { out.push_back(r); });
  return out;
}

// One random run; `stacks` distinct stack ids (beyond kMaxTuples exercises the inline tuples).
// Per step: 80% one insert, `drop_per_10k` / 10000 a drop_before(), 3% up to 9 pops (checking the
// front), `empty_per_10k` / 10000 pops to empty (the tuple table starts over).
// With `spill`, the series spills to it (and the run checks that some blocks went out and came
// back); pops then also go through drop_before() now and then.
void run_random(uint32_t seed, size_t steps, uint64_t stacks, uint64_t empty_per_10k, size_t min_largest,
                SpillFile* spill = nullptr, uint64_t drop_per_10k = 15) {
  std::mt19937_64 rng(seed);
  ChainRecordSeries s;
  s.set_spill(spill);
  Reference ref;
  uint64_t now = 1'700'000'000'000'000'000ull;
  auto pick = [&rng](uint64_t n) { return n ? rng() % n : 0; };
  size_t largest = 0;
  for (size_t step = 0; step < steps; ++step) {
    const uint64_t what = pick(10000);
    if (what < 8000) {
      ChainRecord r;
      const uint64_t kind = pick(20);
      if (kind == 0 && !ref.recs.empty()) {
        // Late: anywhere behind the newest, often deep inside sealed blocks.
        const uint64_t oldest = ref.recs.front().ts;
        r.ts = oldest + pick(now - oldest + 1);
      } else if (kind == 1 && !ref.recs.empty()) {
        r.ts = ref.recs[pick(ref.recs.size())].ts;  // equal to a kept one
      } else {
        now += pick(5) == 0 ? 0 : pick(kind == 2 ? 10'000'000'000ull : 200'000);
        r.ts = now;
      }
      r.dur = pick(50) == 0 ? (uint64_t{1} << 40) + pick(1'000'000) : pick(120'000);
      r.stack = pick(3) == 0 ? 0 : rng() % stacks * 0x9e3779b97f4a7c15ull + 1;
      r.source = static_cast<Source>(pick(8));
      r.op = static_cast<uint8_t>(pick(256));
      r.state = static_cast<OffCpuState>(pick(5));
      ASSERT_EQ(s.insert(r), ref.insert(r)) << "seed " << seed << " step " << step;
    } else if (what < 8000 + drop_per_10k && !ref.recs.empty()) {
      // drop_before: up to a kept timestamp in the oldest quarter (often across sealed blocks), or
      // now and then past the newest.
      const uint64_t ts = pick(10) == 0 ? ref.recs.back().ts + 1 : ref.recs[pick(ref.recs.size() / 4 + 1)].ts + pick(2);
      size_t expect = 0;
      while (!ref.recs.empty() && ref.recs.front().ts < ts) {
        ref.pop_front();
        ++expect;
      }
      ASSERT_EQ(s.drop_before(ts), expect) << "seed " << seed << " step " << step;
    } else if (what < 8300) {
      for (uint64_t n = pick(10); n && !ref.recs.empty(); --n) {
        ASSERT_EQ(n % 2 ? s.front() : s.front_to_pop(), ref.recs.front()) << "seed " << seed << " step " << step;
        s.pop_front();
        ref.pop_front();
      }
    } else if (what < 8300 + empty_per_10k) {
      while (!ref.recs.empty()) {
        s.pop_front();
        ref.pop_front();
      }
    }
    ASSERT_EQ(s.size(), ref.recs.size());
    ASSERT_EQ(s.empty(), ref.recs.empty());
    ASSERT_EQ(s.max_dur(), ref.max_dur);
    if (!ref.recs.empty()) {
      ASSERT_EQ(s.front(), ref.recs.front());
    }
    largest = std::max(largest, ref.recs.size());
    // Window queries: random, around kept timestamps, empty and reversed ones, and everything.
    for (int q = 0; q < 4; ++q) {
      uint64_t a = 0, b = 0;
      if (!ref.recs.empty()) {
        const uint64_t lo = ref.recs.front().ts, hi = ref.recs.back().ts;
        a = q == 0 ? ref.recs[pick(ref.recs.size())].ts : lo + pick(hi - lo + 2) - (q == 1 ? 1 : 0);
        b = q == 2 ? a : a + pick(q == 3 ? hi - lo + 2 : 2'000'000);
        if (q == 3 && pick(4) == 0) std::swap(a, b);
      }
      ASSERT_EQ(window(s, a, b), ref.window(a, b))
          << "seed " << seed << " step " << step << " [" << a << ", " << b << ")";
    }
    if (step % 50 == 0) {
      ASSERT_EQ(window(s, 0, UINT64_MAX), ref.window(0, UINT64_MAX));
    }
  }
  ASSERT_EQ(window(s, 0, UINT64_MAX), ref.window(0, UINT64_MAX));
  // The run must have reached sealed blocks (and, with many stacks, a full tuple table).
  EXPECT_GE(largest, min_largest) << "seed " << seed;
  if (spill != nullptr) {
    EXPECT_GT(spill->counters().blocks_out, 0u) << "seed " << seed;
    EXPECT_GT(spill->counters().reads, 0u) << "seed " << seed;
    EXPECT_EQ(spill->counters().read_errors, 0u);
    // Every block still in the file is one of this series'; the resident bytes are its others.
    while (!s.empty()) s.pop_front();
    EXPECT_EQ(spill->counters().bytes_out, 0u) << "popping everything releases every slot";
    EXPECT_EQ(spill->resident(), 0u) << "popping everything leaves nothing resident";
  }
}

TEST(ChainRecordSeries, AnswersLikeTheSortedDeque) {
  for (uint32_t seed = 1; seed <= 12; ++seed) run_random(seed, 6000, 40, 5, 4 * ChainRecordSeries::kBlock);
}

TEST(ChainRecordSeries, SpilledBlocksAnswerTheSame) {
  // Budgets from one block's worth (most sealed blocks go to the file) to a few.
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SpillFile spill(seed % 2 ? 1 : 4 * 1024);
    run_random(seed, 6000, 40, 5, 4 * ChainRecordSeries::kBlock, &spill);
  }
  SpillFile spill(1);
  run_random(100, 10000, 1u << 20, 0, 6000, &spill, 0);
}

TEST(ChainRecordSeries, ManyDistinctStacksGoInline) {
  // More distinct (source, op, state, stack) tuples than the table holds: ~6000 records kept,
  // two thirds with a stack drawn from 1M, the rest stack-less with a random (source, op, state).
  for (uint32_t seed = 100; seed <= 101; ++seed) run_random(seed, 10000, 1u << 20, 0, 6000, nullptr, 0);
}

TEST(ChainRecordSeries, LateRecordInsideASealedBlock) {
  ChainRecordSeries s;
  Reference ref;
  const size_t n = 10 * ChainRecordSeries::kBlock;
  for (size_t i = 0; i < n; ++i) {
    ChainRecord r;
    r.ts = 1000 + 10 * i;
    r.dur = i;
    r.op = static_cast<uint8_t>(i % 7);
    ASSERT_TRUE(s.insert(r));
    ref.insert(r);
  }
  // Lands in the second block, after the record with the same ts; and one before everything.
  for (uint64_t ts : {uint64_t{1000 + 10 * (ChainRecordSeries::kBlock + 3)}, uint64_t{5}, uint64_t{1005}}) {
    ChainRecord late;
    late.ts = ts;
    late.dur = 77;
    late.stack = 42;
    late.source = Source::kHost;
    late.state = OffCpuState::kSleeping;
    EXPECT_FALSE(s.insert(late));
    ref.insert(late);
  }
  EXPECT_EQ(window(s, 0, UINT64_MAX), ref.window(0, UINT64_MAX));
  EXPECT_EQ(window(s, 1000 + 10 * (ChainRecordSeries::kBlock + 3), 1000 + 10 * (ChainRecordSeries::kBlock + 4)),
            ref.window(1000 + 10 * (ChainRecordSeries::kBlock + 3), 1000 + 10 * (ChainRecordSeries::kBlock + 4)));
  while (!ref.recs.empty()) {
    ASSERT_EQ(s.front(), ref.recs.front());
    s.pop_front();
    ref.pop_front();
  }
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.max_dur(), 0u);
}

TEST(ChainRecordSeries, DropBeforeStopsAtTheFirstRecordAtOrAfterIt) {
  // Sealed blocks end exactly at the drop point, just before it and just after it; with and without
  // a spill file (every sealed block in the file).
  for (const bool spilled : {false, true}) {
    SpillFile spill(1);
    ChainRecordSeries s;
    if (spilled) s.set_spill(&spill);
    Reference ref;
    const size_t k = ChainRecordSeries::kBlock;
    for (size_t i = 0; i < 12 * k; ++i) {
      ChainRecord r;
      r.ts = 1000 + 10 * (i / 2);  // pairs of equal timestamps, one pair across each block edge
      r.dur = i;
      s.insert(r);
      ref.insert(r);
    }
    for (const uint64_t ts : {uint64_t{1000 + 10 * (k / 2 - 1)}, uint64_t{1000 + 10 * (k - 1) + 1},
                              uint64_t{1000 + 10 * (2 * k)}, uint64_t{1000 + 10 * (3 * k + k / 2)}}) {
      size_t expect = 0;
      while (!ref.recs.empty() && ref.recs.front().ts < ts) {
        ref.pop_front();
        ++expect;
      }
      ASSERT_EQ(s.drop_before(ts), expect) << ts << (spilled ? " spilled" : "");
      ASSERT_EQ(s.front(), ref.recs.front());
      ASSERT_EQ(window(s, 0, UINT64_MAX), ref.window(0, UINT64_MAX));
    }
    EXPECT_EQ(s.drop_before(UINT64_MAX), ref.recs.size());
    EXPECT_TRUE(s.empty());
    EXPECT_EQ(s.max_dur(), 0u);
    if (spilled) {
      EXPECT_GT(spill.counters().blocks_out, 0u);
      EXPECT_EQ(spill.counters().bytes_out, 0u);
    }
  }
}

TEST(ChainRecordSeries, CompactForATypicalCallStream) {
  // 200k calls a few microseconds apart, durations up to 100 us, a handful of (op, stack) pairs:
  // the old store held 32 bytes a record plus deque overhead.
  ChainRecordSeries s;
  std::mt19937_64 rng(7);
  uint64_t ts = 1'700'000'000'000'000'000ull;
  const size_t n = 200'000;
  for (size_t i = 0; i < n; ++i) {
    ChainRecord r;
    ts += 1'000 + rng() % 50'000;
    r.ts = ts;
    r.dur = 2'000 + rng() % 100'000;
    r.source = Source::kCuda;
    r.op = static_cast<uint8_t>(1 + rng() % 3);
    r.stack = rng() % 4 == 0 ? 0 : 0xabcdef00ull + rng() % 8;
    s.insert(r);
  }
  ASSERT_EQ(s.size(), n);
  const double per_record = static_cast<double>(s.heap_bytes()) / static_cast<double>(n);
  EXPECT_LT(per_record, 9.0) << "bytes per kept record";
  EXPECT_GT(per_record, 3.0) << "heap_bytes() must count the encoded bytes";
}

std::vector<uint8_t> block_bytes(uint32_t len, uint8_t seed) {
  std::vector<uint8_t> b(len);
  for (uint32_t i = 0; i < len; ++i) b[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return b;
}

TEST(SpillFile, ReadsBackWhatItTookAndReusesReleasedSlots) {
  SpillFile f(1);
  std::vector<SpillFile::Slot> slots;
  // ~1.5 MB: several flushes of the write buffer, so reads come from the file and from the buffer.
  for (uint32_t i = 0; i < 1500; ++i) {
    const auto b = block_bytes(700 + i % 300, static_cast<uint8_t>(i));
    SpillFile::Slot s;
    ASSERT_TRUE(f.put(b.data(), static_cast<uint32_t>(b.size()), s));
    slots.push_back(s);
  }
  for (uint32_t i = 0; i < slots.size(); ++i) {
    std::vector<uint8_t> back(slots[i].len);
    ASSERT_TRUE(f.get(slots[i], back.data()));
    ASSERT_EQ(back, block_bytes(700 + i % 300, static_cast<uint8_t>(i))) << i;
  }
  const uint64_t file = f.counters().file_bytes;
  EXPECT_GE(file, f.counters().bytes_out);
  // Release half and put as many blocks of the same sizes again: the file does not grow.
  for (uint32_t i = 0; i < slots.size(); i += 2) f.release(slots[i]);
  for (uint32_t i = 0; i < slots.size(); i += 2) {
    const auto b = block_bytes(700 + i % 300, static_cast<uint8_t>(i + 1));
    ASSERT_TRUE(f.put(b.data(), static_cast<uint32_t>(b.size()), slots[i]));
  }
  EXPECT_EQ(f.counters().file_bytes, file);
  for (uint32_t i = 0; i < slots.size(); ++i) {
    std::vector<uint8_t> back(slots[i].len);
    ASSERT_TRUE(f.get(slots[i], back.data()));
    ASSERT_EQ(back, block_bytes(700 + i % 300, static_cast<uint8_t>(i % 2 ? i : i + 1))) << i;
  }
  EXPECT_EQ(f.counters().errors, 0u);
}

// The budget variables (INGERO_ANNOTATE_RESIDENT_MB, INGERO_JOIN_RESIDENT_MB): a whole number of
// MiB, 0 to turn spilling off; anything else keeps the default.
TEST(SpillFile, BudgetFromEnvironment) {
  constexpr const char* kVar = "INGERO_TEST_SPILL_BUDGET_MB";
  constexpr size_t kFallback = 7;
  ::unsetenv(kVar);
  EXPECT_EQ(SpillFile::budget_from_env(kVar, kFallback), kFallback);
  const std::pair<const char*, size_t> cases[] = {
      {"", kFallback},        {"16", size_t{16} << 20}, {"0", 0},          {"1048576", size_t{1} << 40},
      {"1048577", kFallback}, {"12x", kFallback},       {"-1", kFallback}, {"99999999999999999999999", kFallback}};
  for (const auto& [text, want] : cases) {
    ::setenv(kVar, text, 1);
    EXPECT_EQ(SpillFile::budget_from_env(kVar, kFallback), want) << "'" << text << "'";
  }
  ::unsetenv(kVar);
}

TEST(SpillFile, UnusableDirectoryKeepsTheBlocksInMemory) {
  SpillFile f(1, "/nonexistent-ingero-spill-dir");
  const auto b = block_bytes(500, 1);
  SpillFile::Slot s;
  EXPECT_FALSE(f.put(b.data(), 500, s));
  EXPECT_EQ(f.counters().errors, 1u);
  EXPECT_FALSE(f.over_budget()) << "a file that failed takes nothing more";
  // A series over it answers as without one.
  ChainRecordSeries series;
  series.set_spill(&f);
  std::vector<ChainRecord> all;
  for (uint64_t i = 0; i < 5 * ChainRecordSeries::kBlock; ++i) {
    ChainRecord r;
    r.ts = 100 + i;
    r.dur = i;
    series.insert(r);
    all.push_back(r);
  }
  EXPECT_EQ(window(series, 0, UINT64_MAX), all);
  EXPECT_EQ(f.counters().blocks_out, 0u);
}

TEST(SpillFile, WritesTheFileSizeLimitRefusesLoseNothing) {
  // RLIMIT_FSIZE makes pwrite past the limit fail (EFBIG; SIGXFSZ ignored) as a full disk would:
  // blocks accepted before stay readable (from the file or the stuck write buffer), later ones are
  // refused and their series keeps them in memory.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 300 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  {
    SpillFile f(1);
    ChainRecordSeries series;
    series.set_spill(&f);
    std::vector<ChainRecord> all;
    std::mt19937_64 rng(3);
    uint64_t ts = 1'000'000;
    for (uint64_t i = 0; i < 8000 * ChainRecordSeries::kBlock / 10; ++i) {
      ChainRecord r;
      ts += 1 + rng() % 5'000'000'000ull;  // ~5 bytes of delta: blocks of ~1.5 kB
      r.ts = ts;
      r.dur = rng() % 100'000'000;
      r.stack = rng();
      series.insert(r);
      all.push_back(r);
    }
    EXPECT_GE(f.counters().errors, 1u) << "the limit was never reached";
    EXPECT_GT(f.counters().stuck_bytes, 0u);
    EXPECT_GT(f.counters().blocks_out, 0u);
    EXPECT_EQ(f.counters().read_errors, 0u);
    EXPECT_EQ(window(series, 0, UINT64_MAX), all);
    size_t popped = 0;
    while (!series.empty()) {
      ASSERT_EQ(series.front(), all[popped]);
      series.pop_front();
      ++popped;
    }
    EXPECT_EQ(popped, all.size());
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
}

}  // namespace
}  // namespace ingero
