// Chain annotation: which thread issued a chain's slow calls, from where in the code, and where
// the launching thread's time went. Runs after the rules: it fills Chain::tid/threads/stacks/
// time_split (model/result.h) from the trace's events and TraceMeta::stacks, and it is the
// built-in detector of `launch_gap` chains (a thread that stopped launching GPU work for a while).
//
// Contract:
// - Feed it the same events the engine saw, in batch order (add()); then annotate() the chains.
//   With retention 0 it keeps everything (tests, small traces); the CLI and MCP paths use
//   LiveChainAnnotator below, which annotates each chain as the engine emits it and keeps only the
//   recent horizon (`retention_ns` behind the newest event, past a floor of `min_records`, under a
//   hard cap), so memory is bounded by event rate x horizon, never by trace length. Kept per thread,
//   compactly (ChainRecordSeries below, ~7 bytes an event):
//   probed GPU API calls (CUDA/DRIVER/GRAPH/NCCL), off-CPU spans (HOST sched_switch with a
//   duration; unpaired live halves are ignored) and on-CPU samples (HOST cpu_sample). Every other
//   event is counted and dropped.
// - Slow calls of a chain = the calls of its key (pid, source, op; tid/rank when the chain has
//   them) that START in its window with duration >= max(p95, 3 x p50) — the tail rules'
//   definition (rules/common.rules, `slow_threshold`), read from the chain's `p50`/`p95` values.
//   Chains without p50 (rate chains) use all their calls, weighted by count instead of time.
// - threads: the slow calls' time by thread, largest first; Chain::tid is set to threads[0] when
//   the chain had no thread (pid-keyed rules). stacks: the top `top_stacks` stacks of the slow
//   calls (role "call", share of slow-call time), then for cpu_contention/blocking the off-CPU
//   stacks of those threads overlapping the slow calls (role "offcpu", by overlap time), and for
//   rate/gap chains the launching thread's off-CPU stacks and on-CPU samples in the window (roles
//   "offcpu" and "sample"). A share is of the role's total, stack-less events included, so shares
//   of listed stacks may sum below 1. A chain whose top call stack has frames gets a first fix
//   naming its call site (model/stack.h call_site()).
// - time_split (throughput_drop and launch_gap chains): for the launching thread (most launch
//   calls of the process in the window; else most GPU API calls) over the window: in_calls = union
//   of its call intervals, off_cpu_* = its off-CPU spans outside any call by state (preempted;
//   sleeping/disk wait/other = blocked; unknown), on_cpu = the rest. The chain's root cause, a
//   summary suffix and the explanation's generic "input starvation, blocking, or a phase change"
//   sentence are replaced by what the dominant share says.
// - Warm-up (warmup_ns after the first GPU API call of each (node, pid) seen by add(); 0 turns it
//   off): a chain's calls that start inside it are judged apart. A tail chain (one with p50) is
//   re-judged without them - fewer than warmup_min_calls calls left, or p99 < warmup_tail_ratio x
//   p50 of the rest - and then comes from warm-up alone; a count-weighted chain (implicit_sync,
//   cuda_graph) comes from warm-up when >= 50% of its calls are in it. Such a chain is demoted to
//   LOW, its summary starts with "warm-up:" and its root cause says so, unless the warm-up calls
//   themselves hold >= warmup_abnormal_ns (an abnormal warm-up keeps its severity and says so).
//   Every chain with calls in a warm-up gets the values warmup.calls, warmup.share (of the
//   chain's weight), warmup.window_ns, warmup.only (1: it stood on warm-up calls alone) and
//   warmup.abnormal (1: ... and they held >= warmup_abnormal_ns). warmup_ns is the rule pack's
//   `param warmup` (rules/common.rules, 10 s): the CLI reads it with rules::pack_param() and
//   --param overrides (cli/pipeline_common.h annotate_options()); the default here equals it.
// - Severity: the annotator states the facts below (values, the time split) and annotate() calls
//   operators/severity.h grade_chain(), which decides; "demoted"/"capped" below is its decision
//   (the counters count them).
// - Severity from the time split (throughput_drop): a launching thread blocked off CPU for the
//   dominant share was idle (its load fell, or it waited for input): >= 50% blocked caps the
//   chain at LOW, a smaller dominant blocked share at MEDIUM; off CPU with unknown state (no
//   state recorded) caps it at MEDIUM. On CPU, preempted or in calls keep the rule's severity.
// - implicit_sync chains get the first fix naming their top call site, as tail chains do, and the
//   value `launches` (kernel launches of their thread in the window); with none, the thread is
//   not a launch loop and the chain is demoted to LOW.
// - launch_gap: a thread whose consecutive launches (cudaLaunchKernel, cuLaunchKernel,
//   cudaGraphLaunch) are >= gap_min_ns apart, with >= gap_min_launches launches in the
//   gap_context_ns before the gap and after it; one chain per (node, pid, tid) and tumbling
//   gap_window_ns window of the gap start, for its longest gap (the others are counted in it).
//   take_gap_chains() returns each chain once, when its window and the context after it are in
//   (or at `final`). The launches before a gap are counted when the gap is seen; its time split
//   and stacks when its chain is built, so live retention must cover gap_window_ns +
//   gap_context_ns + the gap (older gaps are counted in too_old and come out unannotated).
// - Losses (TraceMeta::health.loss_spans, live capture): a chain gets dropped_events = the events
//   lost in spans overlapping its window (kLossMarginNs either side), replacing the trace-wide
//   count, and the value lost_events when there are any. A chain that stands on events NOT being
//   there - launch_gap (no launch for a while) and throughput_drop (fewer calls) - could be made
//   of the capture's own losses: it is demoted to LOW, its summary starts with "lossy capture
//   (N events lost in this window):" and its root cause says it is not established (counted in
//   loss_demoted). Other chains (slow calls, syncs: losses cannot make a recorded call slow) keep
//   their severity and say in the explanation how many events the window lost. With no span
//   known (replayed Ingero traces) nothing changes.
// - A chain whose window starts before what retention or the record cap already evicted is left
//   unannotated (counted in too_old) rather than annotated from partial data.
// - Never throws, data plane: odd input is counted (AnnotateCounters). Work per chain is a binary
//   search plus a walk over the chain window's events of the threads involved.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/stack.h"
#include "model/trace.h"
#include "operators/spill_file.h"

