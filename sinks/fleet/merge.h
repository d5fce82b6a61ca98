// Merging per-node traces into one multi-node trace on one corrected clock (`ingero-pipeline
// merge`, docs/fleet.md).
//
// Contract:
// - Inputs: any mix of SQLite (Ingero 0.8/0.9, ours) and LMDB stores; each holds one or more
//   nodes. A node's name comes from the input (0.9 `{node}:{seq}` ids, our ip_meta.nodes) or,
//   for an unnamed node (Ingero 0.8, a single-node capture), from MergeInput::name, else the
//   file's stem. Every output event keeps its node (Event::node indexes the merged
//   TraceMeta::nodes); the output's ids are `{node}:{seq}`, unique because (node, seq) is.
// - Idempotent: a node that arrives twice with the same events (same count and the same
//   order-free hash of id, op, pid, tid, duration) is written once and reported as a duplicate;
//   the same node name with different events is an error (rename one input with NAME=PATH).
// - Errors (ok = false, one line naming the file): an input that cannot be opened (missing,
//   corrupt, incompatible schema), a node name conflict, an unwritable output. Checked in the
//   first pass, before the output is touched; the output is written to "<out>.merge-tmp" and
//   renamed at the end, so a failed merge never leaves a half file or clobbers an existing one.
// - Clock alignment (unless align = false): pass 1 collects each node's sync points
//   (sinks/fleet/clock_align.h); the reference (offset 0, method "reference") is the first node
//   that has them and whose capture covers its communicators' start, else the first that has
//   them; every other node gets offset = median of matched sync-point differences, the ordinal
//   shift decided by collective order, the data, or the clock anchors (methods
//   "collective_order", "collectives", "collectives_anchors"), or, when none decides, method
//   "ambiguous" with an uncertainty covering every whole-step shift that fits (>= the step
//   period, so no arrival order is claimed for it), else, from clock anchors recorded by the capture (table
//   ip_clock_anchors, SQLite inputs), the difference of the anchors' median (event clock - wall
//   clock) offsets with uncertainty = both nodes' recorded error bounds (method
//   "wall_clock_anchors"), else offset 0 with uncertainty -1 = unknown (method "none").
//   Corrected ts = ts - offset_ns for every event of the node.
// - Streaming: pass 2 re-opens the inputs and merges them by corrected time (a heap over one
//   batch per input) straight into the sink; memory is one batch per input plus 24 bytes per
//   collective instance (pass 1), independent of trace length as far as the readers stream.
// - SQLite output also gets per-node tables Ingero's schema lacks a node column for:
//   ip_merge_nodes (node, input, events, offset_ns, uncertainty_ns, method, pairs, sessions JSON),
//   ip_node_process_names (node, pid, name), ip_node_snapshots (node, ts, cpu_pct, mem_pct,
//   load_avg). Ingero's own process_names/system_snapshots keep only rows no two nodes disagree
//   on (a pid named differently on two nodes is left out there, never attributed to one node).
// - Arrival order: pass 2 also collects each node's collectives on the corrected clock and
//   counts, per node, the collectives it entered last by more than the clock uncertainties
//   (MergeNodeReport::last_arrivals) and those where it was latest only within them
//   (last_arrivals_unresolved: no order is claimed). Stored in ip_merge_nodes (SQLite) or the
//   meta value "fleet_merge_nodes" (LMDB) with each node's offset and uncertainty.
// - Stragglers per step (MergeReport::stragglers, sinks/fleet/stragglers.h): from the same
//   corrected collectives, the node that arrived last at most steps by a share of the step, with
//   the wait-least cross-check (`merge` prints them as chains; stragglers_of_merged_trace()
//   recomputes them on a merged file). Stored, one row per straggler, in ip_stragglers (node,
//   rank (NULL: unknown), method, collectives, last_share (NULL for wait_least), median_lag_ns,
//   step_ns, cost_share, cross_check, severity, summary) or, for LMDB, the meta value
//   "fleet_stragglers" (stragglers_json()).
// - Fleet identity (sinks/fleet/process_identity.h): every input's ip_node_attributes (hostname) and
//   ip_process_identity rows (rank, local rank, world size, job id per process), or an LMDB
//   input's "fleet_identity" meta value, are carried to the output (SQLite or LMDB) under the
//   output node names; Event::rank travels with each event.
// - Never throws.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sinks/fleet/clock_align.h"
#include "sinks/fleet/stragglers.h"

