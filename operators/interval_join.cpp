#include "operators/interval_join.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <limits>

namespace ingero {

namespace {
constexpr uint32_t kLongDur = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxOff = std::numeric_limits<uint32_t>::max();
}  // namespace

// ---- Block: one run of a key's spans, 12 bytes each (the header's "Storage").

IntervalJoin::Block IntervalJoin::Block::start(const Span& s, bool reserve_full) {
  Block b;
  b.base_ts = s.ts;
  b.base_id = s.id;
  if (reserve_full) b.spans.reserve(kBlockSpans);  // a long run of spans: skip the growth steps
  b.push_back(s);
  return b;
}

uint64_t IntervalJoin::Block::end_at(size_t i) const {
  const Packed& p = spans[i];
  return p.dur == kLongDur ? longs[p.id_off].end : base_ts + p.ts_off + p.dur;
}

IntervalJoin::Span IntervalJoin::Block::at(size_t i) const {
  const Packed& p = spans[i];
  Span s;
  s.ts = base_ts + p.ts_off;
  if (p.dur == kLongDur) {
    s.end = longs[p.id_off].end;
    s.id = longs[p.id_off].id;
  } else {
    s.end = s.ts + p.dur;
    s.id = base_id + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(p.id_off)));
  }
  s.arg0 = arg0.empty() ? 0 : arg0[i];
  s.tag = tags.empty() ? 0 : tags[i];
  return s;
}

bool IntervalJoin::Block::fits(uint64_t ts, uint64_t id) const {
  if (ts < base_ts || ts - base_ts > kMaxOff) return false;
  // id - base_id as a signed 64-bit number lies in [-2^31, 2^31) exactly when this sum, modulo
  // 2^64, lies in [0, 2^32).
  return (id - base_id) + (uint64_t{1} << 31) <= kMaxOff;
}

size_t IntervalJoin::Block::lower_bound(uint64_t ts) const {
  if (ts <= base_ts) return 0;
  if (ts - base_ts > kMaxOff) return spans.size();
  const auto off = static_cast<uint32_t>(ts - base_ts);
  return static_cast<size_t>(
      std::lower_bound(spans.begin(), spans.end(), off, [](const Packed& p, uint32_t o) { return p.ts_off < o; }) -
      spans.begin());
}

size_t IntervalJoin::Block::upper_bound(uint64_t ts) const {
  if (ts < base_ts) return 0;
  if (ts - base_ts > kMaxOff) return spans.size();
  const auto off = static_cast<uint32_t>(ts - base_ts);
  return static_cast<size_t>(
      std::upper_bound(spans.begin(), spans.end(), off, [](uint32_t o, const Packed& p) { return o < p.ts_off; }) -
      spans.begin());
}

IntervalJoin::Packed IntervalJoin::Block::encode(const Span& s) {
  Packed p;
  p.ts_off = static_cast<uint32_t>(s.ts - base_ts);
  const uint64_t dur = s.end - s.ts;
  if (dur >= kLongDur) {
    p.dur = kLongDur;
    p.id_off = static_cast<uint32_t>(longs.size());
    longs.push_back({s.end, s.id});
  } else {
    p.dur = static_cast<uint32_t>(dur);
    p.id_off = static_cast<uint32_t>(s.id - base_id);
  }
  return p;
}

void IntervalJoin::Block::insert(size_t i, const Span& s) {
  const Packed p = encode(s);
  const auto at = static_cast<std::ptrdiff_t>(i);
  if (s.arg0 || !arg0.empty()) {
    if (arg0.empty()) arg0.assign(spans.size(), 0);  // the first non-zero: from now on, kept for every span
    arg0.insert(arg0.begin() + at, s.arg0);
  }
  if (s.tag || !tags.empty()) {
    if (tags.empty()) tags.assign(spans.size(), 0);
    tags.insert(tags.begin() + at, s.tag);
  }
  spans.insert(spans.begin() + at, p);
}

