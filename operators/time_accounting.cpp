#include "operators/time_accounting.h"

#include <algorithm>
#include <string_view>

#include "model/ops.h"

namespace ingero {

CallKind call_kind(Source s, uint8_t op) {
  switch (s) {
    case Source::kCuda:
      switch (op) {
        case op::kCudaLaunchKernel: return CallKind::kLaunch;
        case op::kCudaMemcpy:
        case op::kCudaMemcpyAsync: return CallKind::kCopy;
        case op::kCudaStreamSync:
        case op::kCudaDeviceSync:
        case op::kCudaEventSync: return CallKind::kSync;
        case op::kCudaMalloc:
        case op::kCudaFree:
        case op::kCudaMallocManaged: return CallKind::kAlloc;
        default: return CallKind::kOther;
      }
    case Source::kDriver:
      switch (op) {
        case op::kCuLaunchKernel: return CallKind::kLaunch;
        case op::kCuMemcpy:
        case op::kCuMemcpyAsync:
        case op::kCuMemcpyHtoD:
        case op::kCuMemcpyDtoH:
        case op::kCuMemcpyHtoDAsync:
        case op::kCuMemcpyDtoHAsync: return CallKind::kCopy;
        case op::kCuCtxSynchronize:
        case op::kCuStreamSynchronize: return CallKind::kSync;
        case op::kCuMemAlloc:
        case op::kCuMemAllocManaged:
        case op::kCuMemFree: return CallKind::kAlloc;
        default: return CallKind::kOther;
      }
    case Source::kGraph: return op == op::kGraphLaunch ? CallKind::kLaunch : CallKind::kOther;
    case Source::kNccl: return CallKind::kCollective;
    default: return CallKind::kOther;
  }
}

namespace {

// call_kind for every (source, op) of the GPU sources, looked up once per call.
struct KindTable {
  uint8_t k[16 * 256];
  KindTable() {
    for (unsigned src = 0; src < 16; ++src)
      for (unsigned o = 0; o < 256; ++o)
        k[src << 8 | o] = static_cast<uint8_t>(call_kind(static_cast<Source>(src), static_cast<uint8_t>(o)));
  }
};
const KindTable& kind_table() {
  static const KindTable t;
  return t;
}
inline uint64_t kind_of(const Event& e) {
  return static_cast<unsigned>(e.source) < 16 ? kind_table().k[static_cast<unsigned>(e.source) << 8 | e.op]
                                              : static_cast<uint64_t>(CallKind::kOther);
}

bool starts(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The reason one frame names, or nothing (kOther is "no match" here).
bool frame_reason(std::string_view f, BlockReason& r) {
  if (starts(f, "futex_wait")) {
    r = BlockReason::kLock;
  } else if (f == "sk_wait_data" || f == "tcp_recvmsg" || starts(f, "sock_") || starts(f, "unix_stream_")) {
    r = BlockReason::kNetwork;
  } else if (f == "hrtimer_nanosleep" || f == "do_nanosleep" || starts(f, "schedule_hrtimeout")) {
    r = BlockReason::kSleep;
  } else if (starts(f, "io_schedule") || starts(f, "blk_") || starts(f, "folio_wait")) {
    r = BlockReason::kIo;
  } else {
    return false;
  }
  return true;
}

}  // namespace

BlockReason block_reason(const ParsedStack& st) {
  // Kernel frames first (they are the wait); a stack whose kernel part was not marked as such
  // (Ingero's own stacks) is read whole.
  BlockReason r = BlockReason::kOther;
  bool any_kernel = false;
  for (const auto& f : st.frames) {
    if (f.kind != FrameKind::kKernel) continue;
    any_kernel = true;
    if (frame_reason(f.function, r)) return r;
  }
  if (any_kernel) return BlockReason::kOther;
  for (const auto& f : st.frames)
    if (frame_reason(f.function, r)) return r;
  return BlockReason::kOther;
}

TimeAccounting::Thread& TimeAccounting::thread(const Event& e) {
  const uint64_t k = key(e.node, e.tid);
  // A direct-mapped cache in front of the map: threads take turns in a trace, so the last one
  // alone misses most of the time.
  Slot& slot = cache_[(k * 0x9E3779B97F4A7C15ull) >> (64 - kCacheBits)];
  if (slot.t && slot.key == k) return *slot.t;
  auto [it, fresh] = threads_.try_emplace(k);
  Thread& t = it->second;
  if (fresh) {
    t.pid = e.pid;
    t.tid = e.tid;
    t.node = e.node;
  }
  slot.key = k;
  slot.t = &t;
  return t;
}

void TimeAccounting::add(Thread& t, uint8_t lane, uint64_t s, uint64_t e, uint64_t tag, bool by_stack, uint64_t started,
                         uint64_t ended) {
  Lane& ln = t.lanes[lane];
  if (s < t.settled) {  // a late context interval: only what is not settled yet
    if (lane != kLaneCall) late_ns_ += std::min(e, t.settled) - s;
    s = t.settled;
  }
  if (lane == kLaneCall) {
    // Equal starts (before clipping): the longer call is the outer one (a runtime call and the
    // driver call inside it), so it takes over what the call that owns the last segment got.
    if (!ln.segs.empty() && started == t.call_s && ended > t.call_e) {
      Seg& last = ln.segs.back();
      last.e = std::max(last.e, e);
      last.tag = tag;
      ln.cover = std::max(ln.cover, e);
      t.cover_all = std::max(t.cover_all, e);
      t.call_e = ended;
      return;
    }
  }
  const uint64_t from = std::max(s, ln.cover);  // an earlier interval of this level owns what lies before
  if (e <= from) return;
  ln.segs.push_back(Seg{from, e, tag, by_stack});
  ln.cover = e;
  t.cover_all = std::max(t.cover_all, e);
  if (lane == kLaneCall) {
    t.call_s = started;
    t.call_e = ended;
  }
  ++t.pending;
}

void TimeAccounting::credit(Thread& t, int lane, const Seg* g, uint64_t s, uint64_t e) {
  const uint64_t d = e - s;
  switch (lane) {
    case kLanePreempted:
      t.preempted += d;
      t.by[static_cast<uint32_t>(g->tag)] += d;
      if (slicing_) slice(t, acct::kPreempted, s, e, g->tag, 0);  // arg1 = tid, arg0 = pid (below)
      break;
    case kLaneCall:
      t.calls[g->tag] += d;
      if (slicing_) slice(t, acct::call_bucket(static_cast<CallKind>(g->tag)), s, e, 0, 0);
      break;
    case kLaneBlocked:
      if (g->by_stack) t.by_stack[g->tag] += d;
      else t.blocked[g->tag] += d;
      if (slicing_) {
        if (!g->by_stack) {
          slice(t, acct::blocked_bucket(static_cast<BlockReason>(g->tag)), s, e, 0, 0);
        } else {
          uint8_t bucket = acct::kBlockedOther;
          if (auto it = stack_bucket_.find(g->tag); it != stack_bucket_.end()) {
            bucket = it->second;
          } else if (BlockReason r = BlockReason::kOther; slice_opt_.reason_of && slice_opt_.reason_of(g->tag, r)) {
            bucket = acct::blocked_bucket(r);
            stack_bucket_.emplace(g->tag, bucket);
          }
          slice(t, bucket, s, e, 0, g->tag);
        }
      }
      break;
    case kLaneUnknown:
      t.unknown += d;
      if (slicing_) slice(t, acct::kUnknown, s, e, 0, 0);
      break;
    default:
      t.rest += d;
      if (slicing_) {
        // On CPU from the process's first switch-out state on, unknown before it: every event
        // that starts before what is settled has been seen, so this never depends on batches.
        if (t.stated_gen != stated_gen_) {  // stated_pids_ changed since this thread last looked
          auto it = stated_pids_.find(key(t.node, t.pid));
          t.stated_from = it == stated_pids_.end() ? UINT64_MAX : it->second;
          t.stated_gen = stated_gen_;
        }
        const uint64_t from = t.stated_from;
        if (s < from) slice(t, acct::kUnknown, s, std::min(e, from), 0, 0);
        if (e > from) slice(t, acct::kOnCpu, std::max(s, from), e, 0, 0);
      }
      break;
  }
}

void TimeAccounting::close_slice(Thread& t) {
  if (!t.open) return;
  t.open = false;
  slices_.push_back(t.slice);
}

// SliceOptions::totals: [s, e) of the thread's time (settled in time order) straight into the
// totals of its grid cells, as the slices of flush_slices would sum to. A piece past the thread's
// current cell closes it: nothing settled later falls before the settled point.
void TimeAccounting::add_to_cell(Thread& t, uint8_t bucket, uint64_t s, uint64_t e, uint64_t other_tid) {
  while (s < e) {
    if (!t.cell_open || s >= t.cell_hi) {
      if (t.cell_open) closed_cells_.push_back(std::move(t.cell));
      const uint64_t grid = std::max<uint64_t>(slice_opt_.grid_ns, 1);
      t.cell = CellTotals{};
      t.cell.cell = s / grid;
      t.cell.tid = t.tid;
      t.cell.node = t.node;
      t.cell_hi = t.cell.cell + 1 > UINT64_MAX / grid ? UINT64_MAX : (t.cell.cell + 1) * grid;
      t.cell_open = true;
    }
    const uint64_t piece = std::min(e, t.cell_hi);
    CellTotals& c = t.cell;
    c.pid = t.pid;
    c.rank = t.rank;
    c.b[bucket] += piece - s;
    if (bucket == acct::kPreempted) {
      auto it = std::find_if(c.by.begin(), c.by.end(), [other_tid](const auto& x) { return x.first == other_tid; });
      if (it != c.by.end()) it->second += piece - s;
      else c.by.emplace_back(other_tid, piece - s);
    }
    s = piece;
  }
}

void TimeAccounting::slice(Thread& t, uint8_t bucket, uint64_t s, uint64_t e, uint64_t other_tid, uint64_t stack_id) {
  if (!t.feeds || e <= s) return;
  if (slice_opt_.totals && t.cell_open && e <= t.cell_hi && bucket != acct::kPreempted &&
      !(t.gap_e > t.gap_s && s < t.gap_e && e > t.gap_s)) {  // within the current cell: add_to_cell's common case
    t.cell.pid = t.pid;
    t.cell.rank = t.rank;
    t.cell.b[bucket] += e - s;
    return;
  }
  if (t.gap_e > t.gap_s && s < t.gap_e && e > t.gap_s) {  // a silent gap is not sliced
    if (s < t.gap_s) slice(t, bucket, s, t.gap_s, other_tid, stack_id);
    if (e > t.gap_e) slice(t, bucket, t.gap_e, e, other_tid, stack_id);
    return;
  }
  if (slice_opt_.totals) {
    add_to_cell(t, bucket, s, e, other_tid);
    return;
  }
  const uint64_t grid = slice_opt_.grid_ns ? slice_opt_.grid_ns : UINT64_MAX;
  while (s < e) {
    const uint64_t cell = s / grid;
    const uint64_t cell_end = grid == UINT64_MAX ? UINT64_MAX : (cell + 1) * grid;
    const uint64_t piece = std::min(e, cell_end);
    Event& sl = t.slice;
    if (t.open && sl.op == bucket && (sl.arg0 << 32 | sl.arg1) == other_tid && sl.stack_id == stack_id &&
        sl.end_ns() == s && sl.ts_ns / grid == cell) {
      sl.dur_ns += piece - s;
    } else {
      close_slice(t);
      sl = Event{};
      sl.ts_ns = s;
      sl.dur_ns = piece - s;
      sl.pid = t.pid;
      sl.tid = t.tid;
      sl.node = t.node;
      sl.rank = t.rank;
      sl.source = Source::kAccount;
      sl.op = bucket;
      // Preempted: the tid that ran instead, and its pid when the span named it (live capture
      // does). Only the span itself, never what other threads' spans said: a shard of the engine
      // sees only its own processes, and the result must not depend on how they are split.
      sl.arg1 = other_tid & 0xffffffffu;
      sl.arg0 = other_tid >> 32;
      sl.stack_id = stack_id;
      sl.flags = event_flags::kSynthetic;
      t.open = true;
    }
    s = piece;
  }
}

// Gives [t.settled, upto) to the buckets: at each instant the highest-precedence lane covering it,
// else the rest. Lanes hold disjoint segments in start order, so this is a merge of four lists.
void TimeAccounting::settle(Thread& t, uint64_t upto) {
  uint64_t now = t.settled;
  if (t.lanes[kLanePreempted].head == t.lanes[kLanePreempted].segs.size() &&
      t.lanes[kLaneBlocked].head == t.lanes[kLaneBlocked].segs.size() &&
      t.lanes[kLaneUnknown].head == t.lanes[kLaneUnknown].segs.size()) {
    // Calls alone (the common case): their segments are disjoint, the gaps are the rest.
    Lane& ln = t.lanes[kLaneCall];
    if (slicing_ && slice_opt_.totals && t.feeds && t.cell_open && upto <= t.cell_hi && t.gap_e <= now &&
        t.stated_gen == stated_gen_ && (t.stated_from <= now || t.stated_from >= upto)) {
      // What credit() and slice() would do piece by piece, summed: every piece lies in the
      // thread's current cell, after its last silent gap, and on one side of its process's first
      // switch-out state (so the rest is all on CPU or all unknown).
      uint64_t rest = 0, kinds[kCallKindCount] = {};
      const uint64_t start = now;
      for (; ln.head < ln.segs.size() && now < upto; ++ln.head) {
        const Seg& g = ln.segs[ln.head];
        if (g.s >= upto) break;
        if (g.s > now) rest += g.s - now;
        const uint64_t e = std::min(g.e, upto);
        if (e > now) kinds[g.tag] += e - std::max(g.s, now);
        now = std::max(now, e);
        if (g.e > upto) break;  // settled up to upto, not past this one
      }
      if (now < upto) {
        rest += upto - now;
        now = upto;
      }
      CellTotals& c = t.cell;
      c.pid = t.pid;
      c.rank = t.rank;
      t.rest += rest;
      c.b[t.stated_from <= start ? acct::kOnCpu : acct::kUnknown] += rest;
      for (size_t k = 0; k < kCallKindCount; ++k) {
        t.calls[k] += kinds[k];
        c.b[acct::call_bucket(static_cast<CallKind>(k))] += kinds[k];
      }
    }
    for (; ln.head < ln.segs.size() && now < upto; ++ln.head) {
      const Seg& g = ln.segs[ln.head];
      if (g.s >= upto) break;
      if (g.s > now) {
        if (slicing_) credit(t, -1, nullptr, now, g.s);
        else t.rest += g.s - now;
      }
      const uint64_t e = std::min(g.e, upto);
      if (e > now) {
        if (slicing_) credit(t, kLaneCall, &g, std::max(g.s, now), e);
        else t.calls[g.tag] += e - std::max(g.s, now);
      }
      now = std::max(now, e);
      if (g.e > upto) break;  // settled up to upto, not past this one
    }
    if (now < upto) {
      if (slicing_) credit(t, -1, nullptr, now, upto);
      else t.rest += upto - now;
      now = upto;
    }
  }
  while (now < upto) {
    int owner = -1;
    const Seg* og = nullptr;
    uint64_t next = upto;
    for (int l = 0; l < kLanes; ++l) {
      Lane& ln = t.lanes[l];
      while (ln.head < ln.segs.size() && ln.segs[ln.head].e <= now) ++ln.head;
      if (ln.head == ln.segs.size()) continue;
      const Seg& g = ln.segs[ln.head];
      if (g.s <= now) {
        owner = l;
        og = &g;
        next = std::min(next, g.e);
        break;
      }
      next = std::min(next, g.s);  // a higher level starts there
    }
    credit(t, owner, og, now, next);
    now = next;
  }
  t.settled = std::max(t.settled, upto);
  size_t pending = 0;
  for (auto& ln : t.lanes) {
    while (ln.head < ln.segs.size() && ln.segs[ln.head].e <= t.settled) ++ln.head;
    ln.segs.erase(ln.segs.begin(), ln.segs.begin() + static_cast<std::ptrdiff_t>(ln.head));
    ln.head = 0;
    pending += ln.segs.size();
  }
  t.pending = pending;
}

TimeAccounting::TimeAccounting(AccountingOptions o) : opt_(o) {
  if (!opt_.chain_accounting) return;
  SliceOptions so;
  so.grid_ns = 1'000'000'000;
  if (const TraceMeta* meta = opt_.meta)
    so.reason_of = [meta](uint64_t id, BlockReason& r) {
      auto it = meta->stacks.find(id);
      if (it == meta->stacks.end()) return false;
      r = block_reason(parse_stack(it->second));
      return true;
    };
  enable_slices(std::move(so));
}

void TimeAccounting::fold_bins(const std::vector<Event>& slices) {
  constexpr uint64_t kSec = 1'000'000'000;
  for (const Event& e : slices) {
    Bins& bs = bins_[key(e.node, e.tid)];
    const uint64_t sec = e.ts_ns / kSec;
    if (bs.bins.empty()) {
      bs.first_sec = sec;
      bs.pid = e.pid;
    }
    if (sec < bs.first_sec) continue;  // not in time order (cannot happen: slices settle in order)
    const uint64_t i = sec - bs.first_sec;
    if (i >= bs.bins.size()) {
      const size_t grow = static_cast<size_t>(i + 1 - bs.bins.size());
      if (bin_count_ + grow > opt_.max_bins) {
        ++bins_dropped_;
        continue;
      }
      bin_count_ += grow;
      bs.bins.resize(static_cast<size_t>(i + 1));
    }
    Bin& b = bs.bins[static_cast<size_t>(i)];
    if (e.op < acct::kBuckets) b.b[e.op] += e.dur_ns;
    if (e.op == acct::kPreempted && e.arg1) {
      const auto tid = static_cast<uint32_t>(e.arg1);
      auto it = std::find_if(b.by.begin(), b.by.end(), [tid](const auto& p) { return p.first == tid; });
      if (it != b.by.end()) {
        it->second += e.dur_ns;
      } else if (b.by.size() < 8) {
        b.by.emplace_back(tid, e.dur_ns);
      } else {
        auto least = std::min_element(b.by.begin(), b.by.end(),
                                      [](const auto& x, const auto& y) { return x.second < y.second; });
        if (least->second < e.dur_ns) *least = {tid, e.dur_ns};
      }
    }
  }
}

std::optional<AccountingSeries> TimeAccounting::series(uint16_t node, uint32_t tid) const {
  auto it = bins_.find(key(node, tid));
  if (it == bins_.end() || it->second.bins.empty()) return std::nullopt;
  AccountingSeries s;
  s.pid = it->second.pid;
  s.tid = tid;
  s.node = node;
  s.first_sec = it->second.first_sec;
  s.bins.reserve(it->second.bins.size());
  for (const Bin& b : it->second.bins) std::copy(std::begin(b.b), std::end(b.b), s.bins.emplace_back().begin());
  return s;
}

std::optional<ThreadAccounting> TimeAccounting::range(const TraceMeta& meta, uint16_t node, uint32_t tid,
                                                      uint64_t from_ns, uint64_t to_ns) const {
  constexpr uint64_t kSec = 1'000'000'000;
  auto it = bins_.find(key(node, tid));
  if (it == bins_.end() || to_ns <= from_ns) return std::nullopt;
  const Bins& bs = it->second;
  const uint64_t lo = std::max(from_ns / kSec, bs.first_sec), hi = (to_ns + kSec - 1) / kSec;  // [lo, hi) seconds
  uint64_t b[acct::kBuckets] = {};
  std::unordered_map<uint32_t, uint64_t> by;
  uint64_t first = UINT64_MAX, last = 0;
  for (uint64_t sec = lo; sec < hi && sec - bs.first_sec < bs.bins.size(); ++sec) {
    const Bin& bin = bs.bins[static_cast<size_t>(sec - bs.first_sec)];
    uint64_t any = 0;
    for (size_t k = 0; k < acct::kBuckets; ++k) {
      b[k] += bin.b[k];
      any += bin.b[k];
    }
    if (any) {
      first = std::min(first, sec);
      last = std::max(last, sec);
    }
    for (const auto& [t, ns] : bin.by) by[t] += ns;
  }
  if (first == UINT64_MAX) return std::nullopt;
  ThreadAccounting a;
  a.pid = bs.pid;
  a.tid = tid;
  a.node = node;
  if (auto th = threads_.find(key(node, tid)); th != threads_.end()) a.rank = th->second.rank;
  auto name_of = [&meta](uint32_t t, uint32_t pid) -> std::string {
    if (auto n = meta.thread_names.find(t); n != meta.thread_names.end() && !n->second.empty()) return n->second;
    if (auto n = meta.process_names.find(pid ? pid : t); n != meta.process_names.end()) return n->second;
    return "";
  };
  a.comm = name_of(tid, bs.pid);
  a.start_ns = std::max(from_ns, first * kSec);
  a.end_ns = std::min(to_ns, (last + 1) * kSec);
  for (size_t i = 0; i < kCallKindCount; ++i) a.in_calls_ns[kCallKinds[i]] = b[acct::kLaunch + i];
  for (size_t i = 0; i < kBlockReasonCount; ++i) a.blocked_ns[kBlockReasons[i]] = b[acct::kLock + i];
  a.on_cpu_ns = b[acct::kOnCpu];
  a.preempted_ns = b[acct::kPreempted];
  a.unknown_ns = b[acct::kUnknown];
  a.wall_ns = a.in_calls_total() + a.blocked_total() + a.on_cpu_ns + a.preempted_ns + a.unknown_ns;
  a.scheduler_data = a.on_cpu_ns > 0 || a.preempted_ns > 0 || a.blocked_total() > 0;
  std::vector<std::pair<uint32_t, uint64_t>> v(by.begin(), by.end());
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second > y.second : x.first < y.first;
  });
  if (v.size() > opt_.top_preemptors) v.resize(opt_.top_preemptors);
  for (const auto& [t, ns] : v) {
    PreemptedBy p;
    p.tid = t;
    if (auto th = threads_.find(key(node, t)); th != threads_.end()) p.pid = th->second.pid;
    else if (auto o = other_pid_.find(t); o != other_pid_.end()) p.pid = o->second;
    p.comm = name_of(t, p.pid);
    p.ns = ns;
    a.preempted_by.push_back(std::move(p));
  }
  return a;
}

