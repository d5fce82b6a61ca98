// Time accounting: where every GPU-feeding thread's wall time goes (issue 40).
//
// Contract:
// - A *feeding thread* is a (node, tid) that issued at least one GPU API event (model/ops.h
//   is_gpu_api: CUDA runtime, driver, graph, NCCL). Its interval is [start of its first event,
//   end of its last event] (calls and sched_switch spans of that tid), clipped to
//   [AccountingOptions::from_ns, to_ns] (the whole trace by default).
// - Inputs: GPU API calls of the thread, and its off-CPU spans: HOST sched_switch events with a
//   duration (ts = switch-out, dur = time off CPU, prev_state the state at switch-out, arg1 the tid
//   of the task that ran instead, stack_id the stack at switch-out). Unpaired live halves
//   (kSwitchOut/kSwitchIn) are ignored, as the chain annotator does. Every other event is ignored.
// - Every nanosecond of the interval goes to exactly one bucket, by this precedence where
//   intervals overlap (highest first):
//     1. preempted: an off-CPU span with prev_state kPreempted (credited to the task in arg1);
//     2. in a call: inside a GPU API call; nested or overlapping calls count once and the
//        OUTERMOST call's kind owns the time (the call that started first; at equal starts the
//        longer one): launch, copy, sync, alloc, collective (NCCL), other;
//     3. blocked: an off-CPU span with prev_state kSleeping, kDiskWait or kOther, by reason:
//        kDiskWait -> io; otherwise from the kernel frames of the span's stack (innermost first,
//        the first frame that matches): futex_wait* -> lock; sk_wait_data, tcp_recvmsg, sock_*,
//        unix_stream_* -> network; hrtimer_nanosleep, do_nanosleep, schedule_hrtimeout* -> sleep;
//        io_schedule*, blk_*, folio_wait* -> io; no stack or no match -> other;
//     4. unknown: an off-CPU span with prev_state kUnknown (Ingero's traces record no state);
//     5. the rest (outside calls, not off CPU): on CPU when the thread's process (node, pid) has
//        scheduler data, i.e. at least one sched_switch span in the interval with a recorded
//        prev_state; else unknown: nothing says it was on CPU. A trace without switch-out states
//        is an Ingero trace, and Ingero stores only a sample of its switches (and of its calls),
//        so the gaps between its spans do not mean "on CPU".
//   Off-CPU spans of one thread overlapping each other (bad data): the one that started first
//   owns the overlap within its level; levels follow the precedence above.
// - Conservation, exact in integer ns: wall = sum(in_calls) + on_cpu + preempted + sum(blocked)
//   + unknown for every thread (model/accounting.h).
// - Streaming, one pass: events must come in ts_ns order (batches sorted). A context interval
//   that arrives late (event_flags::kLate) and starts before time the thread has already settled
//   counts only from there on. Per-thread state is a few pending segments (settled every 64, and at once
//   when a call of the thread starts after every pending one ends: a thread's calls one after another
//   are settled as they come, the last held in place),
//   the per-bucket totals, the tasks that preempted it and the stacks of its blocked spans;
//   threads without a GPU call are tracked too (they may issue one later) and dropped at the end.
// - Results depend neither on batch boundaries nor on absolute time (shifting every timestamp by
//   a constant changes only start_ns/end_ns).
// - Single-threaded (an EventObserver runs on the source's thread).
// - Slices (enable_slices; the engine's `from accounting` stream, rules over time): every piece of
//   a feeding thread's time, as it is settled, becomes a synthetic Event (source kAccount, op the
//   bucket below, ts/dur the piece, pid/tid/node/rank the thread; preempted: arg0/arg1 the pid/tid
//   that ran instead, 0 when unknown; blocked: stack_id the switch-out stack). Pieces are cut at
//   multiples of grid_ns (so a window of that size or a multiple gets exactly its time) and
//   adjacent pieces of one bucket and task within a cell are one slice. flush_slices(watermark)
//   settles each thread up to min(watermark, its last event end): by the batch contract nothing
//   on time arrives before the watermark; a context interval delivered late (kLate) counts only
//   from the settled point (its earlier part is counted in late_ns()). A stretch longer than
//   gap_ns in which nothing of the thread was seen (no call, no switch) is not sliced, so that
//   which slices a window gets never depends on where batches were cut (the engine keeps windows
//   of accounting open that long past their end; kAccountLatenessNs). Time a thread spent
//   before its first GPU call is not sliced (it was not known to feed the GPU then). Time outside
//   calls and spans is on_cpu from the start of the first span of the thread's process with a
//   switch-out state on, unknown before it and in processes with none (Ingero's traces); unlike
//   accounts(), which judges the whole interval by whether there is one at all. The blocked reason
//   of a stack comes from reason_of (null: kOther).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "model/accounting.h"
#include "model/event.h"
#include "model/result.h"
#include "model/stack.h"
#include "operators/event_observer.h"

