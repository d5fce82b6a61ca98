// Interval join: tail call spans x a stream of right spans (off-CPU time, block I/O, retransmits)
// on a key (tid, pid, or none for host-wide signals).
//
// Contract:
// - add_right(key, event): buffers a right span under key, kept sorted by start (insertion is by
//   ts, so out-of-order spans from the off-CPU builder are fine).
// - probe(key, call): the union of the call's intersections with the key's right spans; the ids
//   of the spans it counts in start order, spans with the same start by id (never by the order
//   they were added: shards add host-wide spans in different orders). Spans that start at or
//   after `horizon` are not counted: the engine passes the instant the call's window is due to
//   close (its end + lateness), so a call that outlasts its window is judged on the spans every
//   run has by then, however the batches were cut (a run that reads the whole trace in one batch
//   would otherwise see spans a streaming run never does).
//   kOverlap: a right span [s, e) counts where it intersects [call.ts, call.end).
//   kWithin:  a right span counts where it intersects [call.ts - within, call.end + within]; an
//   instant (dur 0) counts when inside that range. For kWithin a hit covers the whole call.
//   Overlap is a union per call: two right spans covering the same nanoseconds count them once.
// - JoinAccumulator folds probes of one window's tail calls into the slots documented in
//   model/plan.h (overlap_ns, tail_ns, share, calls, hit_calls, events, right_ns, sum_arg0) and
//   keeps exemplars: the tail calls with the longest overlap and their right events.
// - evict(watermark, retain): drops right spans whose end + retain < watermark. `retain` must be
//   at least the window size + lateness of every window probing the buffer, so no open window
//   loses a span it needs; memory is then bounded by the rate of right spans x retain.
// - prune(floor, candidates): drops right spans that no call can touch any more, whatever the
//   window size (a one-window trace never evicts). The caller vouches for two things:
//   (a) every call still to come has start >= `floor` (engine/runtime.cpp: the batch watermark,
//       for windows whose calls are never delivered late), so a span with end + reach < floor
//       (reach = `within` for kWithin, 0 for kOverlap) is out of every future call's range;
//   (b) `candidates` holds, per key, every call already buffered that may still be probed
//       ([ts, end), any order; sorted here).
//   A span is dropped only when (a) holds and no candidate's closed range [ts - reach, end +
//   reach] meets the span's closed range [ts, end]: a superset of probe()'s hit rule (instants
//   included), so a dropped span can never be a hit. Spans with the same start are dropped all or
//   none. Kept spans keep their order; max_dur is not lowered (it only bounds probe()'s search).
//   Costs O(spans + candidates log candidates).
//   A dropped span counts in evicted() at once (and in pruned()): evicted() is every span the
//   join let go of before the end of the trace, at the horizon or by a prune. It is therefore
//   larger with pruning than without (a pruned span may never have reached the horizon); results
//   do not depend on it. (An exact horizon-only count needs a 16-byte record of every pruned span
//   until the horizon passes it, which in a one-window trace is forever: memory linear in trace
//   length, the thing pruning exists to avoid.)
// - Tags (one buffer for several filters of the same spans): a join built `tagged` keeps each
//   span's off-CPU state (Event::prev_state, states past kMaxTag as kMaxTag) and probe() counts only
//   the spans whose tag is in `tag_mask` (bit t: tag t). kAllTags counts every span, as an untagged
//   join always does (its spans are tag 0). Prune and evict ignore tags: a span is kept for every
//   filter or for none, so each filter sees exactly the spans a buffer of its own would hold for
//   the same calls (engine/runtime.cpp shares one buffer between the off-CPU streams of one builder).
// - Never pairs 1:1 and never keeps a span past its horizon (unlike a key-matching join).
// - Storage (how, not what: results do not depend on it): a key's spans sit in blocks of at most
//   kBlockSpans (256), in start order across blocks. A block keeps its first span's start
//   (base_ts) and an id base; each span is 12 bytes: 32-bit start offset, 32-bit duration, 32-bit
//   signed id offset (24 bytes as three uint64 before; a full block adds ~0.4 byte a span of
//   header). A span that cannot be encoded against a block's bases (start 2^32 ns or more past
//   base_ts, id outside [base_id - 2^31, base_id + 2^31)) goes into another block; a span of
//   2^32 - 1 ns or longer (end - start, modulo 2^64) keeps its end and id in the block's `longs`
//   (its duration field marks it). In-order spans append to the last block; a span landing inside
//   a full block pushes that block's last span to the next block (or a new one). A prune repacks
//   the kept spans into full blocks. arg0 is kept per block, only once the block was given a
//   non-zero one (8 bytes a span there); so is the tag (1 byte a span). span_bytes() is what the
//   blocks hold.
// - Single-threaded; one per (shard, join node).
#pragma once

