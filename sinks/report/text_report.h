// Reports: AnalysisResult rendered for people (text). The JSON form, the stable contract shared
// with the stores and the MCP tools, is model/result_json.h.
//
// Text output is for a GPU engineer reading a terminal: the worst chain first, numbers with units,
// the evidence and the fix under each chain. Pure functions of their inputs; never throw on odd
// data (NaN prints as "n/a").
#pragma once

#include <string>

#include "model/result.h"

namespace ingero {

struct ReportOptions {
  bool color = false;        // ANSI colours for severities (only on a terminal)
  size_t max_chains = 0;     // 0 = all
  bool show_values = false;  // every row slot of each chain (verbose); also every stack in full
};

std::string stats_text(const AnalysisResult& r, const ReportOptions& o = {});
std::string explain_text(const AnalysisResult& r, const ReportOptions& o = {});
// The inferred steps (r.steps), one line per process and rank:
// "pid 4242 (python3): 1,204 steps, period 48.2 ms (p50 48.0 ms, p99 61.3 ms), recognised by
// cudaStreamSynchronize x1, confidence 0.97", or "pid 77 (server): no period: <reason>; fixed 1 s
// intervals instead". "" when there are none. explain_text appends it when r.steps is non-empty.
std::string steps_text(const AnalysisResult& r);

// explain's "Where the time went" section (r.accounting, operators/time_accounting.h): one line per
// main feeding thread (shares of its wall time, the task that preempted it most) and a plain note
// when the trace cannot tell (off-CPU state not recorded, no scheduler events); "" when empty.
std::string accounting_text(const AnalysisResult& r, size_t max_threads = 4);
// One thread's accounting on one line: "12.0s: in calls 3% (sync 2%, launch 1%), on CPU 50%,
// preempted 40% (mostly by stress pid 77 tid 77, 4.8s), blocked 7% (lock 7%), unknown 0%".
std::string accounting_parts(const ThreadAccounting& a);
// The incidents (r.incidents, operators/incidents.h), most time lost first: per incident its
// severity, kind, key, span, time lost with its share and basis, GPU-hours, cost and what-if; at
// most `max` (0 = all). "" when there are none. explain_text opens with r.verdict, then these.
std::string incidents_text(const AnalysisResult& r, size_t max = 0);
// `text` wrapped at `width` columns, continuation lines indented.
std::string wrap_text(const std::string& text, size_t width, const std::string& indent);
// The closest miss of one rule, for `explain --why-not RULE`.
std::string why_not_text(const RuleOutcome& o);

// Trace-relative time: "+12.4s" from the trace start.
std::string trace_offset(const TraceMeta& meta, uint64_t ts);

}  // namespace ingero