void TimeAccounting::observe(const Event* events, size_t n) {
  const uint64_t from = opt_.from_ns, to = opt_.to_ns;
  for (size_t i = 0; i < n; ++i) {
    const Event& e = events[i];
    const bool call = is_gpu_api(e.source);
    if (opt_.evict && e.source == Source::kHost && e.op == op::kProcessExit && e.pid == e.tid) [[unlikely]]
      exits_.emplace_back(key(e.node, e.pid), e.ts_ns);
    if (!call && !(e.source == Source::kHost && e.op == op::kSchedSwitch &&
                   !(e.flags & (event_flags::kSwitchOut | event_flags::kSwitchIn))))
      continue;
    if (e.ts_ns > to || e.end_ns() < from) continue;  // outside the interval
    const uint64_t s = std::max(e.ts_ns, from);
    const uint64_t end = std::min(e.end_ns(), to);
    const uint64_t k = key(e.node, e.tid);
    const Slot& slot = cache_[(k * 0x9E3779B97F4A7C15ull) >> (64 - kCacheBits)];  // thread()'s cache, inline
    Thread& t = slot.t && slot.key == k ? *slot.t : thread(e);
    if (!t.feeds && !t.sched) {  // the thread's first event in the interval
      t.start = t.end = t.settled = s;
    }
    if (slicing_ && t.feeds && s > t.end + slice_opt_.gap_ns) {
      // Nothing was seen of the thread for longer than gap_ns: that gap is not sliced (its
      // slices would come too late for their windows, depending on where batches were cut).
      // Everything up to t.end is known (this event starts after it): settle it, so the previous
      // gap is behind the settled point before this one replaces it.
      settle(t, t.end);
      t.gap_s = t.end;
      t.gap_e = s;
    }
    t.end = std::max(t.end, end);
    if (call) {
      Lane& cl = t.lanes[kLaneCall];
      if (t.feeds && end <= cl.cover && s >= t.settled && e.ts_ns != t.call_s) {
        // Inside the time of the thread's newest call segment (a driver call inside its runtime
        // call): add() would add nothing; only the rank is taken.
        if (e.rank >= 0) t.rank = e.rank;
        if (t.pending >= 64) settle(t, s);  // as below
        continue;
      }
      if (t.feeds && s >= t.cover_all && s >= t.settled && e.ts_ns != t.call_s) {
        // Every pending segment ends by s (and nothing that comes later starts before s): settle
        // them now, as the 64-segment rule would later; the same time goes to the same buckets.
        // One pending call (the common case: a thread's calls one after another) is settled and
        // replaced in place, without the general merge.
        if (t.pending == 1 && cl.segs.size() == 1) {
          const Seg g = cl.segs[0];
          uint64_t now = t.settled;
          if (g.s > now) credit(t, -1, nullptr, now, g.s);
          if (g.e > now) credit(t, kLaneCall, &g, std::max(g.s, now), g.e);
          now = std::max(now, g.e);
          if (s > now) credit(t, -1, nullptr, now, s);
          t.settled = s;
          if (end > s) {
            cl.segs[0] = Seg{s, end, kind_of(e), false};
            cl.cover = t.cover_all = end;
            t.call_s = e.ts_ns;
            t.call_e = e.end_ns();
          } else {
            cl.segs.clear();
            t.pending = 0;
          }
          if (e.rank >= 0) t.rank = e.rank;
          continue;
        }
        if (t.pending) settle(t, s);
      }
      // Time before the thread's first call is not sliced (the contract): settle it first, or
      // the first flush after this call would slice it (it was pending).
      if (slicing_ && !t.feeds) settle(t, s);
      if (!t.feeds) feeders_.push_back(&t);
      t.feeds = true;
      if (e.rank >= 0) t.rank = e.rank;
      add(t, kLaneCall, s, end, kind_of(e), false, e.ts_ns, e.end_ns());
    } else {
      t.sched = true;
      if (e.prev_state != OffCpuState::kUnknown) {
        t.stated = true;
        if (slicing_) {
          auto [it, fresh] = stated_pids_.try_emplace(key(t.node, t.pid), s);
          if (fresh || s < it->second) {
            it->second = s;
            ++stated_gen_;
          }
        }
      }
      switch (e.prev_state) {
        case OffCpuState::kPreempted:
          // Live traces name the process that ran instead in arg0 (bpf/host.bpf.c).
          if (e.arg0 && e.arg0 <= 0xffffffffu) other_pid_[e.arg1 & 0xffffffffu] = static_cast<uint32_t>(e.arg0);
          // The tag: the tid that ran instead, and (high half) its pid when this span names it.
          add(t, kLanePreempted, s, end, (e.arg0 <= 0xffffffffu ? e.arg0 << 32 : 0) | (e.arg1 & 0xffffffffu), false);
          break;
        case OffCpuState::kUnknown: add(t, kLaneUnknown, s, end, 0, false); break;
        case OffCpuState::kDiskWait:
          add(t, kLaneBlocked, s, end, static_cast<uint64_t>(BlockReason::kIo), false);
          break;
        default:
          if (e.stack_id) add(t, kLaneBlocked, s, end, e.stack_id, true);
          else add(t, kLaneBlocked, s, end, static_cast<uint64_t>(BlockReason::kOther), false);
          break;
      }
    }
    // Nothing that comes later starts before s: what lies before it is decided.
    if (t.pending >= 64) settle(t, s);
  }
  if (opt_.evict && n > 0) evict(events[n - 1].ts_ns);
  if (opt_.chain_accounting && n > 0) {
    bin_slices_.clear();
    flush_slices(events[n - 1].ts_ns, false, bin_slices_);
    fold_bins(bin_slices_);
    trim_bins(events[n - 1].ts_ns / 1'000'000'000);
  }
}

TimeAccounting::Finished TimeAccounting::fold(const Thread& t, bool stated) const {
  Finished f;
  f.pid = t.pid;
  f.tid = t.tid;
  f.node = t.node;
  f.rank = t.rank;
  f.stated = stated;
  f.start = t.start;
  f.end = t.end;
  std::copy(std::begin(t.calls), std::end(t.calls), f.calls);
  std::copy(std::begin(t.blocked), std::end(t.blocked), f.blocked);
  f.preempted = t.preempted;
  f.unknown = t.unknown;
  f.rest = t.rest;
  f.by_stack.assign(t.by_stack.begin(), t.by_stack.end());
  f.by.assign(t.by.begin(), t.by.end());
  std::sort(f.by.begin(), f.by.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second > y.second : x.first < y.first;
  });
  if (f.by.size() > opt_.top_preemptors) f.by.resize(opt_.top_preemptors);
  for (const auto& [tid, ns] : f.by) {
    uint32_t pid = 0;
    if (auto it = threads_.find(key(t.node, tid)); it != threads_.end()) pid = it->second.pid;
    else if (auto o = other_pid_.find(tid); o != other_pid_.end()) pid = o->second;
    f.by_pid.push_back(pid);
  }
  return f;
}

