// The engine's runtime: a Plan compiled into streams and rule pipelines, and the keyed state one
// shard owns. engine.cpp wires shards into a oneTBB flow graph; this file has no TBB in it, so the
// same code runs a shard serially in tests.
//
// Compilation (CompiledPlan, immutable, shared by every shard):
// - Streams: every Scan/Filter/OffCpu node is a stream = its parent stream + one step.
// - Pipes: every Window node starts a pipe: Window -> Aggregate -> stages (Let, Require, Join,
//   Trend, Peer) -> Emit, following the plan's edges. Row slots are laid out here and every Ref
//   resolved to its slot; an unknown name is a compile error.
// - Tier: a pipe whose window is keyed by pid or tid (and has no Peer stage) runs in the pid
//   shards; any other pipe (keyed by op only, by rank, peers across ranks) runs in the one global
//   shard, which sees every event. Both give results independent of the shard count.
//
// Shard (mutable, one per flow-graph node, single-threaded):
// - process(input): computes the streams of the batch, feeds windows (events the shard owns) and
//   join buffers (owned + broadcast host-wide events), then closes windows at the watermark and
//   runs their rows through the stages, then evicts and prunes join spans (ShardTuning).
//   finish() closes everything at the final watermark.
// - route(batch, out): a router's one routing pass for shards that each run some window groups
//   (two threads split by group), which then read its lists (ShardInput::routed) instead of
//   walking the batch, and the batch's off-CPU spans, which they read instead of building them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/plan.h"
#include "model/result.h"
#include "model/trace.h"
#include "operators/aggregate.h"
#include "operators/interval_join.h"
#include "operators/key_by.h"
#include "operators/offcpu_spans.h"
#include "operators/op_stats.h"
#include "operators/peer.h"
#include "operators/step_tracker.h"
#include "operators/time_accounting.h"
#include "operators/trend.h"
#include "operators/window.h"