namespace ingero {

struct AnnotateOptions {
  uint64_t retention_ns = 0;      // 0 = keep every event (replay); live: largest window + lateness
  size_t max_records = 8u << 20;  // hard cap on kept events; the oldest thread data goes first
  size_t min_records = 0;         // retention evicts only while more than this many are kept
  // Bytes of sealed record blocks held in memory; beyond it they go to a spill file (SpillFile,
  // operators/spill_file.h) and are read back when needed. 0 = everything in memory.
  size_t resident_bytes = 0;
  size_t top_stacks = 3;
  bool detect_gaps = true;
  uint64_t gap_min_ns = 100'000'000;        // 100 ms without a launch
  uint64_t gap_context_ns = 1'000'000'000;  // launches looked for before and after the gap
  uint64_t gap_min_launches = 5;            // ... at least this many on each side
  uint64_t gap_window_ns = 10'000'000'000;  // one chain per thread and window (its longest gap)
  uint64_t gap_high_ns = 1'000'000'000;     // severity high from this gap length
  // Warm-up per process (see the contract above). Default 10 s = the pack's `param warmup`
  // (rules/common.rules; a test keeps them equal): CUDA context creation (hundreds of ms), first
  // allocations, cuDNN/cuBLAS autotuning and graph capture of a typical job.
  uint64_t warmup_ns = 10'000'000'000;
  uint64_t warmup_min_calls = 10;               // = the pack's min_calls
  double warmup_tail_ratio = 3.0;               // = the pack's min_tail_ratio
  uint64_t warmup_abnormal_ns = 5'000'000'000;  // warm-up calls holding this long are abnormal
};

struct AnnotateCounters {
  uint64_t events = 0;                                // seen by add()
  uint64_t calls = 0, offcpu_spans = 0, samples = 0;  // kept
  uint64_t ignored = 0;                               // not a call, a span with a duration, or a sample
  uint64_t out_of_order = 0;                          // inserted behind newer events of their thread (late spans)
  uint64_t evicted = 0;                               // dropped by retention or the record cap
  uint64_t capped = 0;                                // of those, dropped by the record cap before their horizon
  uint64_t gaps = 0;                                  // launch gaps >= gap_min_ns seen
  uint64_t gap_chains = 0;                            // launch_gap chains returned
  uint64_t stacks_missing = 0;                        // stack ids an event referenced that TraceMeta::stacks lacks
  uint64_t too_old = 0;                               // chains left unannotated: their window starts before the horizon
  uint64_t warmup_demoted = 0;  // chains demoted to LOW: their calls come from a process's warm-up
  uint64_t split_capped = 0;    // throughput_drop chains whose severity the time split capped
  uint64_t not_in_loop = 0;     // implicit_sync chains demoted: their thread launched no kernel
  uint64_t loss_demoted = 0;    // launch_gap/throughput_drop chains demoted: the capture lost events in their window
};

// One kept event of a thread as the annotator reads it back (pid, node and rank are the thread's).
struct ChainRecord {
  uint64_t ts = 0, dur = 0, stack = 0;
  Source source = Source::kUnknown;
  uint8_t op = 0;
  OffCpuState state = OffCpuState::kUnknown;
  uint64_t end() const { return ts + dur; }
  bool operator==(const ChainRecord&) const = default;
};

// The kept records of one thread and kind (calls, off-CPU spans or samples), sorted by start time
// (a record inserted with the ts of others goes after them), stored compactly: the newest
// 2 x kBlock records as they are, older ones sealed in blocks of kBlock records of three varints
// each - ts delta from the previous record, duration, and an index into the series' table of
// (source, op, state, stack) tuples (0 = the tuple follows inline, when the table is full) -
// about 7 bytes a record instead of 32. Answers what a deque of ChainRecord would: insert, front,
// pop_front and the records starting in [start, end) in order. A late record that falls inside a
// sealed block re-encodes that block (counted by the caller as out of order). With a SpillFile
// (set_spill), a sealed block may go to the file while the file is over its resident budget; a
// query reads it back into a scratch buffer, a pop or a late insert into it brings it back into
// memory. Should a read of our own file fail (counted by the file), the block's records read as
// missing to queries and as empty records at its last timestamp to pops, so counts stay right.
// Never throws except std::bad_alloc.
class ChainRecordSeries {
 public:
  static constexpr size_t kBlock = 128;
  static constexpr size_t kMaxTuples = 4096;  // per series; further tuples are stored inline