namespace {
bool ranks_before(uint64_t wall_x, uint16_t node_x, uint32_t tid_x, uint64_t wall_y, uint16_t node_y, uint32_t tid_y) {
  if (wall_x != wall_y) return wall_x > wall_y;
  if (node_x != node_y) return node_x < node_y;
  return tid_x < tid_y;
}
}  // namespace

void TimeAccounting::evict(uint64_t now) {
  std::vector<uint64_t> gone;  // thread keys
  // Processes that exited long enough ago: every thread of theirs (late events of the process
  // have had exit_grace_ns to come).
  if (!exits_.empty()) {
    std::unordered_map<uint64_t, bool> procs;
    size_t kept = 0;
    for (const auto& x : exits_) {
      if (x.second + opt_.exit_grace_ns < now) procs[x.first] = true;
      else exits_[kept++] = x;
    }
    exits_.resize(kept);
    if (!procs.empty()) {
      for (auto& [k, t] : threads_)
        if (procs.count(key(t.node, t.pid))) gone.push_back(k);
      for (const auto& [pk, yes] : procs)
        if (stated_pids_.erase(pk)) ++stated_gen_;
    }
  }
  // Threads silent for idle_ns (looked for every idle_ns / 4 of trace time).
  if (now >= next_idle_scan_) {
    next_idle_scan_ = now + std::max<uint64_t>(opt_.idle_ns / 4, 1);
    for (auto& [k, t] : threads_)
      if (t.end + opt_.idle_ns < now) gone.push_back(k);
  }
  if (gone.empty()) return;
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  // A process has scheduler data when any of its threads (gone or staying) had a switch-out state.
  std::unordered_map<uint64_t, bool> stated;
  for (auto& [k, t] : threads_)
    if (t.stated) stated[key(t.node, t.pid)] = true;
  for (uint64_t k : gone) {
    Thread& t = threads_.at(k);
    if (t.feeds) {
      if (slicing_) {
        settle_for_flush(t, UINT64_MAX, true);  // its last slice goes out with the next flush
        if (t.cell_open) {
          closed_cells_.push_back(std::move(t.cell));
          t.cell_open = false;
        }
      } else {
        settle(t, t.end);
      }
      finished_.push_back(fold(t, stated.count(key(t.node, t.pid)) > 0));
      ++evicted_;
    }
  }
  for (uint64_t k : gone) {
    Thread& t = threads_.at(k);
    Slot& slot = cache_[(k * 0x9E3779B97F4A7C15ull) >> (64 - kCacheBits)];
    if (slot.t == &t) slot = Slot{};
  }
  feeders_.erase(std::remove_if(feeders_.begin(), feeders_.end(),
                                [&](const Thread* t) {
                                  return std::binary_search(gone.begin(), gone.end(), key(t->node, t->tid));
                                }),
                 feeders_.end());
  for (uint64_t k : gone) threads_.erase(k);
  // Keep the top K finished records (K >= max_threads: the result's top is unchanged).
  const size_t cap = std::max(opt_.max_finished, opt_.max_threads);
  if (finished_.size() > 2 * cap) {
    auto before = [](const Finished& x, const Finished& y) {
      return ranks_before(x.end - x.start, x.node, x.tid, y.end - y.start, y.node, y.tid);
    };
    std::nth_element(finished_.begin(), finished_.begin() + static_cast<std::ptrdiff_t>(cap), finished_.end(), before);
    finished_.resize(cap);
  }
}