void IntervalJoin::Block::push_back(const Span& s) {
  const Packed p = encode(s);
  if (s.arg0 || !arg0.empty()) {
    if (arg0.empty()) arg0.assign(spans.size(), 0);
    arg0.push_back(s.arg0);
  }
  if (s.tag || !tags.empty()) {
    if (tags.empty()) tags.assign(spans.size(), 0);
    tags.push_back(s.tag);
  }
  spans.push_back(p);
}

bool IntervalJoin::Block::try_prepend(const Span& s) {
  if (spans.size() >= kBlockSpans || s.ts > base_ts || ts_at(spans.size() - 1) - s.ts > kMaxOff) return false;
  const uint64_t old_base = base_ts;
  base_ts = s.ts;
  if (!fits(s.ts, s.id)) {
    base_ts = old_base;
    return false;
  }
  const auto delta = static_cast<uint32_t>(old_base - s.ts);  // <= the last offset after the move
  for (Packed& p : spans) p.ts_off += delta;
  insert(0, s);
  return true;
}

void IntervalJoin::Block::drop_front(size_t k) {
  const auto n = static_cast<std::ptrdiff_t>(k);
  spans.erase(spans.begin(), spans.begin() + n);
  if (!arg0.empty()) arg0.erase(arg0.begin(), arg0.begin() + n);
  if (!tags.empty()) tags.erase(tags.begin(), tags.begin() + n);
  if (!longs.empty()) compact_longs();
  rebase();
}

IntervalJoin::Span IntervalJoin::Block::pop_back() {
  const Span s = at(spans.size() - 1);
  const bool was_long = spans.back().dur == kLongDur;
  spans.pop_back();
  if (!arg0.empty()) arg0.pop_back();
  if (!tags.empty()) tags.pop_back();
  if (was_long) compact_longs();
  return s;
}

IntervalJoin::Block IntervalJoin::Block::take_tail(size_t p) {
  Block tail;
  tail.base_ts = ts_at(p);
  tail.base_id = base_id;  // every id here fits it
  tail.spans.reserve(spans.size() - p);
  for (size_t i = p; i < spans.size(); ++i) tail.push_back(at(i));
  const auto n = static_cast<std::ptrdiff_t>(p);
  spans.erase(spans.begin() + n, spans.end());
  if (!arg0.empty()) arg0.erase(arg0.begin() + n, arg0.end());
  if (!tags.empty()) tags.erase(tags.begin() + n, tags.end());
  if (!longs.empty()) compact_longs();
  return tail;
}

void IntervalJoin::Block::rebase() {
  const uint32_t delta = spans.front().ts_off;
  if (delta == 0) return;
  for (Packed& p : spans) p.ts_off -= delta;
  base_ts += delta;
}

void IntervalJoin::Block::compact_longs() {
  std::vector<Long> kept;
  for (Packed& p : spans) {
    if (p.dur != kLongDur) continue;
    kept.push_back(longs[p.id_off]);
    p.id_off = static_cast<uint32_t>(kept.size() - 1);
  }
  longs.swap(kept);
}

size_t IntervalJoin::Block::bytes() const {
  return spans.capacity() * sizeof(Packed) + arg0.capacity() * sizeof(uint64_t) + tags.capacity() +
         longs.capacity() * sizeof(Long);
}

// ---- IntervalJoin

// Appends s, which starts at or after every span of `blocks`.
void IntervalJoin::append(std::vector<Block>& blocks, const Span& s) {
  if (!blocks.empty()) {
    Block& last = blocks.back();
    if (last.size() < kBlockSpans && last.fits(s.ts, s.id)) {
      last.push_back(s);
      return;
    }
  }
  blocks.push_back(Block::start(s, !blocks.empty() && blocks.back().size() == kBlockSpans));
  if (blocks.size() > 1) seal(blocks[blocks.size() - 2]);
}