  // False when `r` went behind a newer record (out of order).
  bool insert(const ChainRecord& r);
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  ChainRecord front() const;
  // front() for a caller about to pop: a spilled first block comes back into memory first, so a
  // loop of checks and pops reads it once (front() reads it on every call).
  ChainRecord front_to_pop();
  void pop_front();
  // Removes every record that starts before `ts` (what a loop of front()/pop_front() would), whole
  // sealed blocks without decoding or reading them back; returns how many.
  size_t drop_before(uint64_t ts);
  // Where sealed blocks may go (null: they stay in memory). Set while the series is empty; the
  // file must outlive the series' blocks.
  void set_spill(SpillFile* f) { spill_ = f; }
  // The longest duration inserted since the series was last empty (a window search starts this
  // much earlier to find records that overlap it).
  uint64_t max_dur() const { return max_dur_; }
  // Calls f(const ChainRecord&) for each record that STARTS in [start, end), oldest first.
  template <class F>
  void for_each(uint64_t start, uint64_t end, F&& f) const;
  // Heap bytes held (capacities; an estimate of container overhead included).
  size_t heap_bytes() const;

 private:
  struct Tuple {
    uint64_t stack = 0;
    Source source = Source::kUnknown;
    uint8_t op = 0;
    OffCpuState state = OffCpuState::kUnknown;
  };
  struct Block {
    uint64_t base_ts = 0;        // ts the first live record's delta is taken from
    uint64_t last_ts = 0;        // ts of the last record
    uint32_t off = 0;            // byte offset of the first live record (pop_front advances it)
    uint32_t n = 0;              // live records
    std::vector<uint8_t> bytes;  // empty while the block is in the spill file
    SpillFile::Slot slot;        // slot.cap != 0: in the spill file
    bool spilled() const { return slot.cap != 0; }
  };
  static const uint8_t* decode(const uint8_t* p, uint64_t& prev_ts, const std::vector<Tuple>& tuples, ChainRecord& r);
  void encode(std::vector<uint8_t>& out, uint64_t& prev_ts, const ChainRecord& r);
  void seal();
  Block make_block(const ChainRecord* first, size_t n);
  std::vector<ChainRecord> decode_block(const Block& b) const;
  // The block's bytes (from its start; `off` applies): in memory, or read into `scratch`; null
  // when the read failed.
  const uint8_t* data_of(const Block& b, std::vector<uint8_t>& scratch) const;
  void add_block(Block b);    // appends a sealed block, spilling it when over budget
  void forget(Block& b);      // the block leaves the series: its slot or resident bytes
  void bring_back(Block& b);  // a spilled block back into memory