#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/plan.h"
#include "operators/spill_file.h"

namespace ingero {

struct ProbeResult {
  uint64_t overlap_ns = 0;
  uint64_t right_ns = 0;
  uint64_t sum_arg0 = 0;
  std::vector<uint64_t> right_ids;
};

class IntervalJoin {
 public:
  static constexpr uint8_t kMaxTag = 63;
  static constexpr uint64_t kAllTags = ~uint64_t{0};
  IntervalJoin(JoinKind kind, uint64_t within_ns, bool tagged = false)
      : kind_(kind), within_(within_ns), tagged_(tagged) {}
  ~IntervalJoin();
  IntervalJoin(const IntervalJoin&) = delete;
  IntervalJoin& operator=(const IntervalJoin&) = delete;
  // Sealed blocks may go to `f` while it is over its resident budget (see "Spill"). Set before the
  // first add_right(); `f` must outlive the join. Null: everything stays in memory.
  void set_spill(SpillFile* f) { spill_ = f; }
  void add_right(uint64_t key, const Event& e);
  ProbeResult probe(uint64_t key, uint64_t call_ts, uint64_t call_end, uint64_t tag_mask = kAllTags,
                    uint64_t horizon = ~uint64_t{0}) const;
  void evict(uint64_t watermark, uint64_t retain);
  // A call a prune must not break: [ts, end) on the join key it is probed with.
  struct CallRange {
    uint64_t ts = 0, end = 0;
  };
  // Prunes only the keys with key % parts == part: a caller may build the candidates of one slice
  // of the keys at a time (their memory is the prune's transient) and prune slice by slice; the
  // slices together drop exactly what one prune with every candidate drops.
  void prune(uint64_t floor, std::unordered_map<uint64_t, std::vector<CallRange>>& candidates, uint64_t parts = 1,
             uint64_t part = 0);
  size_t buffered() const { return buffered_; }
  // Heap bytes of the buffered spans' storage in memory (blocks, their spans, arg0 and long spans;
  // by capacity, without the allocator's own overhead or the per-key map); spilled blocks count
  // only their header.
  size_t span_bytes() const;
  size_t spilled_blocks() const { return spilled_blocks_; }  // blocks in the spill file now
  uint64_t evicted() const { return evicted_ + pruned_; }    // dropped at the horizon or pruned
  uint64_t pruned() const { return pruned_; }                // of which dropped by prune()