// Puts s after every span that starts at or before it (as an upper_bound insert into one sorted
// sequence would).
void IntervalJoin::place(std::vector<Block>& blocks, const Span& s) {
  size_t b = 0;  // the last block starting at or before s (0 when s starts before every span)
  for (;;) {
    if (blocks.empty() || blocks.back().ts_at(blocks.back().size() - 1) <= s.ts) {
      append(blocks, s);  // in order: the common case
      return;
    }
    const auto it = std::upper_bound(blocks.begin(), blocks.end(), s.ts,
                                     [](uint64_t ts, const Block& x) { return ts < x.base_ts; });
    b = it == blocks.begin() ? 0 : static_cast<size_t>(it - blocks.begin()) - 1;
    // The blocks s may change (b and the one after it) come back into memory first; one that
    // cannot be read is gone, and the search starts again.
    if (!resident(blocks, b)) continue;
    if (b + 1 < blocks.size() && !resident(blocks, b + 1)) continue;
    place_resident(blocks, s, b);
    break;
  }
  // Report the changed blocks (b, up to two new ones after it, the one that followed), and
  // spill them if the file is over budget; never the key's last block.
  const size_t stop = std::min(b + 4, blocks.size() - 1);
  for (size_t i = b; i < stop; ++i) seal(blocks[i]);
}

void IntervalJoin::place_resident(std::vector<Block>& blocks, const Span& s, size_t b) {
  if (s.ts < blocks.front().base_ts) {  // before every span
    if (!blocks.front().try_prepend(s)) blocks.insert(blocks.begin(), Block::start(s, false));
    return;
  }
  const size_t p = blocks[b].upper_bound(s.ts);  // > 0: spans[0] starts at base_ts <= s.ts
  const auto next = static_cast<std::ptrdiff_t>(b + 1);
  if (blocks[b].fits(s.ts, s.id) && (p < blocks[b].size() || blocks[b].size() < kBlockSpans)) {
    if (blocks[b].size() == kBlockSpans) {
      // Full: its last span moves to the front of the next block, or into a block of its own.
      const Span last = blocks[b].pop_back();
      if (b + 1 == blocks.size() || !blocks[b + 1].try_prepend(last)) {
        blocks.insert(blocks.begin() + next, Block::start(last, false));
      }
    }
    blocks[b].insert(p, s);
    return;
  }
  // s cannot go into block b at p (it is full and s goes last, or s is too far from its bases):
  // the spans after p move to a block of their own, and s goes between.
  if (p < blocks[b].size()) blocks.insert(blocks.begin() + next, blocks[b].take_tail(p));
  if (b + 1 == blocks.size() || !blocks[b + 1].try_prepend(s)) {
    blocks.insert(blocks.begin() + next, Block::start(s, false));
  }
}

// ---- Spill (the header's "Spill")

// A spilled block's bytes: four uint32 counts (spans, arg0, tags, longs), then each vector's data.
namespace {
constexpr size_t kSpillHeader = 4 * sizeof(uint32_t);

template <class T>
void put_vec(uint8_t*& out, const std::vector<T>& v) {
  if (v.empty()) return;
  std::memcpy(out, v.data(), v.size() * sizeof(T));
  out += v.size() * sizeof(T);
}

template <class T>
bool get_vec(const uint8_t*& in, const uint8_t* end, uint32_t n, std::vector<T>& v) {
  const size_t len = size_t{n} * sizeof(T);
  if (static_cast<size_t>(end - in) < len) return false;
  v.resize(n);
  if (n) std::memcpy(v.data(), in, len);
  in += len;
  return true;
}
}  // namespace

IntervalJoin::~IntervalJoin() {
  if (spill_ == nullptr) return;
  for (auto& [key, buf] : buffers_)
    for (Block& b : buf.blocks) forget(b);
}

void IntervalJoin::recount(Block& b) {
  if (spill_ == nullptr || b.spilled()) return;
  const auto now = static_cast<uint32_t>(b.bytes());
  spill_->add_resident(static_cast<std::ptrdiff_t>(now) - static_cast<std::ptrdiff_t>(b.counted));
  b.counted = now;
}