  std::deque<Block> blocks_;
  std::vector<ChainRecord> open_;  // the newest records, sorted, not yet sealed
  std::vector<Tuple> tuples_;
  std::unordered_map<uint64_t, uint32_t> tuple_index_;  // tuple hash -> index + 1
  size_t size_ = 0;
  uint64_t max_dur_ = 0;
  SpillFile* spill_ = nullptr;
};

inline const uint8_t* ChainRecordSeries::decode(const uint8_t* p, uint64_t& prev_ts, const std::vector<Tuple>& tuples,
                                                ChainRecord& r) {
  auto varint = [&p] {
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      const uint8_t b = *p++;
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80u) || shift >= 63) return v;
    }
  };
  r.ts = prev_ts + varint();
  prev_ts = r.ts;
  r.dur = varint();
  const uint64_t code = varint();
  if (code && code <= tuples.size()) {
    const Tuple& t = tuples[code - 1];
    r.stack = t.stack;
    r.source = t.source;
    r.op = t.op;
    r.state = t.state;
  } else {
    r.source = static_cast<Source>(*p++);
    r.op = *p++;
    r.state = static_cast<OffCpuState>(*p++);
    r.stack = varint();
  }
  return p;
}

template <class F>
void ChainRecordSeries::for_each(uint64_t start, uint64_t end, F&& f) const {
  if (start >= end) return;
  auto it = std::lower_bound(blocks_.begin(), blocks_.end(), start,
                             [](const Block& b, uint64_t ts) { return b.last_ts < ts; });
  ChainRecord r;
  std::vector<uint8_t> scratch;
  for (; it != blocks_.end(); ++it) {
    const uint8_t* base = data_of(*it, scratch);
    if (base == nullptr) continue;  // an unreadable spilled block: its records are missing
    const uint8_t* p = base + it->off;
    uint64_t prev = it->base_ts;
    for (uint32_t i = 0; i < it->n; ++i) {
      p = decode(p, prev, tuples_, r);
      if (r.ts < start) continue;
      if (r.ts >= end) return;
      f(static_cast<const ChainRecord&>(r));
    }
  }
  auto o = std::lower_bound(open_.begin(), open_.end(), start,
                            [](const ChainRecord& x, uint64_t ts) { return x.ts < ts; });
  for (; o != open_.end() && o->ts < end; ++o) f(*o);
}

class ChainAnnotator {
 public:
  explicit ChainAnnotator(AnnotateOptions o = {});

  void add(const Batch& b) { add(std::span<const Event>(b.events)); }
  void add(std::span<const Event> events);

  // Fills threads/stacks/time_split of every chain (and tid when 0), and rewrites a rate/gap
  // chain's root cause and summary: call it once per chain. Never throws.
  void annotate(std::vector<Chain>& chains, const TraceMeta& meta);
  void annotate(Chain& c, const TraceMeta& meta);
  // How far around a chain's window a loss span still counts (one poller scan and some): a ring
  // drop is placed between two counter reads 20 ms apart.
  static constexpr uint64_t kLossMarginNs = 25'000'000;

  // launch_gap chains whose window (and the context after it) is complete, annotated; each is
  // returned once. `final` flushes every pending one (end of trace).
  std::vector<Chain> take_gap_chains(const TraceMeta& meta, bool final);

  // The time split of one thread over [start, end) from its retained events (tests use it too).
  TimeSplit time_split(uint16_t node, uint32_t tid, uint64_t start, uint64_t end) const;

  const AnnotateCounters& counters() const { return counters_; }
  // The spill file's counters (all zero without one).
  SpillCounters spill_counters() const { return spill_ ? spill_->counters() : SpillCounters{}; }
  size_t retained() const { return records_; }
  size_t retained_bytes() const;  // heap bytes of the kept records (ChainRecordSeries::heap_bytes)
  const AnnotateOptions& options() const { return opt_; }

