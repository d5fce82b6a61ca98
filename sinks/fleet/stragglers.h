// Stragglers per step: which node (rank) arrived last at each collective on the corrected clock,
// by how much, and, over a range of steps, "rank r arrived last in X% of steps, a median Y ms
// late, costing the job Z% of its step time". Used by `merge` (sinks/fleet/merge.h); pure
// functions, no I/O (docs/fleet.md, "Stragglers per step").
//
// Contract:
// - Input: the nodes of a merged trace as count_last_arrivals() takes them (sinks/fleet/clock_align.h):
//   sync points on the common clock (entry = the collective's entry, the rank's arrival; exit =
//   the return of the blocking wait after it), each node's clock uncertainty and ordinal shift.
// - Step: the median time between consecutive collectives (per ordinal), over all nodes, each on
//   its own clock (clock-free).
// - Arrival order ("arrival_order"): per collective every matched node has (>= 2 nodes), each
//   node's lateness = its entry minus the median entry of the others; the latest node is claimed
//   last only when it leads every other node by more than their two clock uncertainties added
//   (the rule of count_last_arrivals). Per node over the compared collectives: the share claimed
//   last, the median lateness (all compared collectives) and the median lateness where claimed
//   last (the "Y ms late"), and the cost = sum of its leads over the next-latest node where
//   claimed last, divided by compared collectives x step (the job's time spent waiting for it
//   alone). A node is named when it was compared at >= min_collectives collectives, claimed last
//   at >= min_last_share of them, and its median lateness is >= min_lag_share of the step: the
//   lag is judged relative to the step, never against an absolute floor.
// - Wait-least cross-check ("wait_least"): each node's median wait (exit - entry, one clock, no
//   matching needed) against the median of the other nodes' median waits: the straggler waits
//   least, by about its lag. Computed for every node with >= min_collectives sync points. It
//   names a node only where arrival order cannot decide (a node unmatched, its clock uncertainty
//   unknown or at least min_lag_share of the step, e.g. `ambiguous`): then the node that waits
//   least, if it waits >= min_lag_share of the step less than the median of the others; its cost
//   is estimated as that lag / step, and no "last in X%" is claimed (last_share = -1). Where
//   arrival order names a node, `cross_check` says whether wait-least agrees.
// - Severity: high when cost_share >= high_cost_share, else medium.
// - Never throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/result.h"
#include "sinks/fleet/clock_align.h"

namespace ingero {

struct StragglerOptions {
  uint64_t min_collectives = 20;  // steps needed before anything is named
  double min_lag_share = 0.01;    // median lateness >= this share of the step
  double min_last_share = 0.5;    // claimed last at >= this share of compared collectives
  double high_cost_share = 0.05;  // severity high at >= this share of the job's step time
};

struct StragglerNodeStats {
  std::string node;
  int rank = -1;                   // the node's rank when it has exactly one (set by the caller)
  uint64_t compared = 0;           // collectives judged with every matched node
  uint64_t last = 0;               // claimed last (beyond the clock uncertainties)
  uint64_t last_unresolved = 0;    // latest only within the uncertainties
  int64_t median_lateness_ns = 0;  // entry - median of the others' entries, over compared
  int64_t median_lag_ns = 0;       // the same, over the collectives it was claimed last at
  int64_t lead_sum_ns = 0;         // sum of leads over the next-latest where claimed last
  uint64_t waits = 0;              // sync points of its own (wait-least)
  int64_t median_wait_ns = -1;     // median exit - entry on its own clock (-1: too few)
  int64_t wait_shortfall_ns = 0;   // median of the others' median waits minus its own
};

struct Straggler {
  std::string node;
  int rank = -1;
  std::string method;        // arrival_order | wait_least
  uint64_t collectives = 0;  // compared (arrival_order) or its own sync points (wait_least)
  double last_share = -1;    // share of compared collectives claimed last; -1: not claimed
  int64_t median_lag_ns = 0;
  int64_t step_ns = 0;
  double cost_share = 0;    // share of the job's step time spent waiting for it
  std::string cross_check;  // agrees | disagrees | n/a
  Severity severity = Severity::kMedium;
};

struct StragglerReport {
  int64_t step_ns = 0;
  uint64_t compared = 0;                  // collectives judged by arrival order
  bool order_usable = false;              // every node with points matched, uncertainties known and < the lag floor
  std::vector<StragglerNodeStats> nodes;  // same order as the input
  std::vector<Straggler> stragglers;      // largest cost first
  std::string note;                       // why nothing was named or which signal was used
};

StragglerReport find_stragglers(const std::vector<ArrivalNode>& nodes, const StragglerOptions& options = {});

// One chain per straggler (category "straggler", rule "fleet_step_straggler"), for `merge` and
// the chain printers: summary "rank r arrived last in X% of steps, a median Y ms late, costing
// the job Z% of its step time".
std::vector<Chain> straggler_chains(const StragglerReport& report);

}  // namespace ingero