void IntervalJoin::seal(Block& b) {
  if (spill_ == nullptr || b.spilled()) return;
  recount(b);
  if (!spill_->over_budget()) return;
  const uint32_t counts[4] = {static_cast<uint32_t>(b.spans.size()), static_cast<uint32_t>(b.arg0.size()),
                              static_cast<uint32_t>(b.tags.size()), static_cast<uint32_t>(b.longs.size())};
  const size_t len = kSpillHeader + b.spans.size() * sizeof(Packed) + b.arg0.size() * sizeof(uint64_t) + b.tags.size() +
                     b.longs.size() * sizeof(Long);
  io_.resize(len);
  uint8_t* out = io_.data();
  std::memcpy(out, counts, kSpillHeader);
  out += kSpillHeader;
  put_vec(out, b.spans);
  put_vec(out, b.arg0);
  put_vec(out, b.tags);
  put_vec(out, b.longs);
  SpillFile::Slot slot;
  if (!spill_->put(io_.data(), static_cast<uint32_t>(len), slot)) return;  // the file takes nothing: stays here
  b.n = counts[0];
  b.first_end = b.end_at(0);
  b.slot = slot;
  spill_->add_resident(-static_cast<std::ptrdiff_t>(b.counted));
  b.counted = 0;
  // Free the vectors' memory (assigning {} would keep their capacity).
  std::vector<Packed>().swap(b.spans);
  std::vector<uint64_t>().swap(b.arg0);
  std::vector<uint8_t>().swap(b.tags);
  std::vector<Long>().swap(b.longs);
  ++spilled_blocks_;
}

bool IntervalJoin::read_spilled(const Block& b, Block& out) const {
  out.base_ts = b.base_ts;
  out.base_id = b.base_id;
  out.spans.clear();
  out.arg0.clear();
  out.tags.clear();
  out.longs.clear();
  io_.resize(b.slot.len);
  if (spill_ == nullptr || b.slot.len < kSpillHeader || !spill_->get(b.slot, io_.data())) return false;
  uint32_t counts[4];
  std::memcpy(counts, io_.data(), kSpillHeader);
  const uint8_t* in = io_.data() + kSpillHeader;
  const uint8_t* end = io_.data() + io_.size();
  if (counts[0] != b.n || counts[0] == 0 || !get_vec(in, end, counts[0], out.spans) ||
      !get_vec(in, end, counts[1], out.arg0) || !get_vec(in, end, counts[2], out.tags) ||
      !get_vec(in, end, counts[3], out.longs)) {
    out.spans.clear();
    return false;
  }
  return true;
}

void IntervalJoin::drop_cached(uint64_t off) const {
  for (Cached& c : cache_)
    if (c.off == off) c.off = ~uint64_t{0};
}

const IntervalJoin::Block& IntervalJoin::view(const Block& b) const {
  if (!b.spilled()) return b;
  Cached* victim = &cache_[0];
  for (Cached& c : cache_) {
    if (c.off == b.slot.off) {
      c.used = ++cache_clock_;
      return c.block;
    }
    if (c.used < victim->used) victim = &c;
  }
  read_spilled(b, victim->block);  // a failed read leaves the copy empty: no spans to find
  victim->off = b.slot.off;
  victim->used = ++cache_clock_;
  return victim->block;
}

void IntervalJoin::forget(Block& b) {
  if (spill_ == nullptr) return;
  if (b.spilled()) {
    spill_->release(b.slot);
    drop_cached(b.slot.off);
    b.slot = {};
    --spilled_blocks_;
  } else {
    spill_->add_resident(-static_cast<std::ptrdiff_t>(b.counted));
  }
  b.counted = 0;
}

bool IntervalJoin::resident(std::vector<Block>& blocks, size_t i) {
  Block& b = blocks[i];
  if (!b.spilled()) return true;
  Block back;
  const bool ok = read_spilled(b, back);
  const uint32_t n = b.n;
  forget(b);
  if (!ok) {  // its spans are lost (the file counts the read error)
    buffered_ -= n;
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
    return false;
  }
  b.spans = std::move(back.spans);
  b.arg0 = std::move(back.arg0);
  b.tags = std::move(back.tags);
  b.longs = std::move(back.longs);
  b.n = 0;
  recount(b);
  return true;
}