namespace ingero {

// Indexes into model/accounting.h kCallKinds and kBlockReasons.
enum class CallKind : uint8_t { kLaunch = 0, kCopy, kSync, kAlloc, kCollective, kOther };
enum class BlockReason : uint8_t { kLock = 0, kIo, kNetwork, kSleep, kOther };
inline constexpr size_t kCallKindCount = 6, kBlockReasonCount = 5;

// The kind of a GPU API call (launch for cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch; every
// NCCL op is a collective; unknown ops of a GPU source are "other").
CallKind call_kind(Source s, uint8_t op);
// Why a thread slept, from the frames of its switch-out stack (innermost first); kOther when no
// frame matches.
BlockReason block_reason(const ParsedStack& st);

// A slice's bucket (model/accounting.h acct::) for a call kind and a block reason.
namespace acct {
inline uint8_t call_bucket(CallKind k) { return static_cast<uint8_t>(kLaunch + static_cast<uint8_t>(k)); }
inline uint8_t blocked_bucket(BlockReason r) { return static_cast<uint8_t>(kLock + static_cast<uint8_t>(r)); }
}  // namespace acct

struct SliceOptions {
  uint64_t grid_ns = 1'000'000'000;  // slices never cross a multiple of it
  uint64_t gap_ns = 1'000'000'000;   // a feeding thread's stretch with no event longer than this is not sliced
  // The reason a blocked span's stack names; false when the stack is not known (yet): the span's
  // time is blocked_other and the stack is asked again next time. Null: always blocked_other.
  std::function<bool(uint64_t stack_id, BlockReason& out)> reason_of;
  // The time is summed per thread and grid cell as it is settled (flush_cells) instead of cut into
  // slice Events (flush_slices): no Event per piece.
  bool totals = false;
};

struct AccountingOptions {
  uint64_t from_ns = 0, to_ns = UINT64_MAX;  // the interval accounted (each thread's is clipped to it)
  size_t max_threads = 16;                   // finish(): the main feeding threads kept in the result
  size_t top_preemptors = 5;                 // preempted_by entries per thread
  // Per-second bins of every feeding thread's buckets (slices, grid 1 s, settled no further than
  // each thread's last event), so finish() gives each chain of the result the accounting of its
  // own thread and window (Chain::accounting; window edges rounded to whole seconds). At most
  // max_bins bins in all (about 140 bytes each); past that, no more are kept (bins_dropped()).
  bool chain_accounting = false;
  size_t max_bins = size_t{1} << 20;
  // chain_accounting: where blocked spans' stacks are looked up (TraceMeta::stacks as the source
  // fills it; read on the source's thread, where observe() runs). Null: blocked_other.
  const TraceMeta* meta = nullptr;
  // A service runs for months over a churn of processes (the agent sets these; off by default):
  // - evict: a feeding thread whose process exited (HOST process_exit of its leader, pid == tid)
  //   more than exit_grace_ns of trace time ago, or that has been silent for idle_ns, is settled
  //   to its last event and folded into a compact finished record; its Thread state is freed.
  //   At most max(max_finished, max_threads) finished records are kept, the longest wall time
  //   first (then node, tid): the top max_threads of accounts() are the same as without eviction
  //   (a thread that comes back after idle_ns of silence is a new record: its two parts are
  //   accounted apart, the silence in neither). Threads without a GPU call are dropped.
  // - bin_horizon_ns (chain_accounting): bins older than this before the newest one are dropped
  //   (a thread whose bins are all gone is forgotten): range() and series() see only the horizon,
  //   so a chain whose window ended before it gets no Chain::accounting. 0: keep every bin.
  bool evict = false;
  uint64_t idle_ns = 60'000'000'000;
  uint64_t exit_grace_ns = 5'000'000'000;
  size_t max_finished = 256;
  uint64_t bin_horizon_ns = 0;
};

// The totals of one feeding thread's slices in one grid cell (flush_cells): what the engine's
// `from accounting` stream carries, without an Event per slice.
struct CellTotals {
  uint64_t cell = 0;  // ts_ns / max(grid_ns, 1) of its slices
  uint32_t pid = 0, tid = 0;
  uint16_t node = 0;
  int16_t rank = -1;  // of the latest slice added
  uint64_t b[acct::kBuckets] = {};
  // Preempted ns by the task that ran instead (the slices' arg0 << 32 | arg1), first seen first.
  std::vector<std::pair<uint64_t, uint64_t>> by;
};

class TimeAccounting final : public EventObserver {
 public:
  explicit TimeAccounting(AccountingOptions o = {});
  void observe(const Event* events, size_t n) override;
  // result.accounting = the first max_threads of accounts(meta); with chain_accounting, every
  // chain with a thread (or a pid: its thread with the most time in the window, ties to the
  // smaller tid) gets Chain::accounting = range(...) of its window.
  void finish(const TraceMeta& meta, AnalysisResult& result) override;
  // chain_accounting: the thread's buckets over [from_ns, to_ns), from its bins (the seconds that
  // overlap the range, whole); wall = the time accounted in them. nullopt: no bins for the thread.
  std::optional<ThreadAccounting> range(const TraceMeta& meta, uint16_t node, uint32_t tid, uint64_t from_ns,
                                        uint64_t to_ns) const;
  // chain_accounting: the thread's per-second bins as a series (model/accounting.h), from its
  // first second with a bin to its last; nullopt when it has none.
  std::optional<AccountingSeries> series(uint16_t node, uint32_t tid) const;
  uint64_t bins_dropped() const { return bins_dropped_; }
  // Every feeding thread, wall time desc (then node, tid). May be called more than once; events
  // observed after it still count.
  std::vector<ThreadAccounting> accounts(const TraceMeta& meta);