namespace ingero {

// Calls a join window keeps for its tail (per window and key; 24 bytes each while they share a
// pid and last under 4.29 s, else 32): every call up to
// this many, then the slowest this many (ShardTuning::max_tail_calls, for tests). Joins are exact while a window's tail
// (its slow calls) has at most this many calls; a busier window is judged on its slowest calls and says so.
inline constexpr size_t kMaxTailCalls = 16384;

struct Slot {
  std::string name;
  Unit unit = Unit::kNone;
};

struct StreamDef {
  int node = -1;
  int parent = -1;  // stream index, -1 for the scan
  ExprPtr filter;   // step: filter
  // When the filter reads only source and op (the usual `from cuda where op in [...]`), its
  // value for every (source, op) pair, precomputed: one table lookup per event instead of a tree
  // walk. 0: drop, 1: keep, 2 + i: keep when residuals[i] holds.
  std::vector<uint8_t> source_op_mask;
  // When the filter is `A and B` with only A reading source and op (e.g. `op in sync_ops and
  // site ~ "..."`), the mask is A's and B, folded for each (source, op) that A keeps
  // (fold_source_op: `op != cudaMemcpy or arg1 == 2` is `arg1 == 2` for cudaMemcpy and TRUE for
  // cuMemcpyDtoH), is evaluated for the events A keeps; identical folded residuals once.
  std::vector<ExprPtr> residuals;
  const OffCpuNode* offcpu = nullptr;    // step: off-CPU span builder
  const AccountNode* account = nullptr;  // step: time slices of feeding threads (TimeAccounting)
  const StepNode* steps = nullptr;       // step: the steps of processes (StepTracker)
  bool host_wide = false;                // carries broadcast (host-wide) events
};

enum class StageKind : uint8_t { kLet, kRequire, kJoin, kTrend, kPeer, kEmit };

struct JoinSlots {
  int overlap_ns, tail_ns, share, calls, hit_calls, events, right_ns, sum_arg0;
};

struct Stage {
  StageKind kind;
  int node = -1;
  // kLet
  std::vector<std::pair<int, ExprPtr>> lets;  // slot, resolved expression
  // kRequire
  ExprPtr pred;
  std::string label;
  Unit lhs_unit = Unit::kNone, rhs_unit = Unit::kNone;  // of the comparison's two sides
  // kJoin
  const JoinNode* join = nullptr;
  int right_stream = -1;
  ExprPtr tail;
  JoinSlots js{};
  uint64_t retain_ns = 0;
  // kTrend
  const TrendNode* trend = nullptr;
  int trend_value = -1, trend_first = -1, trend_last = -1, trend_peak = -1, trend_change = -1;
  int trend_median = -1, trend_mad = -1, trend_history = -1;
  // kPeer
  const PeerNode* peer = nullptr;
  int peer_value = -1, peer_median = -1, peer_mad = -1, peer_z = -1, peer_count = -1;
  // kEmit
  const EmitNode* emit = nullptr;
  std::vector<std::pair<ExprPtr, Severity>> severity;
};

struct PipeDef {
  int window_node = -1;
  int stream = -1;
  WindowNode window;
  std::unique_ptr<AggregateLayout> layout;
  KeyBy keys{std::vector<Field>{}};
  std::vector<Field> key_fields;
  bool site_key = false;  // keyed by call site (`by site`): Key::lo's low 16 bits hold its index
  std::vector<Slot> slots;
  int slot_start = -1, slot_end = -1, slot_events = -1, slot_aggs = -1;
  std::vector<Stage> stages;
  bool global = false;       // runs in the global shard
  bool needs_calls = false;  // buffers the window's calls for a join
  bool over_time = false;    // its stream is accounting slices (Chain::over_time)
  size_t rule_index = 0;     // index into CompiledPlan::rules
};

// Pipes whose stream, window and aggregate are identical share one window store: rules that
// differ only after the aggregate (the tail families) pay for windowing and quantiles once.
struct WindowGroup {
  std::vector<size_t> pipes;
  int stream = -1;
  WindowNode window;  // lateness = the largest of its pipes'
  bool global = false;
  bool needs_calls = false;
};

// Window groups fed straight from a batch by the event's source << 8 | op (one tier: pid shards
// or the global shard): for each such code, the groups whose stream is a chain of filters over
// the scan that can keep the event, with the checks each needs (a filter's specialised residual,
// or a whole filter that has no source/op mask), all of which must hold. One pass over the batch
// feeds every routed group, without building each stream's list of events.
struct RouteTarget {
  uint32_t group;
  uint32_t checks_begin, checks_end;  // into Routes::checks
};
struct Routes {
  std::vector<uint32_t> begin;  // 65,537 entries: code c's targets are [begin[c], begin[c + 1])
  std::vector<RouteTarget> targets;
  std::vector<const Expr*> checks;
};

struct CompiledPlan {
  Plan plan;  // owns the nodes the defs point into
  std::vector<StreamDef> streams;
  std::vector<int> stream_of_node;  // plan node id -> stream index or -1
  std::vector<PipeDef> pipes;
  std::vector<WindowGroup> groups;
  std::vector<char> routed;        // per group: its stream is a filter chain over the scan (Routes)
  Routes routes[2];                // [0] pid shards, [1] the global shard
  std::vector<RuleOutcome> rules;  // template (names/hashes) for outcomes
  std::vector<std::string> node_names;
  std::map<uint32_t, std::string> process_names;
  bool has_global = false, has_sharded = false;
  // Stack predicates (`stack ~`, `site ~` in a filter): the trace's stacks, which the engine
  // keeps in sync with TraceMeta::stacks (before the run, then whenever new ones appear).
  bool uses_stacks = false;
  std::shared_ptr<StackTable> stacks = std::make_shared<StackTable>();
  // The program's own step markers for the `steps` stream (EngineOptions::step_markers); may be null.
  std::shared_ptr<const std::vector<StepMarker>> step_markers;
};

// mask[source << 8 | op] = 1 where `filter`, which reads no field but the event's source and op,
// keeps events of that source and op (compile_plan's per-stream table; exposed for tests).
std::vector<uint8_t> filter_source_op_mask(const Expr& filter);

// Compiles a validated plan; returns null and fills errors on failure.
std::unique_ptr<CompiledPlan> compile_plan(const Plan& plan, std::vector<std::string>& errors);

// Host-wide events are broadcast to every pid shard (for joins); all others go to shard_of(pid).
bool is_host_wide(const Event& e);

using EventsPtr = std::shared_ptr<const std::vector<Event>>;

// One batch's routing pass, made once for several shards that read the same events (two threads
// split by window group: Shard::route in the router's flow-graph node). Per sink (a stream index, or the
// stream count for the sched_switch list), the batch's events it keeps, in batch order: the first
// sizes[k] of lists[k], pointers into the batch. A shard handed one (ShardInput::routed) reads its
// sinks here instead of walking the batch itself.
struct RoutedBatch {
  std::vector<std::vector<const Event*>> lists;
  std::vector<size_t> sizes;
  std::vector<std::pair<uint32_t, uint64_t>> exits;  // HOST process_exit: pid and ts of every one, in order
  uint64_t end_max = 0;                              // the latest event end (ts + dur) so far
  // The router stopped carrying the per-op statistics' durations in window states at this batch
  // (a duration of 2^53 ns or more); the shard that carries them stops too (Shard: stats_group).
  bool gave_up_stats = false;
  // Per off-CPU span builder (the plan's, in stream order: every shard numbers them alike), this
  // batch's spans when the router built them (built[b]): a shard given this batch reads them
  // instead of building its own, so the routing stage, which has the sched_switch events in
  // cache, pays for them once (docs/history/issue-12.md, parts 20 and 21).
  std::vector<std::vector<Event>> spans;
  std::vector<char> spans_built;
};

struct ShardInput {
  EventsPtr owned;    // events this shard owns (windows, stats); shared, never copied
  EventsPtr foreign;  // host-wide events owned by another shard (joins only); may be null
  // Routing by index: when `indexed`, the shard owns only the events of *owned at the positions
  // owned_at and sees only those of *foreign at foreign_at (each in batch order; positions past
  // the end are skipped), so one shared batch can serve every shard uncopied. engine.cpp gathers
  // copies instead (measured cheaper at 2 threads: see its run_parallel).
  bool indexed = false;
  std::span<const uint32_t> owned_at, foreign_at;
  // The routing pass of *owned, made by Shard::route of a shard with every window group (not
  // indexed then); null: the shard walks the batch itself.
  const RoutedBatch* routed = nullptr;
  uint64_t watermark = 0;
  bool final = false;
  uint64_t dropped = 0;  // events lost upstream (carried to chains)
  // The latest event end (ts + dur) of every batch so far, all shards together (0: unknown). A
  // shard ends its open windows and spans there at the final batch, not at its own last event,
  // so the result does not depend on which processes share a shard.
  uint64_t trace_end = 0;
  // Process names known when this batch was read, when they changed since the plan was compiled
  // (a live source learns them as processes appear); null: CompiledPlan::process_names.
  std::shared_ptr<const std::map<uint32_t, std::string>> process_names;
  // The next batch's events, when the source knows where they lie (EventSource::upcoming):
  // prefetched during this batch's routing pass, or, given a routing pass (`routed`), during the
  // feeds of its window groups. Never read through.
  PrefetchHint prefetch;
};

struct ShardOutput {
  std::vector<Chain> chains;
  std::unique_ptr<OpStatsAccumulator> stats;  // final only
  std::vector<RuleOutcome> outcomes;          // final only
  EngineCounters counters;                    // final only
  bool global = false;                        // from the global shard (sees every event again)
  // Join spans dropped by pruning (ShardTuning), final only. Not an EngineCounters field: results
  // and their printed counters do not depend on pruning.
  uint64_t pruned_spans = 0;
};

// Knobs of a shard's bounded memory; the defaults are what the engine runs with, tests change
// them to exercise the paths on small inputs.
//
// Join span pruning: a join whose windows' calls are never delivered late (model/trace.h: only
// context intervals, never probed GPU API calls, may be) drops, after a batch, the spans that
// no call can touch any more (IntervalJoin::prune): those ending before the batch watermark
// (minus the join's `within`; every later call starts at or after it) that no call still held
// in an open window's call buffer, mapped to the join key, touches. Call buffers only lose
// calls, so a dropped span is never needed again: results are identical with or without it.
// A join buffer (shared by the stages that read the same spans, runtime.cpp JoinBuffer) prunes
// when it holds at least prune_min_spans spans, 1.5 x what its last prune left, and more spans
// than its windows hold calls: a prune costs O(calls log calls + spans), so it is paid for by the
// spans, and memory stays within max(prune_min_spans, 1.5 x what no prune can drop, the calls
// held), flat in trace length.
struct ShardTuning {
  size_t max_tail_calls = kMaxTailCalls;  // CallBuffer's cap
  bool narrow_calls = true;               // false: every call buffer in its full 32-byte form
  bool prune_spans = true;
  size_t prune_min_spans = size_t{1} << 16;
  bool prune_every_batch = false;  // tests: prune after every batch, whatever the counts
  // A prune lists the held calls of about this many at a time (16 bytes each), slice by slice
  // of the join keys, so its transient memory stays near 1 MB however many calls the windows hold.
  size_t prune_candidates_per_pass = size_t{1} << 16;
  // One span buffer for every join stage that reads the same spans (runtime.cpp JoinBuffer);
  // false: a buffer per stage (tests compare).
  bool share_join_buffers = true;
  // A join's tail (`duration >= bound`, TailCut) is read off a capped call buffer's held calls
  // without compacting it when the tail fits the cap (CallBuffer::tail_without_compacting);
  // false: the buffer is compacted first (tests compare).
  bool tail_from_held = true;
  // Per-op statistics take their durations from a window group's states where one holds them
  // exactly (Shard: stats_group); false: every event is added to them on its own (tests compare).
  bool stats_from_windows = true;
  // Bytes of sealed join span blocks the shard keeps in memory before the rest go to a spill file
  // in $TMPDIR (else /tmp) (IntervalJoin, "Spill"); 0 = everything in memory. Results do not
  // depend on it. EngineOptions::join_resident_bytes sets it for a run.
  size_t join_resident_bytes = 0;
};

// Which pipes a shard runs: those of the pid shards, those of the global shard, or both in one
// shard (a one-thread run: one pass over each batch routes it to every window group, instead of
// one pass per tier; results are those of a pid shard and a global shard together).
enum class ShardTier : uint8_t { kPid, kGlobal, kBoth };

class Shard {
 public:
  // `groups`: when not empty, the shard runs only the pipes of the window groups g with
  // groups[g] != 0 (of its tier), so several kBoth shards can split a plan's groups between them
  // (engine.cpp: two threads), each reading every event.
  Shard(const CompiledPlan& plan, ShardTier tier, bool compute_stats, const ShardTuning& tuning = {},
        std::vector<char> groups = {});
  Shard(const CompiledPlan& plan, bool global, bool compute_stats, const ShardTuning& tuning = {})
      : Shard(plan, global ? ShardTier::kGlobal : ShardTier::kPid, compute_stats, tuning) {}
  ~Shard();
  ShardOutput process(const ShardInput& in);
  // A router: a shard of every window group that only walks batches for shards that each run
  // some of them (ShardInput::routed). route() makes its routing pass over `events` into `out`
  // (reusing its capacity) and gives its per-op statistics each event's total and the durations
  // no window group carries; the shard holding the group carried_stats_group() (-1: none) adds
  // those from its window states. take_stats() hands over the router's statistics after the run.
  // `prefetch`: the next batch, fetched during the pass (ShardInput::prefetch).
  // `final`: the run's last batch (the router's span builders close their open spans then).
  void route(const std::vector<Event>& events, RoutedBatch& out, PrefetchHint prefetch = {}, bool final = false);
  int carried_stats_group() const;
  std::unique_ptr<OpStatsAccumulator> take_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether a failed predicate at `stage` is a closer miss than the one `cur` holds: further along
// the rule first, then the smaller shortfall relative to the threshold (so ratios and nanoseconds
// compare fairly), then the earlier window, then the key - a total order, so the merged closest
// miss does not depend on which shard saw it.
bool better_miss(int stage, const PredicateResult& p, uint64_t window, const std::string& key, const RuleOutcome& cur);

// The chains of rules over the `accounting` stream are one finding per cause, not one per window:
// chains of such a rule with the same key whose windows follow each other (a gap of at most two
// windows) become one chain over their span, with the text, values and predicates of the worst
// window (highest severity, then earliest), the highest severity, the first window's id, the
// summed dropped_events, the value "windows" (how many fired) and a summary that says it is the
// worst of N. Other rules' chains are left as they are. Order of `chains` is not kept.
void merge_window_runs(const CompiledPlan& plan, std::vector<Chain>& chains);

// Fills {op}, {process}, {key}, slot names... in a rule's text. `names` overrides the plan's
// process names when given.
std::string expand_template(const std::string& tmpl, const CompiledPlan& plan, const PipeDef& pipe, const Key& key,
                            const double* row, const std::map<uint32_t, std::string>* names = nullptr);

}  // namespace ingero
