// `diff --html FILE`: the report of `diff` (the JSON of docs/cli.md "`diff`") as one
// self-contained HTML page, the verdict first.
//
// Contract:
// - Input: the `diff --json` object (sinks/mcp/diff_run.h report_json); output: a complete HTML
//   document with no script and no network: the verdict (<h1 id="verdict">, the first element of
//   the body), the notes, the step time of both sides, the causes (significant ones marked, each
//   with its evidence, a bar per cause scaled to the largest change), where the focus process's
//   feeding threads' time per step went before and after (a stacked bar each, in the accounting
//   buckets), the ops and the chains that changed.
// - Every string from the report is escaped. Missing keys render as empty; never throws.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ingero {

std::string diff_html(const nlohmann::json& report);

}  // namespace ingero
