// `ingero-pipeline diff`: what changed between two analysed traces (or two time ranges of one),
// and why, in the terms a lead asks for: "+X ms per step (+Y%): +a from <cause>, +b from <cause>".
//
// Contract:
// - Pure: compare() reads two DiffSide values (an AnalysisResult with its accounting, steps and
//   per-second accounting series, plus a bounded sample of each op's call durations) and returns
//   a DiffReport; no I/O. Deterministic.
// - The focus process: on BEFORE, the process whose main feeding thread (most time inside GPU
//   calls) has the most time in calls; on AFTER, the process of the same name (else the same pid,
//   else the AFTER side's own focus). Its step time is ProcessSteps::period_ns; when either side
//   has no period the unit is one second instead of one step.
// - The step time compared is the mean step time of the steps kept (slow steps included), not the
//   period of the regular ones: a stall every 8th step is a slower job.
// - One side with scheduler data (on CPU known) and the other without: on-CPU time is compared as
//   unknown on both (a note says so).
// - Where the time per step went: for the focus process's main thread, each accounting bucket's
//   share of the thread's wall time times the step period (so the buckets add up to the period
//   exactly and their changes add up to the change in step time). A cause is a bucket (or, for
//   blocked time, a block reason) with the change in its ns per step.
// - Noise is not a finding. A cause is significant when (1) a two-sided Mann-Whitney U test of the
//   bucket's per-second shares (whole seconds of the main thread only; the first and last are
//   partial and dropped) gives p < DiffOptions::alpha, and (2) its change per unit is at least
//   min_effect of the BEFORE step (or second) and at least min_effect_ns. An op's latency change is
//   significant when the U test of the two duration samples gives p < op_alpha and the medians
//   differ by at least min_op_shift. Step time: the U test (a shift of the typical step) or Welch's
//   test of the means (stalls in some steps), each at alpha / 2, of the consecutive step times.
// - A straggling rank (both sides merged fleet traces, sinks/fleet/stragglers.h): a rank named on
//   AFTER is a cause of its own, category "straggler", whose time per step is what the job waits
//   for it (cost_share x step on AFTER minus the same rank's on BEFORE, 0 when not named there).
//   It is significant when it was named on AFTER (>= 20 steps compared, last at half of them or
//   more, late by >= 1% of the step: the straggler rules) and its time per step passes the effect
//   floors. It goes first, and the focus thread's buckets it explains (the waits, sync and
//   collective, when the focus rank is not the straggler; every grown bucket when it is) name it
//   in `explained_by` and leave the verdict sentence, so no time is counted twice.
// - Mann-Whitney U: average ranks for ties, the tie-corrected normal approximation with a
//   continuity correction (exact enough from about 8 values per side; fewer give p = 1).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/accounting.h"
#include "model/event.h"
#include "model/result.h"

