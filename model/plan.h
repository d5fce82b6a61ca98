// The plan IR: a DAG of operator nodes with parameters, printable as canonical text.
//
// Default analyses are built as plans (engine/default_plans.cpp) and the rule DSL (dsl/) lowers
// `.rules` files into the same IR; the engine (engine/engine.h) instantiates operators from it.
// A plan holds any number of rules; each rule is a path of nodes that ends in an Emit node, and
// rules share Scan nodes. Node ids are indexes into Plan::nodes; inputs always point backwards.
//
// The shapes the engine runs (anything else is rejected by validate() with a message):
//
//   Scan -> Filter* -> [OffCpu | Account] -> Filter*       an event stream (a "span stream")
//   stream -> Window -> Aggregate -> (Let | Require)*
//          -> [Join(window-path, span stream) -> (Let | Require)*]*
//          -> [Trend | Peer] -> (Let | Require)* -> Emit
//
// Row slots. A window row holds, in order: the key slots ("pid", "tid", "op", "source", "node",
// "rank" - those named in Window::keys), "window.start", "window.end", "window.events",
// then the Aggregate's names, then Let names, then each Join's outputs (see JoinNode), Trend's and
// Peer's outputs. Names are unique per rule; Ref expressions name them.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "model/expr.h"

namespace ingero {

enum class Severity : uint8_t { kLow = 0, kMedium = 1, kHigh = 2 };
const char* severity_name(Severity s);  // "LOW", "MEDIUM", "HIGH"

struct ScanNode {};

// Keeps events for which `pred` is true (event fields only).
struct FilterNode {
  ExprPtr pred;
};

// HOST sched_switch events -> off-CPU spans of at least `min_ns`, restricted to `states` when
// non-empty (e.g. only kPreempted). Replay spans are already whole; live switch-out/switch-in
// pairs are completed here, and spans still open at the final watermark are closed there.
struct OffCpuNode {
  uint64_t min_ns = 0;
  std::vector<OffCpuState> states;
};

// Every event -> slices of GPU-feeding threads' time (Source::kAccount events, op = bucket:
// operators/time_accounting.h), cut at multiples of `grid_ns`. The rules' `from accounting`.
// Slices are made per shard from the events it owns (a thread's calls and its sched_switch spans
// belong to its process) and come out as the watermark settles them.
struct AccountNode {
  uint64_t grid_ns = 1'000'000'000ull;
};

// Every event -> one Source::kStep event per step of each process (operators/step_tracker.h:
// ts = the step's start, dur = its length, arg0 = its ordinal, arg1 = the wait that ends it, tid =
// the thread of that wait). The rules' `from steps`; only a `steps` window reads it.
struct StepNode {};

enum class WindowKind : uint8_t { kTumbling, kSliding, kWhole, kSteps };
// Groups events by `keys` into event-time windows. kWhole = one window over the whole trace.
// kSteps (only over a StepNode stream): window k of a key holds its steps k*steps .. k*steps +
// steps - 1 (Event::arg0), spans from the first one's start to the last one's end, and closes as
// soon as it is full (or at the end of the trace); size_ns and slide_ns are 0.
// A window closes when the watermark passes window end + `lateness_ns` (the engine raises the
// lateness to the largest join horizon downstream, so spans that overlap late calls are seen).
struct WindowNode {
  WindowKind kind = WindowKind::kTumbling;
  uint64_t size_ns = 10'000'000'000ull;
  uint64_t slide_ns = 10'000'000'000ull;
  std::vector<Field> keys;  // subset of pid, tid, op, source, node, rank
  uint64_t lateness_ns = 0;
  uint32_t steps = 0;  // kSteps: steps per window
};

// kTime, kTopTask, kTopTaskTime read accounting slices (AccountNode): kTime sums the duration of
// the slices whose bucket (Event::op) is in `buckets` (a bit per bucket); kTopTask is the task
// (arg0, the pid, else arg1, the tid) with the most such time, kTopTaskTime that time.
enum class AggKind : uint8_t { kCount, kSum, kMin, kMax, kMean, kRate, kQuantile, kTime, kTopTask, kTopTaskTime };
const char* agg_name(AggKind k);
struct AggSpec {
  std::string name;
  AggKind kind = AggKind::kCount;
  Field field = Field::kDuration;  // ignored by count/rate
  double q = 0.5;                  // quantile only, in (0, 1]
  uint32_t buckets = 0;            // kTime, kTopTask, kTopTaskTime: bit b = slice bucket b
};
// Aggregates a window's events into row slots. Quantiles are exact nearest-rank (index
// ceil(q*n)-1 of the sorted sample) up to `exact_limit` samples per window, then a DDSketch with
// relative error `sketch_alpha` (operators/quantile.h).
struct AggregateNode {
  std::vector<AggSpec> aggs;
  uint32_t exact_limit = 65536;
  double sketch_alpha = 0.01;
};

struct LetNode {
  std::vector<std::pair<std::string, ExprPtr>> lets;
};

// Drops rows for which `pred` is false. Recorded as a predicate in chain provenance and in
// why-not answers, under `label` (the source text, e.g. "p99 / p50 >= 3").
struct RequireNode {
  ExprPtr pred;
  std::string label;
};

enum class JoinKind : uint8_t {
  kOverlap,  // right spans that intersect a tail call; overlap time is the intersection
  kWithin,   // right events within `within_ns` of a tail call (instants, counters)
};
enum class JoinKey : uint8_t { kTid, kPid, kNone };  // kNone: host-wide signals
// Interval join of a window's tail calls (left: the window path's events for which `tail` is true,
// e.g. duration >= p99) with a span stream (input 1) on `key`. Adds row slots, with `name` as
// prefix: .overlap_ns (time of tail calls covered by right spans, union per call), .tail_ns
// (total duration of tail calls), .share (overlap/tail), .calls (tail calls), .hit_calls (tail
// calls touched), .events (distinct right events), .right_ns (their total duration),
// .sum_arg0 (their total arg0, e.g. bytes). Exemplars: up to `max_exemplars` tail call ids and
// right event ids, longest overlap first. Right spans are buffered per key and evicted once the
// watermark is past their end + `horizon_ns`.
struct JoinNode {
  JoinKind kind = JoinKind::kOverlap;
  JoinKey key = JoinKey::kTid;
  std::string name = "join";
  ExprPtr tail;  // event + row context
  uint64_t within_ns = 0;
  uint64_t horizon_ns = 2'000'000'000ull;
  uint32_t max_exemplars = 5;
};

enum class TrendMode : uint8_t {
  kRising,     // `value` strictly rises over `windows` consecutive windows of the same key
  kBelowPeak,  // `value` < factor * its peak over the previous `windows` windows of the key
  // The key's own baseline: median and MAD of `value` over its previous `windows` windows (not
  // necessarily adjacent: a thread's history survives an idle window). Always holds; the rule
  // compares against trend.median / trend.mad itself (NaN while the key has no history).
  kBaseline,
};
// Keeps a per-key history of `value`. Adds .first, .last, .peak, .change (last/first), .median,
// .mad and .history (windows in hand) slots under prefix "trend". Only rows for which the trend
// holds pass.
struct TrendNode {
  std::string value;
  uint32_t windows = 3;
  TrendMode mode = TrendMode::kRising;
  double factor = 0.6;
};

// Compares rows of the same window across a peer group (keys other than `group` equal):
// median and MAD of `value`; modified z = 0.6745 * (x - median) / MAD. Rows with z > `z` and
// x - median > `floor` pass (MAD = 0 falls back to the mean absolute deviation * 1.253314).
// Adds .median, .mad, .z, .peers under prefix "peer".
struct PeerNode {
  Field group = Field::kRank;
  std::string value;
  double z = 3.5;
  double floor = 0;
  uint32_t min_peers = 3;
};

struct SeverityCase {
  ExprPtr when;  // null = otherwise
  Severity severity = Severity::kMedium;
};

// Turns surviving rows into causal chains. Templates substitute {slot} with the slot's value
// formatted by unit, and {op}, {source}, {pid}, {tid}, {node}, {rank} by name.
struct EmitNode {
  std::string rule;       // rule name
  std::string rule_hash;  // content hash of the rule text (provenance)
  std::string category;   // cpu_contention, blocking, block_io, network, memory_pressure, ...
  std::vector<SeverityCase> severity;
  std::string summary, root_cause, explanation;
  std::vector<std::string> recommendations;
};

using NodeBody = std::variant<ScanNode, FilterNode, OffCpuNode, AccountNode, StepNode, WindowNode, AggregateNode,
                              LetNode, RequireNode, JoinNode, TrendNode, PeerNode, EmitNode>;

struct PlanNode {
  int id = 0;
  std::vector<int> inputs;
  NodeBody body;
  int line = 0;  // source position for diagnostics (0 = not from a rule file)
  int col = 0;
};

struct Plan {
  std::vector<PlanNode> nodes;

  int add(NodeBody body, std::vector<int> inputs = {});
  // Canonical text: one node per line, "%3 = window(%2) kind=tumbling size=10s by=[pid,op]".
  std::string to_string() const;
  // Empty when the engine can run it; else one message per problem.
  std::vector<std::string> validate() const;
  // Appends another plan's nodes (ids renumbered); Scan nodes are shared.
  void merge(const Plan& other);
};

std::string format_duration(uint64_t ns);  // "10s", "250ms", "1.5us" - canonical, round-trips

}  // namespace ingero