void TimeAccounting::trim_bins(uint64_t newest_sec) {
  const uint64_t horizon = opt_.bin_horizon_ns / 1'000'000'000;
  if (!opt_.bin_horizon_ns || newest_sec < trimmed_sec_ + 10 || newest_sec <= horizon) return;  // every 10 s
  trimmed_sec_ = newest_sec;
  const uint64_t cut = newest_sec - horizon;  // seconds before it are dropped
  for (auto it = bins_.begin(); it != bins_.end();) {
    Bins& bs = it->second;
    if (bs.first_sec < cut) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(cut - bs.first_sec, bs.bins.size()));
      bs.bins.erase(bs.bins.begin(), bs.bins.begin() + static_cast<std::ptrdiff_t>(n));
      bin_count_ -= n;
      bs.first_sec = cut;
    }
    if (bs.bins.empty()) it = bins_.erase(it);
    else ++it;
  }
}

std::vector<ThreadAccounting> TimeAccounting::accounts(const TraceMeta& meta) {
  // Processes with scheduler data (a switch-out state recorded): their threads' time outside calls
  // and spans was on CPU.
  std::unordered_map<uint64_t, bool> sched_pids;
  for (auto& [k, t] : threads_)
    if (t.stated) sched_pids[key(t.node, t.pid)] = true;
  auto name_of = [&meta](uint32_t tid, uint32_t pid) -> std::string {
    if (auto it = meta.thread_names.find(tid); it != meta.thread_names.end() && !it->second.empty()) return it->second;
    if (pid) {
      if (auto it = meta.process_names.find(pid); it != meta.process_names.end()) return it->second;
    } else if (auto it = meta.process_names.find(tid); it != meta.process_names.end()) {
      return it->second;
    }
    return "";
  };
  std::unordered_map<uint64_t, BlockReason> reasons;  // by stack id
  std::vector<ThreadAccounting> out;
  auto add_account = [&](const Finished& t) {
    ThreadAccounting a;
    a.pid = t.pid;
    a.tid = t.tid;
    a.node = t.node;
    a.rank = t.rank;
    a.comm = name_of(t.tid, t.pid);
    a.start_ns = t.start;
    a.end_ns = t.end;
    a.wall_ns = t.end - t.start;
    for (size_t i = 0; i < kCallKindCount; ++i) a.in_calls_ns[kCallKinds[i]] = t.calls[i];
    uint64_t blocked[kBlockReasonCount];
    std::copy(std::begin(t.blocked), std::end(t.blocked), blocked);
    for (const auto& [stack, ns] : t.by_stack) {
      auto it = reasons.find(stack);
      if (it == reasons.end()) {
        BlockReason r = BlockReason::kOther;
        if (auto st = meta.stacks.find(stack); st != meta.stacks.end()) r = block_reason(parse_stack(st->second));
        it = reasons.emplace(stack, r).first;
      }
      blocked[static_cast<size_t>(it->second)] += ns;
    }
    for (size_t i = 0; i < kBlockReasonCount; ++i) a.blocked_ns[kBlockReasons[i]] = blocked[i];
    a.preempted_ns = t.preempted;
    a.unknown_ns = t.unknown;
    a.scheduler_data = t.stated || sched_pids.count(key(t.node, t.pid)) > 0;
    if (a.scheduler_data) a.on_cpu_ns = t.rest;
    else a.unknown_ns += t.rest;
    for (size_t i = 0; i < t.by.size(); ++i) {
      PreemptedBy p;
      p.tid = t.by[i].first;
      p.pid = i < t.by_pid.size() ? t.by_pid[i] : 0;
      if (!p.pid) {
        if (auto it = threads_.find(key(t.node, p.tid)); it != threads_.end()) p.pid = it->second.pid;
        else if (auto o = other_pid_.find(p.tid); o != other_pid_.end()) p.pid = o->second;
      }
      p.comm = name_of(p.tid, p.pid);
      p.ns = t.by[i].second;
      a.preempted_by.push_back(std::move(p));
    }
    out.push_back(std::move(a));
  };
  for (auto& [k, t] : threads_) {
    if (!t.feeds) continue;
    settle(t, t.end);
    add_account(fold(t, false));
  }
  for (const Finished& f : finished_) add_account(f);
  std::sort(out.begin(), out.end(), [](const ThreadAccounting& x, const ThreadAccounting& y) {
    return ranks_before(x.wall_ns, x.node, x.tid, y.wall_ns, y.node, y.tid);
  });
  return out;
}