  // Slices (see the contract). enable_slices before the first observe().
  void enable_slices(SliceOptions o);
  // Settles every feeding thread (see the contract) and appends the slices closed since the last
  // flush to `out` (each thread's in time order). A slice is closed when the next piece of the
  // thread's time starts a new one (another bucket or task, the next grid cell, after a gap), when
  // the watermark is more than gap_ns past the thread's last event, or at `final` (every thread
  // settled to its last event end): the slices are the same however the batches were cut.
  void flush_slices(uint64_t watermark, bool final, std::vector<Event>& out);
  // SliceOptions::totals: settles every feeding thread as flush_slices does and appends, per thread
  // with time settled since the last flush, its totals per grid cell of that time (a thread's cells
  // in time order). A (cell, thread) may come in several flushes, each with what was settled by
  // then: their sum per (cell, node, tid) is exactly the sum of the slices flush_slices would give
  // (the same time, gaps and first-call rule), and once the watermark is more than gap_ns past a
  // cell's end every part of it has come (later events start after a silent gap), whatever the
  // batches.
  void flush_cells(uint64_t watermark, bool final, std::vector<CellTotals>& out);
  uint64_t late_ns() const { return late_ns_; }  // time of late context intervals before the settled point
  // evict: the threads with live state (Thread records), and the finished records kept.
  size_t live_threads() const { return threads_.size(); }
  size_t finished_threads() const { return finished_.size(); }
  uint64_t threads_evicted() const { return evicted_; }

