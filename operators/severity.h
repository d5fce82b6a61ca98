// Severity in one place: how bad a chain or an incident is, from its impact and its evidence. The
// rules (and the built-in detectors: launch_gap, the fleet straggler) DECLARE a severity, their
// intent; this module DECIDES it. Nothing else assigns Chain::severity after the engine emitted a
// chain (grep: the annotator calls grade_chain(), the final pass grade_chains()).
//
// Contract (decide_severity, in this order; the first that applies wins, except the impact steps,
// which apply after the caps):
//  1. Lossy: a chain that stands on events NOT being there (launch_gap, throughput_drop) in a
//     window where the capture lost events -> LOW (the tracer's own losses can explain it).
//  2. Not in the launch loop: an implicit_sync chain whose thread launched no kernel in the
//     window -> LOW (a cleanup or checkpoint thread holds up nothing).
//  3. Idle, not slowed: a throughput_drop whose launching thread was blocked off CPU for >= 50% of
//     the window -> LOW; a smaller dominant blocked share, or a dominant off-CPU share of unknown
//     state, caps it at MEDIUM.
//  4. Warm-up: a chain that stands on its process's warm-up calls alone (the annotator re-judged
//     it without them) -> LOW, unless the warm-up itself was abnormal (it keeps its severity), or
//     the chain is a real contention in progress: recorded off-CPU evidence and a time lost of at
//     least `medium_share` of its thread's time. The warm-up is a phase of the process: its first
//     `warmup_steps` steps when the step period is known (SeverityContext), else `param warmup`.
//  5. One call: a chain with exactly one slow call (or call) behind it is never above LOW.
//  6. Impact, when the time lost is known (lost_ns > 0 and base_ns > 0; share = lost / base):
//     a share below `negligible_share` that is also below `negligible_ns` -> LOW; a finding over
//     time (a feeding thread's time, recorded off-CPU state) with share >= `high_share` and
//     lost >= `high_min_ns` -> HIGH whatever the rule's own threshold (measured impact wins).
//  7. Evidence: a cpu_contention or blocking chain whose off-CPU spans have no recorded state
//     (Ingero traces) is capped at MEDIUM: contention and a voluntary wait look the same there.
//  Otherwise the declared severity stands (a tail rule's declaration is an upper bound: impact
//  only lowers it; only findings over time with recorded state are raised, step 6).
// Pure functions; never throw (bad numbers - NaN, zero bases - count as "not known").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/result.h"

namespace ingero {

enum class EvidenceStrength : uint8_t {
  kCallsOnly = 0,     // slow calls, rates or gaps: no off-CPU state involved or known
  kUnknownState = 1,  // off-CPU spans whose state the trace does not record
  kRecorded = 2,      // switch-out states recorded (a full scheduler capture)
};

struct SeverityFacts {
  Severity declared = Severity::kMedium;
  std::string category;
  bool over_time = false;  // a finding over a feeding thread's time (Chain::over_time)
  uint64_t lost_ns = 0;    // time the cause cost (0: not known)
  uint64_t base_ns = 0;    // the time it is a share of: its thread's (or the job's) wall time
  uint64_t calls = 0;      // slow calls (or calls, or steps) behind it; 0 = not known
  EvidenceStrength evidence = EvidenceStrength::kCallsOnly;
  bool lossy = false;        // rule 1
  bool not_in_loop = false;  // rule 2
  double split_blocked = 0;  // rule 3: the launching thread's blocked share (throughput_drop)
  bool split_dominant_blocked = false, split_dominant_unknown = false;
  bool warmup_only = false;      // rule 4
  bool warmup_abnormal = false;  // ... the warm-up calls themselves held abnormally long
};

struct SeverityOptions {
  double negligible_share = 0.005;      // 0.5% of the thread's time ...
  uint64_t negligible_ns = 50'000'000;  // ... and under 50 ms: LOW
  double medium_share = 0.05;           // a contention in warm-up that costs this much stays
  double high_share = 0.15;             // findings over time: 15% of the thread's time ...
  uint64_t high_min_ns = 100'000'000;   // ... and at least 100 ms lost: HIGH
  uint64_t warmup_steps = 3;            // the warm-up phase when the step period is known
};

// Why the decision differs from the declaration (kNone: it does not).
enum class SeverityReason : uint8_t {
  kNone = 0,
  kLossy,
  kNotInLoop,
  kIdle,
  kSplitCap,
  kWarmup,
  kOneCall,
  kNegligible,
  kHighImpact,
  kUnknownState,
};

struct SeverityDecision {
  Severity level = Severity::kMedium;
  SeverityReason reason = SeverityReason::kNone;
  std::string why;  // one clause for the root cause ("" when reason is kNone)
};

SeverityDecision decide_severity(const SeverityFacts& f, const SeverityOptions& o = {});

// What grade_chain may know beyond the chain itself: the process's steps (warm-up as a phase).
struct SeverityContext {
  const std::vector<ProcessSteps>* steps = nullptr;  // null: warm-up by `param warmup` only
  SeverityOptions options;
};

// The facts of a chain as the annotator (values warmup.*, launches, lost_events, slow.calls,
// slow.excess_ns; time_split) and the time accounting (Chain::accounting) left them.
SeverityFacts chain_facts(const Chain& c, const SeverityContext& ctx = {});
// The time a chain's cause cost its thread over the chain's window, and what it is a share of
// (0, 0 when not known): a finding over time, the extra preempted (cpu_contention) or blocked
// time against the thread's baseline (value trend.median.before - the baseline before a run of
// windows merged by the engine - else trend.median, when the rule keeps one); a tail chain,
// its slow calls' time beyond the median call (slow.excess_ns); a launch gap, its length; a
// throughput_drop (value `drop` = rate / recent peak, in [0, 1)), window x (1 - drop): the missing
// calls x the peak's time per call, of the window.
std::pair<uint64_t, uint64_t> chain_lost_ns(const Chain& c);

// The chain's value `name` (Chain::values), or `dflt` when absent or not finite.
double chain_value_or(const Chain& c, const char* name, double dflt);
// Decides c.severity from chain_facts(); the first call remembers the declaration in
// c.declared_severity and later calls start from it, so grading twice gives the same answer. A
// change is said once at the end of the root cause ("; severity LOW: ..."). Returns the decision.
SeverityDecision grade_chain(Chain& c, const SeverityContext& ctx = {});
// grade_chain over every chain, then the canonical order again.
void grade_chains(std::vector<Chain>& chains, const SeverityContext& ctx = {});

}  // namespace ingero
