// The parallel engine's source side (engine.cpp, threads >= 2): the source thread reads every
// batch into a work item taken from a small pool and reused, with its buffers, once every shard
// node is done with it. These tests pin what that reuse must not change:
// - a source is always handed an empty batch (a source may append to what it is given, as the
//   serial path allows: its batch is cleared between reads), however many times the pool wraps;
// - the result (explain's JSON: chains, per-op statistics, rule outcomes, counters) is the
//   one-thread result for traces much longer than the pool, with batch sizes from 1 event up;
// - a source may lend events it keeps (Batch::lent, bench's replay from memory) instead of filling
//   the batch, in any mix with filled batches: the engine reads view(), and a reused batch never
//   keeps an earlier batch's lent pointer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/runtime.h"
#include "model/result_json.h"
#include "model/synth.h"
#include "rules/pack.h"
#include "tests/util/pack_run.h"

namespace ingero {
namespace {

using test::result_text;
using test::run_pack;

// A source over sorted events that appends each batch to the one it is handed (it never clears
// it) and counts the reads where that batch was not empty: the engine must hand it empty ones.
class AppendingSource final : public EventSource {
 public:
  AppendingSource(const std::vector<Event>& sorted, size_t batch) : events_(sorted), batch_(batch) {}
  bool next(Batch& out) override {
    if (done_) return false;
    if (!out.events.empty()) ++handed_non_empty_;
    const size_t n = std::min(batch_, events_.size() - pos_);
    out.events.insert(out.events.end(), events_.begin() + static_cast<std::ptrdiff_t>(pos_),
                      events_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    out.seq = seq_++;
    out.final = pos_ >= events_.size();
    out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : (n ? events_[pos_ - 1].ts_ns : 0);
    done_ = out.final;
    ++reads_;
    return true;
  }
  TraceMeta& meta() override { return meta_; }
  size_t handed_non_empty() const { return handed_non_empty_; }
  size_t reads() const { return reads_; }

 private:
  const std::vector<Event>& events_;
  size_t batch_;
  size_t pos_ = 0;
  uint64_t seq_ = 0;
  bool done_ = false;
  size_t handed_non_empty_ = 0, reads_ = 0;
  TraceMeta meta_;
};

// What LendingSource::upcoming() says (EventSource::upcoming, a prefetch hint): nothing, the
// next batch's events, or a range no one may read (unmapped memory): a prefetch never faults, and
// nothing else may read through a hint.
enum class Hint { kNone, kTrue, kUnmapped };

// A source over events cut into batches up front that lends every batch (Batch::lent), or, with
// `mix`, lends odd batches and appends even ones to the batch it is handed.
class LendingSource final : public EventSource {
 public:
  LendingSource(const std::vector<Event>& sorted, size_t batch, bool mix, Hint hint = Hint::kNone)
      : mix_(mix), hint_(hint) {
    for (size_t pos = 0; pos < sorted.size(); pos += batch) {
      const size_t n = std::min(batch, sorted.size() - pos);
      batches_.emplace_back(sorted.begin() + static_cast<std::ptrdiff_t>(pos),
                            sorted.begin() + static_cast<std::ptrdiff_t>(pos + n));
    }
  }
  bool next(Batch& out) override {
    if (i_ >= batches_.size()) return false;
    if (out.lent || !out.events.empty()) ++handed_used_;
    const auto& b = batches_[i_];
    if (mix_ && i_ % 2 == 0) {
      out.events.insert(out.events.end(), b.begin(), b.end());
    } else {
      out.lent = &b;
      ++lent_;
    }
    out.seq = i_;
    out.final = ++i_ == batches_.size();
    out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : b.back().ts_ns;
    return true;
  }
  TraceMeta& meta() override { return meta_; }
  PrefetchHint upcoming() override {
    ++hints_asked_;
    if (hint_ == Hint::kNone || i_ >= batches_.size()) return {};
    if (hint_ == Hint::kUnmapped) return {reinterpret_cast<const void*>(uintptr_t{0x1000}), size_t{1} << 20};
    return {batches_[i_].data(), batches_[i_].size() * sizeof(Event)};
  }
  size_t handed_used() const { return handed_used_; }
  size_t lent() const { return lent_; }
  size_t hints_asked() const { return hints_asked_; }