 private:
  using Rec = ChainRecord;
  using Series = ChainRecordSeries;
  struct Thread {
    uint32_t pid = 0, tid = 0;
    uint16_t node = 0;
    int16_t rank = -1;
    Series calls, offcpu, samples;
    // launch_gap detection
    bool have_launch = false;
    uint64_t last_launch_end = 0, last_launch_id = 0;
  };
  struct Gap {
    uint64_t key = 0;   // thread key
    size_t before = 0;  // launches in the context before the gap
    uint64_t start = 0, end = 0, before_id = 0, after_id = 0;
    Source source = Source::kUnknown;
    uint8_t op = 0;
  };
  struct GapGroup {  // per thread and window
    Gap longest;
    uint64_t gaps = 0, total_ns = 0;
    uint64_t window_end = 0;
  };

  static uint64_t thread_key(uint16_t node, uint32_t tid) { return uint64_t{node} << 32 | tid; }
  void evict(uint64_t horizon);
  void enforce_cap();
  void note_launch(Thread& t, const Event& e);
  size_t launches_in(const Thread& t, uint64_t start, uint64_t end) const;
  Chain gap_chain(const GapGroup& g, const TraceMeta& meta);
  void annotate_body(Chain& c, const TraceMeta& meta);
  void apply_losses(Chain& c, const TraceMeta& meta);

  AnnotateOptions opt_;
  AnnotateCounters counters_;
  std::unique_ptr<SpillFile> spill_;  // opt_.resident_bytes > 0; outlives threads_ (declared first)
  std::unordered_map<uint64_t, Thread> threads_;
  size_t records_ = 0;
  uint64_t newest_ = 0;
  uint64_t horizon_ = 0;                                      // everything that started before it may have been evicted
  std::vector<Gap> pending_gaps_;                             // waiting for their after-context
  std::map<std::pair<uint64_t, uint64_t>, GapGroup> groups_;  // (thread key, window) -> group
  std::unordered_map<uint64_t, ParsedStack> stack_cache_;     // parsed TraceMeta::stacks by id
  // First GPU API call per (node, pid): the start of its warm-up. Bounded: at most 1M processes
  // (beyond that new processes get no warm-up).
  std::unordered_map<uint64_t, uint64_t> first_call_;
  uint64_t warmup_end(uint16_t node, uint32_t pid) const;  // 0 when unknown or warm-up is off
  void apply_warmup(Chain& c, uint64_t warm_calls, double warm_w, double total_w, std::vector<uint64_t>& rest_durs,
                    bool by_time, uint64_t warm_ns);
};

// A pass-through source that feeds every batch to an annotator first: the tap that every path
// producing chains from a trace puts in front of run_plan (explain, run, mcp; `trace` can do the
// same). Afterwards call annotate_result() (or annotate() + take_gap_chains() for chains of a live
// view). The annotator must outlive the source's use; both are single-threaded (the engine pulls
// batches on one thread).
class AnnotatingSource final : public EventSource {
 public:
  AnnotatingSource(EventSource& in, ChainAnnotator& a) : in_(in), a_(a) {}
  bool next(Batch& out) override {
    if (!in_.next(out)) return false;
    a_.add(out);
    return true;
  }
  TraceMeta& meta() override { return in_.meta(); }
  PrefetchHint upcoming() override { return in_.upcoming(); }
  unsigned busy_threads() const override { return in_.busy_threads(); }

 private:
  EventSource& in_;
  ChainAnnotator& a_;
};