namespace ingero {

struct MergeInput {
  std::string path;
  std::string name;  // for an unnamed node in this input; "" = the file's stem
};

struct MergeOptions {
  std::string out;
  std::string format;               // "sqlite" | "lmdb" | "" = from the extension (.lmdb/.mdb)
  bool align = true;                // false: keep every node's raw clock (--no-align)
  uint64_t min_block_ns = 100'000;  // a wait shorter than this did not block: no sync point
  size_t batch_size = 4096;
};

struct MergeNodeReport {
  std::string node, input;
  uint64_t events = 0;
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = -1;  // -1 = unknown
  // reference | collective_order | collectives | collectives_anchors | ambiguous |
  // wall_clock_anchors | none | duplicate (clock_align.h says how each is decided)
  std::string method;
  uint64_t pairs = 0;           // matched collectives behind the offset
  int64_t period_ns = 0;        // the reference's step between collectives (0 = not aligned on them)
  uint64_t fitting_shifts = 0;  // ordinal shifts that fit the collectives (1 = unique; more: see method)
  uint64_t collectives = 0;
  std::string note;  // why a fallback was taken, clock steps seen, ...
  // Arrival order at collectives on the corrected clock (sinks/fleet/clock_align.h count_last_arrivals):
  uint64_t arrivals_compared = 0;         // collectives matched with other nodes
  uint64_t last_arrivals = 0;             // entered last by more than the clock uncertainties
  uint64_t last_arrivals_unresolved = 0;  // entered latest, but within them: no order claimed
  int64_t max_lead_ns = 0;                // largest claimed lead over the next-latest node
};

// One node's row as `merge --json` prints it and the LMDB meta value "fleet_merge_nodes" stores it.
nlohmann::json merge_node_json(const MergeNodeReport& n);

struct MergeReport {
  std::vector<MergeNodeReport> nodes;
  std::vector<std::string> warnings;
  uint64_t events_out = 0;
  uint64_t rows_skipped = 0;  // unreadable rows the readers skipped (counted, not fatal)
  double seconds = 0;
  // Stragglers per step on the corrected clock (sinks/fleet/stragglers.h), from pass 2; a
  // straggler's rank is the node's when all its collectives came from one rank.
  StragglerReport stragglers;
};

// {"step_ns", "compared", "order_usable", "note", "stragglers": [{node, rank, method, collectives,
// last_share, median_lag_ns, cost_share, cross_check, severity, summary}]}
nlohmann::json stragglers_json(const StragglerReport& r);

bool merge_traces(const std::vector<MergeInput>& inputs, const MergeOptions& options, MergeReport& report,
                  std::string& error);

// Last arrivals at collectives on an already merged trace (SQLite or LMDB), qualified by the
// clock uncertainty `merge` recorded per node (ip_merge_nodes, or the LMDB meta value
// "fleet_merge_nodes"; a node without a recorded uncertainty never gets an order claim). Returns
// one count per node of the trace; false with `error` when the trace cannot be opened.
bool arrivals_of_merged_trace(const std::string& path, std::vector<ArrivalCount>& out, std::string& error,
                              uint64_t min_block_ns = 100'000);

// Stragglers per step on an already merged trace, with the uncertainties `merge` recorded
// (as arrivals_of_merged_trace()). False with `error` when the trace cannot be opened.
bool stragglers_of_merged_trace(const std::string& path, StragglerReport& out, std::string& error,
                                uint64_t min_block_ns = 100'000, const StragglerOptions& options = {});

}  // namespace ingero