 private:
  std::vector<std::vector<Event>> batches_;
  bool mix_;
  Hint hint_;
  size_t i_ = 0, handed_used_ = 0, lent_ = 0, hints_asked_ = 0;
  TraceMeta meta_;
};

// A scenario with host-wide events (block I/O: every pid shard's joins see them) and a chain.
const synth::SynthTrace& io_trace() {
  static const synth::SynthTrace t = synth::make_checkpoint_io(true);
  return t;
}

TEST(ParallelSource, TraceIsLongerThanThePoolAndHasHostWideEvents) {
  // The tests below mean something only if the pool wraps many times and joins see
  // host-wide events.
  const auto& ev = io_trace().events;
  EXPECT_GT(std::count_if(ev.begin(), ev.end(), [](const Event& e) { return is_host_wide(e); }), 0);
  EXPECT_GT(ev.size() / 128, 64u);
}

TEST(ParallelSource, SourceIsAlwaysHandedAnEmptyBatch) {
  const auto& ev = io_trace().events;
  for (unsigned threads : {1u, 2u, 3u}) {
    AppendingSource src(ev, 128);
    const auto r = run_pack(src, threads);
    EXPECT_EQ(src.handed_non_empty(), 0u) << threads << " threads";
    EXPECT_GT(src.reads(), 64u);
    // Had a batch kept its old events, they would have been counted twice.
    EXPECT_EQ(r.counters.events_in, ev.size()) << threads << " threads";
  }
}

TEST(ParallelSource, ManySmallBatchesGiveTheOneThreadResult) {
  // Batch sizes from 1 event (thousands of batches: the pool wraps hundreds of times) up; the
  // appending source also checks the batches handed out stay empty at every size.
  const auto& t = io_trace();
  AppendingSource one_src(t.events, 4096);
  const auto one = run_pack(one_src, 1);
  ASSERT_EQ(one.counters.events_in, t.events.size());
  ASSERT_FALSE(one.chains.empty());
  ASSERT_TRUE(
      std::any_of(one.chains.begin(), one.chains.end(), [&](const Chain& c) { return c.category == t.category; }));
  const std::string base = result_text(one);
  for (unsigned threads : {2u, 4u})
    for (size_t batch : {size_t{1}, size_t{5}, size_t{64}, size_t{4096}}) {
      AppendingSource src(t.events, batch);
      const auto r = run_pack(src, threads);
      EXPECT_EQ(src.handed_non_empty(), 0u) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.node_errors, 0u) << threads << " threads, batch " << batch;
      EXPECT_EQ(r.counters.threads, threads);
      // Not EXPECT_EQ on the strings: a mismatch would print two large JSON documents.
      EXPECT_TRUE(result_text(r) == base) << threads << " threads, batch " << batch << " differs from one thread";
    }
}

TEST(ParallelSource, LentBatchesGiveTheFilledResult) {
  const auto& t = io_trace();
  AppendingSource one_src(t.events, 4096);
  const std::string base = result_text(run_pack(one_src, 1));
  for (bool mix : {false, true})
    for (unsigned threads : {1u, 2u, 4u})
      for (size_t batch : {size_t{1}, size_t{64}, size_t{4096}}) {
        LendingSource src(t.events, batch, mix);
        const auto r = run_pack(src, threads);
        const std::string what = std::to_string(threads) + " threads, batch " + std::to_string(batch) +
                                 (mix ? ", lent and filled" : ", all lent");
        EXPECT_GT(src.lent(), 0u) << what;
        // Every batch is handed over cleared: no events and no lent pointer of an earlier batch.
        EXPECT_EQ(src.handed_used(), 0u) << what;
        EXPECT_EQ(r.counters.events_in, t.events.size()) << what;
        EXPECT_TRUE(result_text(r) == base) << what << " differs from the filled one-thread result";
      }
}

TEST(ParallelSource, PrefetchHintsNeverChangeTheResult) {
  // The engine asks for the next batch's whereabouts after every read and prefetches them during
  // the current batch (docs/history/issue-12.md, part 19): the result must be the same whatever the
  // hint says, including a range of unmapped memory (reading through it would crash).
  const auto& t = io_trace();
  AppendingSource one_src(t.events, 4096);
  const std::string base = result_text(run_pack(one_src, 1));
  for (Hint hint : {Hint::kTrue, Hint::kUnmapped})
    for (unsigned threads : {1u, 2u, 4u})
      for (size_t batch : {size_t{1}, size_t{64}, size_t{4096}}) {
        LendingSource src(t.events, batch, true, hint);
        const auto r = run_pack(src, threads);
        const std::string what = std::to_string(threads) + " threads, batch " + std::to_string(batch) +
                                 (hint == Hint::kTrue ? ", true hints" : ", unmapped hints");
        EXPECT_GE(src.hints_asked(), t.events.size() / batch) << what << ": the engine did not ask for hints";
        EXPECT_EQ(r.counters.events_in, t.events.size()) << what;
        EXPECT_TRUE(result_text(r) == base) << what << " differs from the one-thread result without hints";
      }
}

TEST(ParallelSource, VectorSourcesHintAtTheSliceTheyCopyNext) {
  const auto& ev = io_trace().events;
  VectorSource owned(ev, 100);
  BorrowedSource borrowed(ev, 100);
  for (EventSource* src : {static_cast<EventSource*>(&owned), static_cast<EventSource*>(&borrowed)}) {
    size_t batches = 0;
    for (;;) {
      const PrefetchHint h = src->upcoming();
      Batch b;
      if (!src->next(b)) {
        EXPECT_EQ(h.bytes, 0u) << "a hint after the final batch";
        break;
      }
      ++batches;
      // The hint is the memory the batch was copied from: the same bytes.
      ASSERT_EQ(h.bytes, b.events.size() * sizeof(Event)) << "batch " << batches;
      ASSERT_NE(h.data, nullptr);
      EXPECT_EQ(std::memcmp(h.data, b.events.data(), h.bytes), 0) << "batch " << batches;
      if (b.final) {
        EXPECT_EQ(src->upcoming().bytes, 0u);
        break;
      }
    }
    EXPECT_EQ(batches, (ev.size() + 99) / 100);
  }
}

}  // namespace
}  // namespace ingero