void IntervalJoin::add_right(uint64_t key, const Event& e) {
  auto it = buffers_.find(key);  // (find inlines where operator[] did not: 0.6 % of the run)
  if (it == buffers_.end()) it = buffers_.try_emplace(key).first;
  auto& buf = it->second;
  const uint8_t tag = tagged_ ? std::min(static_cast<uint8_t>(e.prev_state), kMaxTag) : uint8_t{0};
  const Span s{e.ts_ns, e.end_ns(), e.id, e.arg0, tag};
  if (!buf.blocks.empty()) {          // in order, into a last block with room: the common case
    Block& last = buf.blocks.back();  // never spilled: spans.size() is its size
    const size_t n = last.spans.size();
    if (n < kBlockSpans && last.ts_at(n - 1) <= s.ts && last.fits(s.ts, s.id)) {
      last.push_back(s);
    } else {
      place(buf.blocks, s);
    }
  } else {
    buf.blocks.push_back(Block::start(s, false));
  }
  ++buffered_;
  buf.max_dur = std::max(buf.max_dur, s.end - s.ts);
}

size_t IntervalJoin::span_bytes() const {
  size_t n = 0;
  for (const auto& [key, buf] : buffers_) {
    n += buf.blocks.capacity() * sizeof(Block);
    for (const Block& b : buf.blocks) n += b.bytes();
  }
  return n;
}

ProbeResult IntervalJoin::probe(uint64_t key, uint64_t call_ts, uint64_t call_end, uint64_t tag_mask,
                                uint64_t horizon) const {
  ProbeResult r;
  auto it = buffers_.find(key);
  if (it == buffers_.end()) return r;
  const auto& buf = it->second;
  const auto& blocks = buf.blocks;
  const uint64_t lo = kind_ == JoinKind::kWithin ? (call_ts > within_ ? call_ts - within_ : 0) : call_ts;
  const uint64_t hi = kind_ == JoinKind::kWithin ? call_end + within_ : call_end;
  // Only spans starting at or after lo - max_dur can reach lo. The first of them is in the block
  // before the first block starting at or after `from`, or is that block's first.
  const uint64_t from = lo > buf.max_dur ? lo - buf.max_dur : 0;
  auto b = static_cast<size_t>(
      std::lower_bound(blocks.begin(), blocks.end(), from, [](const Block& x, uint64_t ts) { return x.base_ts < ts; }) -
      blocks.begin());
  size_t i = 0;
  if (b > 0) {
    const size_t j = view(blocks[b - 1]).lower_bound(from);
    if (j < blocks[b - 1].size()) {
      --b;
      i = j;
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  // Hits that start at the same instant are listed by id: the buffer keeps them in the order they
  // were added, which differs between a shard that reads a batch whole and one that adds its own
  // host-wide events before another shard's (engine.cpp, pid shards).
  uint64_t run_ts = 0;
  size_t run_from = 0;
  auto close_run = [&] {
    if (r.right_ids.size() - run_from > 1)
      std::sort(r.right_ids.begin() + static_cast<std::ptrdiff_t>(run_from), r.right_ids.end());
  };
  for (; b < blocks.size(); ++b, i = 0) {
    if (blocks[b].base_ts > hi) break;
    const Block& blk = view(blocks[b]);  // a spilled block read back (cached), else itself
    const bool with_arg0 = !blk.arg0.empty();
    const bool with_tags = !blk.tags.empty();
    const bool untagged_counts = (tag_mask & 1) != 0;  // a block without tags: every span is tag 0
    const size_t n = blk.spans.size();
    for (; i < n; ++i) {
      const Packed& p = blk.spans[i];
      const uint64_t ts = blk.base_ts + p.ts_off;
      if (ts > hi || ts >= horizon) break;  // spans are in start order: every later one is too
      uint64_t end = 0, id = 0;
      if (p.dur != kLongDur) {
        end = ts + p.dur;
        id = blk.base_id + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(p.id_off)));
      } else {
        end = blk.longs[p.id_off].end;
        id = blk.longs[p.id_off].id;
      }
      const bool instant = end == ts;
      const bool hit = instant ? (ts >= lo && ts <= hi) : (ts < hi && end > lo);
      if (!hit) continue;
      if (with_tags ? (tag_mask >> blk.tags[i] & 1) == 0 : !untagged_counts) continue;
      if (r.right_ids.empty() || ts != run_ts) {
        close_run();
        run_ts = ts;
        run_from = r.right_ids.size();
      }
      r.right_ids.push_back(id);
      r.right_ns += end - ts;
      if (with_arg0) r.sum_arg0 += blk.arg0[i];
      if (kind_ == JoinKind::kOverlap) {
        const uint64_t x = std::max(ts, call_ts), y = std::min(end, call_end);
        if (y > x) pieces.emplace_back(x, y);
      }
    }
    if (i < n) break;  // a span past hi: every later one starts after it
  }
  close_run();
  if (kind_ == JoinKind::kWithin) {
    r.overlap_ns = r.right_ids.empty() ? 0 : call_end - call_ts;
    return r;
  }
  std::sort(pieces.begin(), pieces.end());
  uint64_t cur_a = 0, cur_b = 0;
  bool open = false;
  for (const auto& [a, e] : pieces) {
    if (open && a <= cur_b) {
      cur_b = std::max(cur_b, e);
      continue;
    }
    if (open) r.overlap_ns += cur_b - cur_a;
    cur_a = a;
    cur_b = e;
    open = true;
  }
  if (open) r.overlap_ns += cur_b - cur_a;
  return r;
}