 private:
  static constexpr size_t kBlockSpans = 256;
  // A span as add_right() saw it (arg0 is 0 where its block keeps none).
  struct Span {
    uint64_t ts = 0, end = 0, id = 0, arg0 = 0;
    uint8_t tag = 0;
  };
  // A span in its block: start = base_ts + ts_off; end = start + dur unless dur == kLongDur, where
  // end and id are the block's longs[id_off]; else id = base_id + (int32_t)id_off.
  struct Packed {
    uint32_t ts_off = 0, dur = 0, id_off = 0;
  };
  struct Long {
    uint64_t end = 0, id = 0;
  };
  struct Block {
    uint64_t base_ts = 0;  // the start of spans[0]
    uint64_t base_id = 0;
    std::vector<Packed> spans;   // sorted by start; never empty in a buffer
    std::vector<uint64_t> arg0;  // empty, or parallel to spans once one is non-zero
    std::vector<uint8_t> tags;   // the same for the tags
    std::vector<Long> longs;     // exactly the long spans' end and id
    // Spilled (slot.cap != 0): the four vectors are empty and sit in the spill file; n and
    // first_end stand in for spans.size() and end_at(0).
    SpillFile::Slot slot;
    uint32_t n = 0;
    uint32_t counted = 0;  // bytes() as last reported to the spill file (0: not reported)
    uint64_t first_end = 0;
    static Block start(const Span& s, bool reserve_full);
    bool spilled() const { return slot.cap != 0; }
    size_t size() const { return spilled() ? n : spans.size(); }
    uint64_t ts_at(size_t i) const { return base_ts + spans[i].ts_off; }
    uint64_t end_at(size_t i) const;
    Span at(size_t i) const;
    bool fits(uint64_t ts, uint64_t id) const;  // encodable against the bases
    size_t lower_bound(uint64_t ts) const;      // first span starting at or after ts
    size_t upper_bound(uint64_t ts) const;      // first span starting after ts
    Packed encode(const Span& s);               // needs fits(); a long span's end and id go to longs
    void insert(size_t i, const Span& s);       // needs fits() and ts_at(i-1) <= s.ts <= ts_at(i)
    void push_back(const Span& s);              // insert(size(), s)
    bool try_prepend(const Span& s);            // puts s first when it fits, lowering base_ts
    void drop_front(size_t k);                  // erases spans [0, k), k < size()
    Span pop_back();
    Block take_tail(size_t p);  // spans [p, size()) moved to a new block, 0 < p
    void rebase();              // base_ts = start of spans[0]
    void compact_longs();       // drops longs no span points at
    size_t bytes() const;
  };
  struct Buffer {
    std::vector<Block> blocks;  // in start order: a block's base_ts >= every start before it
    uint64_t max_dur = 0;
  };
  void place(std::vector<Block>& blocks, const Span& s);
  void place_resident(std::vector<Block>& blocks, const Span& s, size_t b);  // blocks b, b+1 in memory
  void append(std::vector<Block>& blocks, const Span& s);
  // Spill bookkeeping (all no-ops without a spill file).
  void seal(Block& b);     // b is no longer a key's last block: report its bytes, spill if over budget
  void recount(Block& b);  // report a resident block's bytes again after a change
  void forget(Block& b);   // b is about to be destroyed: unreport it, or release its slot
  // blocks[i] in memory: true, or false when it was spilled and could not be read back (it is
  // erased, its spans lost; the file counts the read error).
  bool resident(std::vector<Block>& blocks, size_t i);
  bool read_spilled(const Block& b, Block& out) const;
  // b's spans for reading: b itself, or a cached copy of a spilled b (valid until the next view()
  // of kViewCache other spilled blocks, or a change to b).
  const Block& view(const Block& b) const;
  void drop_cached(uint64_t off) const;
  JoinKind kind_;
  uint64_t within_;
  bool tagged_;
  std::unordered_map<uint64_t, Buffer> buffers_;
  size_t buffered_ = 0;  // spans in all buffers
  uint64_t evicted_ = 0;
  uint64_t pruned_ = 0;
  SpillFile* spill_ = nullptr;
  size_t spilled_blocks_ = 0;
  static constexpr size_t kViewCache = 4;
  struct Cached {
    uint64_t off = ~uint64_t{0};  // the slot's file offset; ~0: empty
    uint64_t used = 0;            // last use, for LRU
    Block block;
  };
  mutable Cached cache_[kViewCache];
  mutable uint64_t cache_clock_ = 0;
  mutable std::vector<uint8_t> io_;  // a spilled block's bytes on their way in or out
};

struct JoinOutcome {
  uint64_t overlap_ns = 0, tail_ns = 0, calls = 0, hit_calls = 0, right_ns = 0, sum_arg0 = 0;
  std::set<uint64_t> right_ids;
  struct Exemplar {
    uint64_t call_id, overlap_ns;
    std::vector<uint64_t> right_ids;
  };
  std::vector<Exemplar> exemplars;  // longest overlap first, at most max_exemplars

  void add(uint64_t call_id, uint64_t call_dur, const ProbeResult& r, uint32_t max_exemplars);
  double share() const;
};

}  // namespace ingero
