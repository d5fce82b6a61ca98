// `ingero-pipeline stats`: per-op latency statistics of a recorded trace.
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/result_json.h"
#include "sinks/report/text_report.h"

namespace ingero::cli {
namespace {

struct StatsArgs {
  std::string db;
  bool json = false;
  unsigned threads = 0;  // 0: automatic (EngineOptions::threads)
};

int run_stats(const StatsArgs& a) {
  std::string error;
  auto source = open_any_trace(a.db, error);
  if (!source) {
    print_error(error);
    return kExitInput;
  }
  EngineOptions opts;
  opts.threads = a.threads;
  const Plan empty;  // statistics only: no rules
  const AnalysisResult r = run_plan(empty, *source, opts);
  if (a.json) std::cout << stats_json(r).dump(2) << "\n";
  else std::cout << stats_text(r);
  std::cout.flush();
  return input_damage_status(r.meta);
}

Registrar reg{"stats", 10, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<StatsArgs>();
                auto* cmd = app.add_subcommand(
                    "stats",
                    "Per-operation latency table of a trace: count, p50/p95/p99, max, total, p99/p50.\n"
                    "Percentiles are nearest-rank (what Ingero reports), exact up to 1M samples per op.\n"
                    "Examples:\n"
                    "  ingero-pipeline stats --db trace.db\n"
                    "  ingero-pipeline stats --db trace.db --json | jq '.ops[] | select(.op==\"cudaLaunchKernel\")'");
                cmd->add_option("--db", args->db,
                                "Trace (Ingero 0.8/0.9 SQLite, ours, or an LMDB log); default: the embedded sample");
                cmd->add_flag("--json", args->json, "Machine-readable output (shape in docs/cli.md)");
                add_quiet_flag(cmd);
                cmd->add_option("--threads", args->threads,
                                "Engine threads; 0 or none: chosen from the machine and the trace (results do not "
                                "depend on it)")
                    ->check(CLI::Range(0u, 256u));
                cmd->callback([args, &rc] { rc = run_stats(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
