// Reports: AnalysisResult rendered for people (text) and machines (JSON).
//
// The JSON shapes are the stable contract documented in docs/cli.md; `stats --json`,
// `explain --json`, the MCP tools and the live view's final summary all use these functions, so
// a field means the same thing everywhere. Text output is for a GPU engineer reading a terminal:
// the worst chain first, numbers with units, the evidence and the fix under each chain.
// Pure functions of their inputs; never throw on odd data (NaN prints as "n/a" / null).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/result.h"

namespace ingero {

struct ReportOptions {
  bool color = false;        // ANSI colours for severities (only on a terminal)
  size_t max_chains = 0;     // 0 = all
  bool show_values = false;  // every row slot of each chain (verbose); also every stack in full
};

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

nlohmann::json stats_json(const AnalysisResult& r);
nlohmann::json explain_json(const AnalysisResult& r);

std::string stats_text(const AnalysisResult& r, const ReportOptions& o = {});
std::string explain_text(const AnalysisResult& r, const ReportOptions& o = {});
// The closest miss of one rule, for `explain --why-not RULE`.
std::string why_not_text(const RuleOutcome& o);

// "python3" or "pid 2233"
std::string process_label(const TraceMeta& meta, uint32_t pid);
// Trace-relative time: "+12.4s" from the trace start.
std::string trace_offset(const TraceMeta& meta, uint64_t ts);

}  // namespace ingero