void TimeAccounting::enable_slices(SliceOptions o) {
  slicing_ = true;
  slice_opt_ = std::move(o);
}

void TimeAccounting::settle_for_flush(Thread& t, uint64_t watermark, bool final) {
  const uint64_t upto = final ? t.end : std::min(watermark, t.end);
  if (upto > t.settled) settle(t, upto);
  // The open slice goes out only once it cannot grow: when the watermark is past the thread's
  // last event by more than gap_ns (whatever comes next starts a gap), or at the end. Where
  // batches were cut then never changes how many slices a window gets.
  if (final || watermark > t.end + slice_opt_.gap_ns) close_slice(t);
}

void TimeAccounting::flush_slices(uint64_t watermark, bool final, std::vector<Event>& out) {
  if (!slicing_ || slice_opt_.totals) return;
  for (auto& [k, t] : threads_)
    if (t.feeds) settle_for_flush(t, watermark, final);
  out.insert(out.end(), slices_.begin(), slices_.end());
  slices_.clear();
}

void TimeAccounting::flush_cells(uint64_t watermark, bool final, std::vector<CellTotals>& out) {
  if (!slicing_ || !slice_opt_.totals) return;
  for (Thread* t : feeders_) {
    const uint64_t upto = final ? t->end : std::min(watermark, t->end);
    if (upto > t->settled) settle(*t, upto);
    if (t->cell_open) {  // its current cell so far (the rest of it, if any, comes in a later flush)
      closed_cells_.push_back(std::move(t->cell));
      t->cell_open = false;
    }
  }
  for (auto& c : closed_cells_) out.push_back(std::move(c));
  closed_cells_.clear();
}

