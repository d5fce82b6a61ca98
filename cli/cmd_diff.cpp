// `ingero-pipeline diff BEFORE AFTER`: what changed between two traces (or two time ranges of one)
// and why: step time, where the feeding thread's time per step went, per-op latency with a
// significance test, chains that appeared or vanished, and the verdict sentence first.
// The statistics are operators/diff_stats.h; the analysis of each side (the same as `explain`:
// rule pack, chain annotator, time accounting, step inference) and the report are
// sinks/mcp/diff_run.h (shared with the MCP tool compare_traces); this file parses and prints.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/pipeline_common.h"
#include "operators/chain_annotate.h"
#include "operators/diff_stats.h"
#include "sinks/mcp/diff_run.h"
#include "sinks/report/diff_html.h"

namespace ingero::cli {
namespace {

struct DiffArgs {
  std::vector<std::string> traces;  // BEFORE [AFTER]
  std::string before_range, after_range;
  bool json = false;
  std::string html;  // --html FILE (sinks/report/diff_html.h)
  bool fail_on_regression = false;
  std::vector<std::string> params;
  unsigned threads = 1;
};

// The analysis of one side (sinks/mcp/diff_run.h), with the trace opened by its content.
int analyse(const std::string& path, const diff::TimeRange& range, const AnalysisPlan& analysis, unsigned threads,
            diff::Analysed& out) {
  std::string error;
  auto source = open_any_trace(path, error);
  if (!source) {
    print_error(error);
    return kExitInput;
  }
  diff::SideOptions o;
  o.plan = &analysis.plan;
  o.annotate = annotate_options(analysis, LiveChainAnnotator::replay_defaults());
  o.threads = threads;
  if (!diff::analyse_side(*source, path, range, o, out, error)) {
    print_error(error);
    return kExitInput;
  }
  for (const auto& n : out.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  return input_damage_status(out.result.meta);
}

int run_diff(const DiffArgs& a) {
  use_one_malloc_arena();
  diff::TimeRange rb, ra;
  if (!diff::parse_range(a.before_range, rb) || !diff::parse_range(a.after_range, ra)) {
    print_error(
        "--before-range/--after-range: expected START:END in seconds from the trace's first event "
        "(e.g. 0:60, 60:), got '" +
        (diff::parse_range(a.before_range, rb) ? a.after_range : a.before_range) + "'");
    return kExitUsage;
  }
  std::string before_path = a.traces.at(0), after_path;
  if (a.traces.size() == 2) {
    after_path = a.traces[1];
  } else if (rb.set && ra.set) {
    after_path = before_path;
  } else {
    print_error("diff: expected two traces (BEFORE AFTER), or one trace with --before-range and --after-range");
    return kExitUsage;
  }
  AnalysisSpec spec;
  AnalysisPlan analysis;
  if (const int rc = prepare_analysis(a.params, spec, analysis); rc != kExitOk) return rc;
  diff::Analysed before, after;
  int rc_b = analyse(before_path, rb, analysis, a.threads, before);
  if (rc_b != kExitOk && rc_b != kExitDamaged) return rc_b;
  int rc_a = analyse(after_path, ra, analysis, a.threads, after);
  if (rc_a != kExitOk && rc_a != kExitDamaged) return rc_a;
  diff::DiffSide sb{before_path + (rb.set ? " [" + rb.text + " s]" : ""),
                    &before.result,
                    std::move(before.ops),
                    before.wall_ns,
                    before.fleet,
                    std::move(before.stragglers)};
  diff::DiffSide sa{after_path + (ra.set ? " [" + ra.text + " s]" : ""),
                    &after.result,
                    std::move(after.ops),
                    after.wall_ns,
                    after.fleet,
                    std::move(after.stragglers)};
  const diff::DiffReport rep = diff::compare(sb, sa);
  if (!a.html.empty()) {  // written whole to a temporary name, then renamed
    const std::string tmp = a.html + ".tmp";
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << diff_html(diff::report_json(rep));
    f.close();
    if (!f || std::rename(tmp.c_str(), a.html.c_str()) != 0) {
      std::remove(tmp.c_str());
      print_error("--html: cannot write " + a.html);
      return kExitInput;
    }
  }
  if (a.json) std::cout << diff::report_json(rep).dump(2) << "\n";
  else std::cout << diff::report_text(rep);
  std::cout.flush();
  if (rc_b == kExitDamaged || rc_a == kExitDamaged) return kExitDamaged;
  if (a.fail_on_regression && rep.step_significant && rep.delta_ns > 0) return kExitFindings;
  return kExitOk;
}

Registrar reg{
    "diff", 25, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<DiffArgs>();
      auto* cmd = app.add_subcommand(
          "diff",
          "Why is AFTER slower (or faster) than BEFORE? Runs the analysis of `explain` on both\n"
          "traces (or on two time ranges of one) and compares, for the process that drives the\n"
          "GPU most: its step time; where its main feeding thread's time per step went (the\n"
          "accounting buckets: preempted, launch, copy, sync, blocked, on CPU, ...); each GPU API\n"
          "op's latency and calls per step; the chains that appeared, vanished or grew. The first\n"
          "line is the verdict: \"+X ms per step (+Y%): +a from <cause>, +b from <cause>\".\n"
          "Noise is not a finding: a cause is significant only when a Mann-Whitney U test over\n"
          "the thread's whole seconds gives p < 0.01 AND it moved by at least 2% of the step.\n"
          "Without a step period on either side, everything is per second instead.\n"
          "Examples:\n"
          "  ingero-pipeline diff last_week.db today.db\n"
          "  ingero-pipeline diff last_week.db today.db --json\n"
          "  ingero-pipeline diff last_week.db today.db --html diff.html\n"
          "  ingero-pipeline diff fleet_before.db fleet_after.db   # merged traces (`merge`): a straggling rank too\n"
          "  ingero-pipeline diff run.db --before-range 0:60 --after-range 300:360\n"
          "  ingero-pipeline diff a.db b.db --fail-on-regression   # exit 1 when AFTER's steps are slower");
      cmd->add_option("traces", args->traces, "BEFORE.db AFTER.db (SQLite or LMDB traces)")->required()->expected(1, 2);
      cmd->add_option("--before-range", args->before_range,
                      "START:END seconds from the first event of BEFORE to compare (END may be empty)");
      cmd->add_option("--after-range", args->after_range,
                      "START:END seconds of AFTER (with one trace: of the same trace)");
      cmd->add_flag("--json", args->json, "Machine-readable output (shape in docs/cli.md)");
      cmd->add_option("--html", args->html, "Also write the report as one self-contained HTML page, verdict first");
      cmd->add_flag("--fail-on-regression", args->fail_on_regression,
                    "Exit 1 when AFTER's step time is significantly longer (for CI)");
      cmd->add_option("--threads", args->threads, "Engine threads (results do not depend on it)")
          ->check(CLI::Range(1u, 256u));
      add_param_option(cmd, &args->params);
      add_quiet_flag(cmd);
      cmd->callback([args, &rc] { rc = run_diff(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