namespace ingero::diff {

struct UTest {
  double u = 0;  // U of the first sample
  double z = 0;  // > 0: the second sample tends to be larger
  double p = 1;  // two-sided
  size_t n1 = 0, n2 = 0;
};
UTest mann_whitney(std::span<const double> a, std::span<const double> b);
// Welch's test of the means (normal approximation: meant for tens of values per side or more),
// two-sided; z > 0 when the second mean is larger. Fewer than 3 values a side, or no variance: p = 1.
UTest welch(std::span<const double> a, std::span<const double> b);

// The call durations of one op (a uniform sample of at most kMaxSamples, plus the true count).
struct OpSample {
  Source source = Source::kUnknown;
  uint8_t op = 0;
  uint64_t count = 0;
  std::vector<double> durations_ns;
};

// A rank named as a straggler on a merged multi-node trace (sinks/fleet/stragglers.h computes it;
// the caller copies what the diff needs, so this module stays below sinks/).
struct RankStraggler {
  std::string node;
  int rank = -1;
  uint32_t pid = 0;        // its process in the trace (0: unknown)
  std::string method;      // arrival_order | wait_least
  double last_share = -1;  // share of steps it arrived last (-1: not claimed, wait_least)
  int64_t median_lag_ns = 0;
  int64_t step_ns = 0;
  double cost_share = 0;  // share of the job's step time spent waiting for it
  uint64_t collectives = 0;
};

struct DiffSide {
  std::string label;  // the file (and range) shown in the report
  const AnalysisResult* result = nullptr;
  std::vector<OpSample> ops;
  uint64_t wall_ns = 0;  // the side's time span (first event start to last event end)
  bool fleet = false;    // a merged trace of several nodes: `stragglers` was computed
  std::vector<RankStraggler> stragglers;
};

struct DiffOptions {
  double alpha = 0.01;       // causes and step time
  double op_alpha = 0.001;   // per-op latency (many ops: a stricter level)
  double min_effect = 0.02;  // of the BEFORE step (or second)
  uint64_t min_effect_ns = 20'000;
  double min_op_shift = 0.05;  // relative change of the median
};

struct SideSummary {
  std::string label, process;
  uint32_t pid = 0;
  std::string thread;  // the main feeding thread's name
  uint32_t tid = 0;
  bool has_steps = false;
  // step_ns: the mean step time, slow steps included; period_ns: ProcessSteps::period_ns (regular
  // steps only); p50/p99: of the step times.
  uint64_t step_ns = 0, period_ns = 0, p50_ns = 0, p99_ns = 0, steps = 0;
  std::string method;
  uint64_t wall_ns = 0;
  std::array<double, acct::kBuckets> per_unit{};  // ns per step (or per second) by bucket
};

struct Cause {
  std::string what, category, bucket;  // bucket "" for a straggling rank
  double added_ns = 0;                 // per step (or per second when unit is "second")
  double before_ns = 0, after_ns = 0;
  bool significant = false;
  double p = 1;
  std::vector<std::string> evidence;
  std::string explained_by;  // a bucket whose change a straggling rank explains: that cause's `what`
};

struct ThreadRow {
  std::string process, thread;
  bool in_before = false, in_after = false;
  std::array<double, acct::kBuckets> before{}, after{};  // ns per unit
};

struct OpRow {
  std::string op;
  uint64_t before_count = 0, after_count = 0;
  double before_per_unit = 0, after_per_unit = 0;  // calls per step (or per second)
  double before_p50 = 0, after_p50 = 0, before_p99 = 0, after_p99 = 0;
  double p = 1, median_change = 0;  // (after - before) / before of the sample medians
  bool significant = false;
  std::string kind;  // the accounting bucket its time goes to: launch, copy, sync, alloc, collective, other_call
};

struct ChainRow {
  std::string rule, category, process, thread;
  uint64_t before = 0, after = 0;        // chains
  uint64_t before_ns = 0, after_ns = 0;  // their windows' total length
  std::string change;                    // appeared, vanished, grew, shrank, same
};

// A cause as `explain` states it (an incident of operators/incidents.h), compared across the two
// sides: rows keyed by rule, category, process and thread name (pids differ between runs), node
// and rank when a merged trace has them. Only incidents of MEDIUM or HIGH severity on at least one
// side make a row (LOW ones are single calls and noise). Several incidents of one key on a side add
// up. `change`: appeared (no MEDIUM/HIGH incident of the key before), vanished (none after), grew or
// shrank (time lost per unit changed by more than 25% and by at least the causes' effect floors),
// else same. Time lost per unit = the side's incidents' lost_ns / its wall time x its unit (the
// mean step, or a second): comparable with Cause::added_ns.
struct IncidentRow {
  std::string rule, category, process, thread, node;
  int rank = -1;
  std::string change;                           // appeared, vanished, grew, shrank, same
  std::string before_severity, after_severity;  // "" when the side has none of the key
  uint64_t before_count = 0, after_count = 0;   // incidents of the key (any severity)
  uint64_t before_lost_ns = 0, after_lost_ns = 0;
  double before_ns = 0, after_ns = 0;  // lost per step (or per second)
  std::vector<std::string> evidence;   // each side's incidents: span, lost, what happened (its summary)
};

struct DiffReport {
  std::string unit = "step";  // "step" or "second"
  SideSummary before, after;
  double delta_ns = 0, delta_pct = 0;  // of the step (or 0 per second: see causes)
  bool step_significant = false;
  double step_p = 1;
  std::vector<Cause> causes;  // by added_ns, largest first
  std::vector<ThreadRow> threads;
  std::vector<OpRow> ops;  // significant first, then by name
  std::vector<ChainRow> chains;
  std::vector<IncidentRow> incidents;  // appeared first, then by the change in time lost (largest first)
  std::string verdict;
  std::vector<std::string> notes;  // what limits the comparison
};

DiffReport compare(const DiffSide& before, const DiffSide& after, const DiffOptions& opt = {});

// "+3.10 ms per step (+15.2%): +3.02 ms from CPU contention by stress-ng, ..." (report.verdict).
std::string format_ns(double ns);  // "+"-less, "3.10 ms", "412 us", "12 ns"

}  // namespace ingero::diff
