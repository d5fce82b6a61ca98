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
//   counts only from there on. Per-thread state is a few pending segments (settled every 64),
//   the per-bucket totals, the tasks that preempted it and the stacks of its blocked spans;
//   threads without a GPU call are tracked too (they may issue one later) and dropped at the end.
// - Results depend neither on batch boundaries nor on absolute time (shifting every timestamp by
//   a constant changes only start_ns/end_ns).
// - Single-threaded (an EventObserver runs on the source's thread).
#pragma once

#include <cstddef>
#include <cstdint>
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

struct AccountingOptions {
  uint64_t from_ns = 0, to_ns = UINT64_MAX;  // the interval accounted (each thread's is clipped to it)
  size_t max_threads = 16;                   // finish(): the main feeding threads kept in the result
  size_t top_preemptors = 5;                 // preempted_by entries per thread
};

class TimeAccounting final : public EventObserver {
 public:
  explicit TimeAccounting(AccountingOptions o = {}) : opt_(o) {}
  void observe(const Event* events, size_t n) override;
  // result.accounting = the first max_threads of accounts(meta).
  void finish(const TraceMeta& meta, AnalysisResult& result) override;
  // Every feeding thread, wall time desc (then node, tid). May be called more than once; events
  // observed after it still count.
  std::vector<ThreadAccounting> accounts(const TraceMeta& meta);

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
    size_t pending = 0;
    Lane lanes[kLanes];
    uint64_t calls[kCallKindCount] = {}, blocked[kBlockReasonCount] = {};
    uint64_t preempted = 0, unknown = 0, rest = 0;
    std::unordered_map<uint32_t, uint64_t> by;        // preempting tid -> ns
    std::unordered_map<uint64_t, uint64_t> by_stack;  // blocked ns by stack id (reason from frames)
  };
  static uint64_t key(uint16_t node, uint32_t tid) { return uint64_t{node} << 32 | tid; }
  Thread& thread(const Event& e);
  // `started`, `ended`: the call's start and end before clipping (calls only).
  void add(Thread& t, uint8_t lane, uint64_t s, uint64_t e, uint64_t tag, bool by_stack, uint64_t started = 0,
           uint64_t ended = 0);
  static void settle(Thread& t, uint64_t upto);
  static void credit(Thread& t, int lane, const Seg* g, uint64_t d);

  AccountingOptions opt_;
  std::unordered_map<uint64_t, Thread> threads_;
  std::unordered_map<uint32_t, uint32_t> other_pid_;  // a preempting tid -> its process (sched span arg0)
  struct Slot {
    uint64_t key = 0;
    Thread* t = nullptr;
  };
  static constexpr int kCacheBits = 8;
  Slot cache_[size_t{1} << kCacheBits];
};

}  // namespace ingero