void IntervalJoin::evict(uint64_t watermark, uint64_t retain) {
  if (watermark == std::numeric_limits<uint64_t>::max()) return;  // final: windows close first
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto& blocks = it->second.blocks;
    // Spans leave from the front while they end before the horizon (the first kept one stops it).
    size_t whole = 0, gone = 0;
    while (whole < blocks.size()) {
      if (blocks[whole].spilled()) {
        // Its first span stays (so nothing more leaves) without reading it back.
        if (blocks[whole].first_end + retain >= watermark) break;
        if (!resident(blocks, whole)) continue;  // unreadable: erased, its spans lost
      }
      Block& blk = blocks[whole];
      size_t k = 0;
      while (k < blk.size() && blk.end_at(k) + retain < watermark) ++k;
      gone += k;
      if (k < blk.size()) {
        if (k) {
          blk.drop_front(k);
          recount(blk);
        }
        break;
      }
      ++whole;
    }
    for (size_t i = 0; i < whole; ++i) forget(blocks[i]);
    blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(whole));
    buffered_ -= gone;
    evicted_ += gone;
    if (blocks.empty()) {
      it = buffers_.erase(it);
    } else {
      ++it;
    }
  }
}

void IntervalJoin::prune(uint64_t floor, std::unordered_map<uint64_t, std::vector<CallRange>>& candidates,
                         uint64_t parts, uint64_t part) {
  const uint64_t reach = kind_ == JoinKind::kWithin ? within_ : 0;
  if (floor <= reach) return;
  const uint64_t below = floor - reach;  // (a): spans ending before this are out of future reach
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // The candidates' closed ranges widened by reach, merged: disjoint, sorted, as [ts, end].
  std::vector<CallRange> merged;
  std::vector<char> drop;
  for (auto& [key, buf] : buffers_) {
    if (parts > 1 && key % parts != part) continue;  // another slice's
    auto& blocks = buf.blocks;
    if (blocks.empty() || blocks.front().base_ts >= below) continue;  // every span starts (so ends) past it
    merged.clear();
    if (auto c = candidates.find(key); c != candidates.end()) {
      auto& calls = c->second;
      std::sort(calls.begin(), calls.end(), [](const CallRange& a, const CallRange& b) { return a.ts < b.ts; });
      for (const auto& call : calls) {
        const uint64_t lo = call.ts > reach ? call.ts - reach : 0;
        const uint64_t hi = call.end > kMax - reach ? kMax : call.end + reach;
        if (!merged.empty() && lo <= merged.back().end) merged.back().end = std::max(merged.back().end, hi);
        else merged.push_back({lo, hi});
      }
    }
    size_t total = 0;
    for (const Block& blk : blocks) total += blk.size();
    // Spans come in start order, so the first merged range not wholly before a span's start only
    // moves forward.
    drop.assign(total, 0);
    size_t m = 0, dropped = 0, x = 0;
    // A spilled block is read through view(); spans of one that cannot be read are lost: dropped.
    for (const Block& blk : blocks) {
      const Block& v = view(blk);
      for (size_t i = 0; i < blk.size(); ++i, ++x) {
        if (i >= v.size()) {
          drop[x] = 1;
          ++dropped;
          continue;
        }
        const uint64_t ts = v.ts_at(i), end = v.end_at(i);
        if (end >= below) continue;
        while (m < merged.size() && merged[m].end < ts) ++m;
        if (m < merged.size() && merged[m].ts <= end) continue;
        drop[x] = 1;
        ++dropped;
      }
    }
    if (!dropped) continue;
    // Spans with one start are dropped all or none (kept spans stay a run per start).
    size_t run = 0;  // first span of the current run of equal starts
    bool all = true, in_run = false;
    uint64_t run_ts = 0;
    const auto settle = [&](size_t end) {  // the run [run, end) is complete
      if (all) return;
      for (size_t y = run; y < end; ++y) {
        dropped -= drop[y];
        drop[y] = 0;
      }
    };
    x = 0;
    for (const Block& blk : blocks) {
      const Block& v = view(blk);
      for (size_t i = 0; i < blk.size(); ++i, ++x) {
        const bool present = i < v.size();  // else lost (dropped), a run of its own
        if (!present || !in_run || v.ts_at(i) != run_ts) {
          if (in_run) settle(x);
          run = x;
          run_ts = present ? v.ts_at(i) : 0;
          all = true;
          in_run = present;
        }
        all = all && drop[x];
      }
    }
    if (in_run) settle(x);
    if (!dropped) continue;
    // The kept spans, in order, into fresh blocks (sealed ones spill while the file is over its
    // budget); each old block is freed once read, so the copy needs at most one block more than
    // the spans kept.
    std::vector<Block> kept;
    size_t kept_n = 0;
    x = 0;
    for (Block& blk : blocks) {
      const Block& v = view(blk);
      for (size_t i = 0; i < blk.size(); ++i, ++x) {
        if (drop[x] || i >= v.size()) continue;
        append(kept, v.at(i));
        ++kept_n;
      }
      forget(blk);
      blk = Block();
    }
    blocks.swap(kept);
    pruned_ += total - kept_n;
    buffered_ -= total - kept_n;
  }
}

void JoinOutcome::add(uint64_t call_id, uint64_t call_dur, const ProbeResult& r, uint32_t max_exemplars) {
  ++calls;
  tail_ns += call_dur;
  overlap_ns += std::min(r.overlap_ns, call_dur);
  right_ns += r.right_ns;
  sum_arg0 += r.sum_arg0;
  if (r.right_ids.empty()) return;
  ++hit_calls;
  right_ids.insert(r.right_ids.begin(), r.right_ids.end());
  if (max_exemplars == 0) return;
  Exemplar ex{call_id, r.overlap_ns, {}};
  ex.right_ids.assign(r.right_ids.begin(),
                      r.right_ids.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(r.right_ids.size(), 5)));
  auto pos = std::find_if(exemplars.begin(), exemplars.end(), [&](const Exemplar& e) {
    return e.overlap_ns < ex.overlap_ns || (e.overlap_ns == ex.overlap_ns && e.call_id > ex.call_id);
  });
  exemplars.insert(pos, std::move(ex));
  if (exemplars.size() > max_exemplars) exemplars.pop_back();
}

double JoinOutcome::share() const {
  return tail_ns ? static_cast<double>(overlap_ns) / static_cast<double>(tail_ns)
                 : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace ingero
