// Incidents: one per cause, with the time it cost and what that time is worth; and the verdict,
// the paragraph every report opens with (docs/rules.md "Incidents").
//
// Contract (assemble_incidents, over a result whose chains are annotated and carry their
// accounting: after LiveChainAnnotator::finish and the observers' finish):
// - Severity: every chain is graded by operators/severity.h (grade_chains, with the result's steps
//   so the warm-up is a phase of the process), then put back in canonical order.
// - Grouping: chains with the same rule and category on the same key (node, pid, tid, rank) whose
//   windows follow each other (the next starts at most `slack_ns` + two of the process's steps
//   after the previous ends) are one incident, [first start, last end). A chain without a window
//   (the fleet straggler, per step over the whole trace) spans the trace.
// - Time lost, per kind: a finding over time (a feeding thread's preempted or blocked time) sums
//   its chains' extra time against the thread's baseline (severity.h chain_lost_ns); a straggler,
//   its median lag x the collectives it was last at x the ranks that waited (nodes - 1); a tail
//   chain, its slow calls' time beyond the median call; a launch gap, the gap; a throughput_drop,
//   window x (1 - rate / peak) per window (the largest when several ops of the process fired for
//   one window). Other kinds have no measured loss: lost_ns 0, lost_basis says so.
// - lost_share = lost_ns / the trace's span (TraceMeta first_ts..last_ts).
// - gpus: the distinct devices the process's GPU calls named when that is more than one
//   (GpuUsage, "trace"); else IncidentOptions::gpus when set ("--gpus"); else 1 ("assumed").
//   gpu_hours = lost_ns / 3.6e12 x gpus; cost = gpu_hours x the price when there is one (the
//   rates file's rate for the node's name, else gpu_hour_price), exactly: tests check the sums.
// - what_if_step_ns: with the process's step period known (ProcessSteps), steps = the incident's
//   length / period (at least 1), and the step time were the cause removed = p50 - lost / steps
//   (not below 0); nullopt without a period.
// - Severity of an incident: decide_severity over the incident as a whole (declared = its worst
//   chain, lost time against the incident's span, its calls).
// - Order: most time lost first, then severity, then start; ids are the first chain's id.
// - Verdict (result.verdict, result.bound): see make_verdict below.
// Pure; never throws.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/result.h"
#include "operators/event_observer.h"
#include "operators/severity.h"

namespace ingero {

// A GPU-hour price per node name (a rates file: lines "NAME PRICE", "# ..." comments, and
// optionally "currency CODE"; NAME "*" is the default).
struct GpuRates {
  std::map<std::string, double> by_node;
  double fallback = 0;  // "*" or --gpu-hour-price
  std::string currency = "USD";
  double rate_for(const std::string& node) const;
};
// Parses a rates file's text; false with "file:line: what was expected" in `error`.
bool parse_gpu_rates(const std::string& text, const std::string& file, GpuRates& out, std::string& error);

struct IncidentOptions {
  double gpus = 0;  // --gpus N: GPUs per process when the trace does not say (0: 1, "assumed")
  GpuRates rates;   // price per GPU-hour (0: no cost)
  uint64_t slack_ns = 1'000'000'000;
  SeverityOptions severity;
};

// Which devices each process's GPU calls named (Event::gpu_id), as an observer of the source.
class GpuUsage final : public EventObserver {
 public:
  void observe(const Event* events, size_t n) override;
  void finish(const TraceMeta&, AnalysisResult&) override {}
  // Distinct devices of (node, pid); 0 when it made no GPU call.
  unsigned devices(uint16_t node, uint32_t pid) const;

 private:
  std::unordered_map<uint64_t, std::array<uint64_t, 4>> seen_;  // (node, pid) -> gpu_id bitset
};

// Grades the chains and fills result.incidents, result.verdict and result.bound.
void assemble_incidents(AnalysisResult& r, const IncidentOptions& o = {}, const GpuUsage* usage = nullptr);

// The verdict paragraph (contract): where the main feeding thread's time went (from
// result.accounting: the largest parts by share), then the MEDIUM and HIGH incidents by time
// lost (at most 3 named, with lost time and share, GPU-hours, cost when priced, and the what-if),
// or, when there are none, the bound the job is under, from the main feeding thread's time, the
// first that applies: "unknown" (no accounting, or >= 50% of unknown state); "cpu-contended"
// (>= 15% preempted, and at least as much as blocked on input: the task that ran instead most is
// named); "input-bound" (>= 15% blocked on locks, pipes/sockets or disk); "gpu-bound" (>= 50%
// waiting for the GPU in synchronising calls); "host-bound" (>= 50% on CPU outside calls); "idle"
// (>= 50% asleep or blocked otherwise); else "mixed". A job whose feeding thread loses 15% or more
// to preemption or input waits is never called gpu-bound. Returns the bound ("" when incidents were
// named). A CPU contention incident names the task that ran instead most.
std::string make_verdict(const AnalysisResult& r, std::string& text);

}  // namespace ingero
