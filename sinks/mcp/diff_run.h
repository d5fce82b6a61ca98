// One side of `diff` (cli/cmd_diff.cpp) and of the MCP tool compare_traces: the analysis `explain`
// runs (rule pack, chain annotator, time accounting with per-second bins, step inference with the
// trace's own step markers, a sample of each op's call durations) over a trace or a time range of
// it, with severity and incidents assembled as `explain` does (operators/incidents.h), plus, on a
// merged fleet trace, the stragglers per step; and the report of
// operators/diff_stats.h compare() as text and JSON (the shape in docs/cli.md).
//
// Contract:
// - analyse_side() never throws; false with `error` set (ready for the user: names the file and,
//   with a range, the range) when the plan is refused or the side holds no GPU API calls.
// - A range "A:B" is seconds from the trace's first event, "A:" to the end; events that start in
//   [first + A, first + B) are kept. Stragglers are judged on whole merged traces only (a note).
// - Lives in sinks/mcp because that is the lowest layer that may include the engine, the stores
//   and sinks/fleet together; the command and the MCP tool share it.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/plan.h"
#include "model/result.h"
#include "model/trace.h"
#include "operators/chain_annotate.h"
#include "operators/diff_stats.h"
#include "operators/incidents.h"

namespace ingero::diff {

struct TimeRange {
  bool set = false;
  double from_s = 0, to_s = std::numeric_limits<double>::infinity();
  std::string text;
};
// "A:B" or "A:" (seconds). True for "" (no range) and a valid range; false otherwise.
bool parse_range(const std::string& s, TimeRange& out);

struct Analysed {
  AnalysisResult result;
  std::vector<OpSample> ops;
  uint64_t wall_ns = 0;
  bool fleet = false;  // a merged trace of several nodes, stragglers judged
  std::vector<RankStraggler> stragglers;
  std::vector<std::string> notes;  // what limited this side (shown by the caller)
};

struct SideOptions {
  const Plan* plan = nullptr;
  AnnotateOptions annotate;
  unsigned threads = 1;
  IncidentOptions incidents;  // severity and incidents (operators/incidents.h), as `explain` assembles them
};

// `source` was opened on `path` (SQLite or LMDB); it is read to the end.
bool analyse_side(EventSource& source, const std::string& path, const TimeRange& range, const SideOptions& options,
                  Analysed& out, std::string& error);

// The side's label in the report: the path, and the range when there is one.
std::string side_label(const std::string& path, const TimeRange& range);

nlohmann::json report_json(const DiffReport& r);
std::string report_text(const DiffReport& r);

}  // namespace ingero::diff