// Live capture (`trace`, `run` with an eBPF source): chains are emitted by the engine's collector
// thread while the source thread still feeds events, so the annotator sits behind one lock.
//   LiveChainAnnotator live;                       // 15 s horizon, 4M-record cap
//   EngineOptions eo; eo.on_chain = [&](const Chain& c) { show(live.annotate(c)); };
//   AnalysisResult r = run_plan(plan, live.tap(source), eo);
//   live.finish(r);                                // every chain annotated, launch_gap chains added
// A chain is annotated when it is emitted (its window is then inside the horizon) and the result
// remembered by id, so finish() gives the final chains the same fields even after their events
// were evicted. The tap pulls from the source and feeds the annotator under the lock, so the
// source's TraceMeta (stacks, names) is read by annotate() only while the source is not inside
// next(); a source that changes its TraceMeta from another thread is not covered.
class LiveChainAnnotator {
 public:
  explicit LiveChainAnnotator(AnnotateOptions o = defaults());
  // A chain is annotated when its window closes (window end + lateness + the source's reorder
  // lag), so the horizon needs the largest window (10 s) plus a few seconds; a launch gap is
  // judged 1 s after it and its 10 s window. Memory: about 6-8 bytes per kept call, span or
  // sample (ChainRecordSeries; 32 before it), so about rate x 15 s x 8 B (24 MB at 200k calls/s),
  // at most max_records of them.
  static AnnotateOptions defaults() {
    AnnotateOptions o;
    o.retention_ns = 15'000'000'000ull;
    o.max_records = 4u << 20;
    return o;
  }
  // Replay through the same path (explain, mcp, run): everything is kept up to 2M events (~15 MB),
  // beyond that the 15 s horizon, so a trace of any length costs at most max(2M, rate x 15 s)
  // events. The source runs at most 8 batches (32k events) ahead of the emitted chains, far less
  // than 2M, so a chain's window is still kept when it is annotated. Of those records, sealed
  // blocks beyond kReplayResidentBytes go to a spill file in $TMPDIR (at most ~7 B x 8M = 56 MB
  // of disk, usually in the page cache); INGERO_ANNOTATE_RESIDENT_MB=N changes the budget, 0
  // keeps everything in memory.
  static constexpr size_t kReplayResidentBytes = size_t{8} << 20;
  static AnnotateOptions replay_defaults();
  // The source to hand to run_plan; `in` must outlive it. Call once.
  EventSource& tap(EventSource& in);
  // A copy of `c` with tid/threads/stacks/time_split (any thread; remembered by chain id).
  Chain annotate(const Chain& c);
  // launch_gap chains complete so far (each once): for a live view between batches. They are
  // built as batches come in (while their events are kept) and added to the result by finish().
  std::vector<Chain> take_gap_chains();
  // After run_plan: every chain of `r` annotated (as when emitted), launch_gap chains added, sorted.
  void finish(AnalysisResult& r);
  AnnotateCounters counters();
  SpillCounters spill_counters();
  // Records kept now, and their heap bytes (ChainAnnotator::retained / retained_bytes).
  size_t retained();
  size_t retained_bytes();

 private:
  class Tap;
  std::mutex mu_;
  ChainAnnotator a_;
  EventSource* in_ = nullptr;
  std::unique_ptr<EventSource> tap_;
  std::unordered_map<std::string, Chain> done_;  // by chain id
  std::vector<Chain> gaps_ready_;                // launch_gap chains built as batches came in
  std::vector<Chain> gaps_taken_;                // ... and those already handed out
};

// The replay path: annotates every chain of `r` from an annotator fed with the whole trace, adds
// the launch_gap chains and puts all chains back in the engine's canonical order.
void annotate_result(AnalysisResult& r, ChainAnnotator& a);

// What the warm-up did to one rule's chains, from the warmup.* values the annotator puts on them
// (for `explain --why-not RULE`). Warm-up never removes rows before the engine judges a rule: it
// re-judges the chains that fired, so a rule that did not fire was not hidden by it.
struct WarmupEffect {
  uint64_t chains = 0;      // chains of the rule with calls in a process's warm-up
  uint64_t calls = 0;       // ... their warm-up calls (slow calls for tail chains)
  uint64_t only = 0;        // chains that stood on warm-up calls alone (warmup.only = 1)
  uint64_t only_calls = 0;  // ... their warm-up calls
  uint64_t demoted = 0;     // ... of those, reported LOW as "warm-up:"
  uint64_t abnormal = 0;    // ... of those, kept at their severity as "abnormal warm-up:"
};
WarmupEffect warmup_effect(const std::vector<Chain>& chains, const std::string& rule);
// The why-not line(s) for it, naming the param and its value (`param warmup = 10s`).
std::string warmup_why_not_text(const WarmupEffect& w, uint64_t warmup_ns);

// True for launch ops (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch).
bool is_launch_op(Source s, uint8_t op);

// One cause, one finding: a chain of a tail rule (not over time) on a thread whose window overlaps
// a finding over time (Chain::over_time) of the same category on the same thread (node, pid, tid)
// is folded into it: removed, and the finding gets an evidence item "folded" that quotes it,
// then the folded chain's own evidence items (with their exemplar event ids), and its severity if
// higher. LiveChainAnnotator::finish calls it once every chain has its thread.
void fold_into_findings_over_time(std::vector<Chain>& chains);
// An input_starvation finding over time whose off-CPU stacks are known: its summary ends with
// "; waiting in <call site of the top wait stack>" and its explanation quotes that stack's frames
// (once; does nothing otherwise).
void describe_wait(Chain& c);

}  // namespace ingero
