// The JSON contract of results: AnalysisResult and its parts as JSON, and back where stores keep
// them as JSON.
//
// The JSON shapes are the stable contract documented in docs/cli.md; `stats --json`,
// `explain --json`, the MCP tools, the live view's final summary and the stores (SQLite ip_chains,
// LMDB chain records) all use these functions, so a field means the same thing everywhere.
// Pure functions of their inputs; never throw on odd data (NaN prints as null). The text
// rendering is sinks/report/text_report.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/result.h"

namespace ingero {

nlohmann::json trace_json(const TraceMeta& meta, const AnalysisResult& r);
nlohmann::json op_stats_json(const OpStats& s);
nlohmann::json chain_json(const Chain& c, const TraceMeta& meta);
// The "where in the code" parts of a chain (docs/cli.md): a frame is
// {kind: "python"|"native"|"kernel", function, file, line, module}; a stack
// {role, stack_id, share, calls, truncated, frames: innermost first}; the time split
// {tid, start_ns, end_ns, in_calls, off_cpu_preempted, off_cpu_blocked, off_cpu_unknown, on_cpu,
// dominant} or null when the chain has none; threads [{tid, name, share}].
nlohmann::json frame_json(const StackFrame& f);
nlohmann::json chain_stack_json(const ChainStack& s);
nlohmann::json time_split_json(const TimeSplit& t);
nlohmann::json threads_json(const std::vector<ThreadShare>& threads);
// The inverse of the three above, for stores that keep them as JSON (SQLite ip_chains, LMDB):
// fills c.threads, c.stacks and c.time_split; anything malformed is skipped, never thrown.
void chain_where_from_json(const nlohmann::json& threads, const nlohmann::json& stacks,
                           const nlohmann::json& time_split, Chain& c);
// "from train.py:142 in forward" (C++ frames shortened by frame_label): the call site of the chain's first stack with
// frames (role "call" first, then "sample", then "offcpu"; a chain with a time split starts with the role of its
// dominant share: "sample" for on_cpu, "offcpu" for off_cpu_*), or "" when it has none.
std::string chain_call_site(const Chain& c);
nlohmann::json rule_outcome_json(const RuleOutcome& o);
nlohmann::json health_json(const InputHealth& h);

// The inferred steps (model/steps.h), one object per process and rank:
// [{pid, node, rank, count, period_ns, p50_ns, p99_ns, method, confidence, reason}]; `node` is the
// node's name ("" local), `reason` says why there is no period when method is "none" ("" otherwise).
// Boundaries are not in the JSON.
nlohmann::json steps_json(const std::vector<ProcessSteps>& steps, const TraceMeta& meta);

// Where a feeding thread's time went (model/accounting.h): {pid, tid, comm, node, rank, start_ns,
// end_ns, wall_ns, in_calls_ns: {kind: ns}, on_cpu_ns, preempted_ns, preempted_by: [{pid, tid,
// comm, ns}], blocked_ns: {reason: ns}, unknown_ns, scheduler_data}; node is the node's name ("" = local).
nlohmann::json thread_accounting_json(const ThreadAccounting& a, const TraceMeta& meta);
// The inverse, for stores that keep it as JSON (SQLite ip_chains.accounting, LMDB chain records):
// `node` is looked up by name in meta.nodes (not added), `fallback_node` when it is not there.
// Missing or malformed fields read as 0 / empty; never throws.
ThreadAccounting thread_accounting_from_json(const nlohmann::json& j, const TraceMeta& meta, uint16_t fallback_node);

// One incident (model/result.h Incident, operators/incidents.h): {id, rule, category, severity,
// pid, tid, node (name, "" local), rank, start_ns, end_ns, steps, lost_ns, lost_basis, lost_share,
// gpus, gpus_from, gpu_hours, cost (null without a price), currency, step_ns (null: unknown),
// what_if_step_ns (null: unknown), summary, chains: [chain ids]}.
nlohmann::json incident_json(const Incident& in, const TraceMeta& meta);

nlohmann::json stats_json(const AnalysisResult& r);
// ... with "accounting": [thread_accounting_json] (main feeding threads, wall time desc).
// Holds "steps" (steps_json) only when r.steps is non-empty; "incidents" ([incident_json], most
// time lost first), "verdict" (the paragraph reports open with) and "bound" always.
nlohmann::json explain_json(const AnalysisResult& r);

// "python3" or "pid 2233"
std::string process_label(const TraceMeta& meta, uint32_t pid);

}  // namespace ingero