void TimeAccounting::finish(const TraceMeta& meta, AnalysisResult& result) {
  if (opt_.chain_accounting) {
    bin_slices_.clear();
    flush_slices(UINT64_MAX, true, bin_slices_);
    fold_bins(bin_slices_);
  }
  std::vector<ThreadAccounting> all = accounts(meta);
  if (opt_.chain_accounting) {
    for (Chain& c : result.chains) {
      uint32_t tid = c.tid;
      if (!tid) {  // a process-wide chain: its thread with the most time in the window
        // Ties (every thread alive through the window has all of it) go to the smaller tid, not
        // to the order of bins_, which depends on where batches were cut.
        uint64_t best = 0;
        for (const auto& [k, bs] : bins_) {
          if (bs.pid != c.pid || (k >> 32) != c.node) continue;
          const auto th = static_cast<uint32_t>(k);
          auto r = range(meta, c.node, th, c.window_start, c.window_end);
          if (r && r->wall_ns > 0 && (r->wall_ns > best || (r->wall_ns == best && th < tid))) {
            best = r->wall_ns;
            tid = th;
          }
        }
      }
      if (tid) c.accounting = range(meta, c.node, tid, c.window_start, c.window_end);
    }
  }
  if (all.size() > opt_.max_threads) all.resize(opt_.max_threads);
  result.accounting = std::move(all);
}

}  // namespace ingero
