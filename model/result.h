// What an analysis produces: per-op statistics and causal chains with provenance.
// Sinks (SQLite, LMDB, JSON, MCP) and the CLI render these; nothing here knows TBB.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/accounting.h"
#include "model/event.h"
#include "model/plan.h"
#include "model/stack.h"
#include "model/steps.h"
#include "model/trace.h"

namespace ingero {

struct OpStats {
  Source source = Source::kUnknown;
  uint8_t op = 0;
  uint64_t count = 0;
  uint64_t p50_ns = 0, p95_ns = 0, p99_ns = 0, max_ns = 0, min_ns = 0;
  uint64_t total_ns = 0;
  double tail_ratio = 0;  // p99 / p50; 0 when p50 is 0
  bool exact = true;      // false: quantiles from a DDSketch with relative error `rel_error`
  double rel_error = 0;
  uint64_t errors = 0;  // calls with ret != 0
};

// One predicate of a rule as evaluated for a chain (or for a why-not answer).
struct PredicateResult {
  std::string label;        // "p99 / p50 >= 3"
  double lhs = 0, rhs = 0;  // the two sides when it is a comparison
  double margin = 0;        // how far past the threshold (lhs - rhs; negative = failed)
  bool passed = false;
  std::string lhs_text, rhs_text;  // both sides formatted with their units ("87%", "3.4ms")
};

struct EvidenceItem {
  std::string kind;                 // "tail", "offcpu", "block_io", "tcp", ...
  std::string detail;               // human text
  double value = 0;                 // the headline number of this item
  std::string unit;                 // "ns", "bytes", "ratio", "count"
  std::vector<uint64_t> event_ids;  // exemplars
};

// A thread that issued a chain's slow calls, with its share of their total time.
struct ThreadShare {
  uint32_t tid = 0;
  std::string name;  // thread name (comm) when known, else the process name, else ""
  double share = 0;  // of the chain's slow-call time (or of its calls, for rate chains)
};

// One of a chain's top stacks: which code path issued its slow calls (or where its thread
// waited, or computed), with the share of time it accounts for.
struct ChainStack {
  std::string role;  // "call" (slow calls), "offcpu" (where the thread waited), "sample" (on CPU)
  uint64_t stack_id = 0;
  double share = 0;    // of the role's total (slow-call time, off-CPU time, samples)
  uint64_t calls = 0;  // events with this stack (calls, spans or samples)
  bool truncated = false;
  std::vector<StackFrame> frames;  // innermost first
};

// Where the launching thread's time went over a chain's window (shares sum to 1):
// in_calls = inside probed calls (whether on or off CPU there); off_cpu_* = off CPU outside any
// probed call, by state; on_cpu = the rest (running, or runnable without a recorded span).
struct TimeSplit {
  bool present = false;
  uint32_t tid = 0;
  uint64_t start_ns = 0, end_ns = 0;  // the interval the shares are of
  double in_calls = 0, off_cpu_preempted = 0, off_cpu_blocked = 0, off_cpu_unknown = 0, on_cpu = 0;
  std::string dominant;  // the largest of the five names above
};

struct Chain {
  std::string id;  // stable: "<rule>:<key>:<window start>"
  std::string rule, rule_hash;
  Severity severity = Severity::kMedium;
  std::string category;
  Source source = Source::kUnknown;
  uint8_t op = 0;             // the affected op (0 when not about one op)
  uint32_t pid = 0, tid = 0;  // tid 0 when the chain is not about one thread
  uint16_t node = 0;
  int16_t rank = -1;
  uint64_t window_start = 0, window_end = 0;
  std::string summary, root_cause, explanation;
  std::vector<std::string> recommendations;
  std::vector<EvidenceItem> evidence;
  std::vector<PredicateResult> predicates;
  std::vector<std::pair<std::string, double>> values;  // every row slot at emit time
  uint64_t p50_ns = 0, p99_ns = 0;                     // for Ingero's causal_chains columns
  double tail_ratio = 0;
  uint64_t dropped_events = 0;  // events lost in this chain's window (live capture)
  // Where in the code (engine/annotate.h fills these after the rules ran).
  std::vector<ThreadShare> threads;  // largest share first; tid above = threads[0].tid
  std::vector<ChainStack> stacks;    // top stacks: role "call" first, then "offcpu", "sample"
  TimeSplit time_split;              // rate and gap chains: the launching thread
  // Where the chain's thread's time went over its window (operators/time_accounting.h, finish():
  // its thread, or the pid's thread with the most time; window edges rounded to whole seconds).
  // nullopt when the run kept no accounting bins or the thread has none in the window.
  std::optional<ThreadAccounting> accounting;
  // From a rule over the `accounting` stream (time, not slow calls): one finding over the windows
  // in a row it fired in (engine/runtime.h merge_window_runs); no warm-up re-judgement.
  bool over_time = false;
  // The severity the rule (or built-in detector) declared, before operators/severity.h judged the
  // chain's impact and evidence; set by the first grade_chain() (nullopt: not graded yet).
  std::optional<Severity> declared_severity;
};

// One cause over time (operators/incidents.h): consecutive windows or steps with the same finding
// (rule) on the same key (node, pid, tid, rank) are one incident, with the time it cost and what
// that time is worth. lost_ns, gpu_hours and cost are of the incident as a whole.
struct Incident {
  std::string id;  // "<rule>:<key>:<start>" of its first chain
  std::string rule, category;
  Severity severity = Severity::kMedium;
  uint32_t pid = 0, tid = 0;
  uint16_t node = 0;
  int16_t rank = -1;
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t steps = 0;                       // steps of the process inside [start, end) (0: no step period known)
  uint64_t lost_ns = 0;                     // the time this cause cost (docs/rules.md "Incidents" says how, per kind)
  std::string lost_basis;                   // how lost_ns was measured, in words
  double lost_share = 0;                    // lost_ns / the job's wall time (the trace's span)
  double gpus = 1;                          // GPUs the stalled process drives
  std::string gpus_from;                    // "trace" (distinct devices its calls named), "--gpus", "assumed"
  double gpu_hours = 0;                     // lost_ns / 3600 s x gpus
  std::optional<double> cost;               // gpu_hours x price, with a price (--gpu-hour-price or a rates file)
  std::string currency;                     // of cost ("USD" unless the rates file says otherwise)
  uint64_t step_ns = 0;                     // the process's step time p50 (0: unknown)
  std::optional<uint64_t> what_if_step_ns;  // the step time were this cause removed
  std::string summary;                      // one line
  std::vector<std::string> chains;          // ids of the chains that stand behind it (evidence)
};

// The order chains are reported in (severity desc, then window, rule, key, id): a total order, so
// results do not depend on thread count, batch boundaries or when an annotator added a chain.
inline bool chain_canonical_order(const Chain& a, const Chain& b) {
  if (a.severity != b.severity) return a.severity > b.severity;
  if (a.window_start != b.window_start) return a.window_start < b.window_start;
  if (a.rule != b.rule) return a.rule < b.rule;
  if (a.pid != b.pid) return a.pid < b.pid;
  if (a.tid != b.tid) return a.tid < b.tid;
  if (a.source != b.source) return a.source < b.source;
  if (a.op != b.op) return a.op < b.op;
  if (a.node != b.node) return a.node < b.node;
  if (a.rank != b.rank) return a.rank < b.rank;
  return a.id < b.id;
}

struct EngineCounters {
  uint64_t events_in = 0;
  uint64_t batches = 0;
  uint64_t windows_closed = 0;
  uint64_t late_events = 0;  // arrived behind the watermark: counted, not used
  uint64_t node_errors = 0;  // exceptions caught inside graph nodes
  uint64_t evicted_spans = 0;
  uint64_t tail_windows_capped = 0;  // join windows judged on their kMaxTailCalls slowest calls
  // Join span blocks spilled to disk (EngineOptions::join_resident_bytes), summed over shards:
  // how, not what (results do not depend on them; not written to result stores). A write error
  // leaves the spans in memory; a read error loses the spans of one block (a warning says so).
  uint64_t join_spilled_blocks = 0, join_spill_peak_bytes = 0, join_spill_errors = 0, join_spill_read_errors = 0;
  unsigned threads = 1;
};

// Why a rule did or did not fire: how many windows it judged, how many chains it emitted, and
// its closest miss - the failed predicate that came furthest along the rule (then the smallest
// shortfall), with the key and window where it happened. `explain --why-not` prints it.
struct RuleOutcome {
  std::string rule, rule_hash, category;
  uint64_t windows = 0;  // window rows that reached the rule's first predicate
  uint64_t chains = 0;
  bool has_miss = false;
  int miss_stage = -1;   // index of the failed stage in the rule (higher = got further)
  PredicateResult miss;  // the failed predicate, with both sides and the shortfall
  std::string miss_key;  // "pid=2233 op=cudaLaunchKernel"
  uint64_t miss_window_start = 0, miss_window_end = 0;
  std::vector<std::pair<std::string, double>> miss_values;  // the row when it missed
  bool over_time = false;                                   // a rule over the `accounting` stream (Chain::over_time)
};

struct AnalysisResult {
  std::vector<OpStats> ops;        // sorted by source, op
  std::vector<Chain> chains;       // sorted by severity desc, then window, rule, key
  std::vector<RuleOutcome> rules;  // one per rule (Emit node), in plan order
  EngineCounters counters;
  TraceMeta meta;
  // Per process (and rank): the inferred step period (operators/step_inference.h), by node, pid,
  // rank. Empty unless a StepInference observer ran.
  std::vector<ProcessSteps> steps;
  // Where the main GPU-feeding threads' time went (operators/time_accounting.h): wall time desc,
  // at most 16; empty when no accounting observer ran.
  std::vector<ThreadAccounting> accounting;
  // The same threads second by second (TimeAccounting::series, in the order of `accounting`), for
  // the HTML report and the Perfetto export; filled by the commands that draw them. Not in the
  // JSON nor in the stores.
  std::vector<AccountingSeries> accounting_series;
  // One per cause, most time lost first (operators/incidents.h assemble_incidents); empty until it ran.
  std::vector<Incident> incidents;
  // The verdict: one paragraph that opens every report (where the feeding threads' time went, the
  // incidents by time lost with cost and what-if, or the bound the job is under), and that bound
  // ("gpu-bound", "input-bound", "cpu-contended", "host-bound", "idle", "mixed", "unknown"; "" with incidents).
  std::string verdict, bound;
};

}  // namespace ingero