 private:
  struct Seg {
    uint64_t s = 0, e = 0;
    uint64_t tag = 0;       // preempted: the tid that ran; call: CallKind; blocked: reason or stack id
    bool by_stack = false;  // blocked: tag is a stack id whose frames decide the reason at the end
  };
  struct Lane {  // disjoint segments in start order, [head, size) not yet settled
    std::vector<Seg> segs;
    size_t head = 0;
    uint64_t cover = 0;  // the largest end pushed so far
  };
  enum : uint8_t { kLanePreempted = 0, kLaneCall = 1, kLaneBlocked = 2, kLaneUnknown = 3, kLanes = 4 };
  struct Thread {
    uint32_t pid = 0, tid = 0;
    uint16_t node = 0;
    int16_t rank = -1;
    bool feeds = false, sched = false, stated = false;  // stated: a span with a known prev_state
    uint64_t start = 0, end = 0, settled = 0;
    uint64_t call_s = 0, call_e = 0;  // the call that owns the newest call segment: its start, end (unclipped)
    uint64_t cover_all = 0;           // the largest end of a segment pushed to any lane
    size_t pending = 0;
    Lane lanes[kLanes];
    uint64_t calls[kCallKindCount] = {}, blocked[kBlockReasonCount] = {};
    uint64_t preempted = 0, unknown = 0, rest = 0;
    std::unordered_map<uint32_t, uint64_t> by;        // preempting tid -> ns
    std::unordered_map<uint64_t, uint64_t> by_stack;  // blocked ns by stack id (reason from frames)
    bool open = false;
    uint64_t gap_s = 0, gap_e = 0;  // slices: the latest silent gap (not sliced)
    Event slice;
    // slices: the start of the process's first switch-out state (stated_pids_), as of stated_gen_
    uint64_t stated_from = UINT64_MAX, stated_gen = 0;
    bool cell_open = false;  // totals: `cell` holds time settled and not yet flushed
    uint64_t cell_hi = 0;    // totals: the end of `cell`'s grid cell
    CellTotals cell;
  };
  static uint64_t key(uint16_t node, uint32_t tid) { return uint64_t{node} << 32 | tid; }
  Thread& thread(const Event& e);
  // `started`, `ended`: the call's start and end before clipping (calls only).
  void add(Thread& t, uint8_t lane, uint64_t s, uint64_t e, uint64_t tag, bool by_stack, uint64_t started = 0,
           uint64_t ended = 0);
  void settle(Thread& t, uint64_t upto);
  // [s, e) of the thread's time goes to `lane` (-1: the rest) and, when slicing, to a slice.
  void credit(Thread& t, int lane, const Seg* g, uint64_t s, uint64_t e);
  void slice(Thread& t, uint8_t bucket, uint64_t s, uint64_t e, uint64_t other_tid, uint64_t stack_id);
  void close_slice(Thread& t);
  void add_to_cell(Thread& t, uint8_t bucket, uint64_t s, uint64_t e, uint64_t other_tid);
  void settle_for_flush(Thread& t, uint64_t watermark, bool final);

  AccountingOptions opt_;
  bool slicing_ = false;
  SliceOptions slice_opt_;
  std::vector<Event> slices_;                           // closed slices not yet flushed
  std::unordered_map<uint64_t, uint64_t> stated_pids_;  // slices: (node, pid) -> start of its first switch-out state
  uint64_t stated_gen_ = 0;                             // bumped whenever stated_pids_ changes
  std::vector<CellTotals> closed_cells_;                // SliceOptions::totals: cells passed, not yet flushed
  std::unordered_map<uint64_t, uint8_t> stack_bucket_;  // slices: a blocked stack's bucket
  uint64_t late_ns_ = 0;
  // chain_accounting: per (node, tid), its bins from its first second on.
  struct Bin {
    uint64_t b[acct::kBuckets] = {};
    std::vector<std::pair<uint32_t, uint64_t>> by;  // preempting tid -> ns (at most 8, the least replaced)
  };
  struct Bins {
    uint64_t first_sec = 0;
    uint32_t pid = 0;
    std::vector<Bin> bins;
  };
  std::unordered_map<uint64_t, Bins> bins_;
  size_t bin_count_ = 0;
  uint64_t bins_dropped_ = 0;
  std::vector<Event> bin_slices_;
  void fold_bins(const std::vector<Event>& slices);
  // evict: a feeding thread's totals once its state is freed (accounts() reads them as a Thread's).
  struct Finished {
    uint32_t pid = 0, tid = 0;
    uint16_t node = 0;
    int16_t rank = -1;
    bool stated = false;  // its process had a switch-out state when it was folded
    uint64_t start = 0, end = 0;
    uint64_t calls[kCallKindCount] = {}, blocked[kBlockReasonCount] = {};
    uint64_t preempted = 0, unknown = 0, rest = 0;
    std::vector<std::pair<uint64_t, uint64_t>> by_stack;  // blocked ns by stack id
    std::vector<std::pair<uint32_t, uint64_t>> by;        // top preempting tids -> ns
    std::vector<uint32_t> by_pid;                         // their pids (0: unknown) as of the fold
  };
  Finished fold(const Thread& t, bool stated) const;
  void evict(uint64_t now);
  void trim_bins(uint64_t newest_sec);
  std::vector<Finished> finished_;
  std::vector<std::pair<uint64_t, uint64_t>> exits_;  // (node, pid) key, exit ts: not yet evicted
  uint64_t next_idle_scan_ = 0, evicted_ = 0, trimmed_sec_ = 0;
  std::unordered_map<uint64_t, Thread> threads_;
  std::vector<Thread*> feeders_;                      // the threads with a GPU call, in the order of their first
  std::unordered_map<uint32_t, uint32_t> other_pid_;  // a preempting tid -> its process (sched span arg0)
  struct Slot {
    uint64_t key = 0;
    Thread* t = nullptr;
  };
  static constexpr int kCacheBits = 8;
  Slot cache_[size_t{1} << kCacheBits];
};

}  // namespace ingero
