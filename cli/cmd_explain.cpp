// `ingero-pipeline explain`: causal chains of a recorded trace, worst first, with evidence.
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/fleet_explain.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/result_json.h"
#include "operators/chain_annotate.h"
#include "operators/incidents.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "sinks/fleet/merge.h"
#include "sinks/fleet/replica_steps.h"
#include "sinks/fleet/stragglers.h"
#include "sinks/report/html_report.h"
#include "sinks/report/text_report.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::cli {
namespace {

// A merged fleet trace (more than one node): the rank that arrives last at each collective,
// judged per step on the clocks `merge` corrected (sinks/fleet/stragglers.h), as `merge`
// reports it. It replaces the per-window rule's chain for the same rank (fleet_training_straggler:
// 10 s windows with n >= 20 and a 1 ms floor, docs/fleet.md). A second pass over the trace.
void add_step_stragglers(const std::string& db, AnalysisResult& r) {
  if (db.empty() || r.meta.nodes.size() < 2 || !(is_sqlite_file(db) || is_lmdb_file(db))) return;
  // Inference replicas at the step (sinks/fleet/replica_steps.h), decode and prefill apart, from
  // the steps this run inferred per process.
  for (Chain& c : replica_step_chains(slow_replicas(r.steps, r.meta.nodes))) r.chains.push_back(std::move(c));
  StragglerReport sr;
  std::string error;
  if (!stragglers_of_merged_trace(db, sr, error)) {
    std::fprintf(stderr, "warning: stragglers per step: %s\n", error.c_str());
    return;
  }
  for (Chain& c : straggler_chains(sr)) {
    std::erase_if(r.chains, [&](const Chain& old) {
      return old.rule == "fleet_training_straggler" && old.rank >= 0 && old.rank == c.rank;
    });
    r.chains.push_back(std::move(c));
  }
}

struct ExplainArgs {
  std::string db;
  bool json = false;
  unsigned threads = 0;  // 0: automatic (EngineOptions::threads)
  std::vector<std::string> rules;
  std::vector<std::string> params;  // --param NAME=VALUE (rule-pack params, `warmup` included)
  bool no_default_rules = false;
  std::string why_not;
  std::string save;
  std::string html;  // --html: the self-contained report (sinks/report/html_report.h)
  size_t limit = 0;
  bool verbose = false;
  bool builtin = false;
  CostArgs cost;           // --gpus, --gpu-hour-price, --rates (operators/incidents.h)
  FleetExplainArgs fleet;  // --nodes: ask several nodes' MCP servers instead (cli/fleet_explain.h)
};

int run_explain(const ExplainArgs& a) {
  use_one_malloc_arena();
  if (!a.fleet.nodes.empty()) {
    FleetExplainArgs f = a.fleet;
    f.json = a.json;
    return run_fleet_explain(f);
  }
  IncidentOptions incident_opts;
  if (const int rc = incident_options(a.cost, incident_opts); rc != kExitOk) return rc;
  AnalysisSpec spec;
  spec.use_default = !a.no_default_rules;
  spec.builtin = a.builtin;
  spec.rule_files = a.rules;
  AnalysisPlan analysis;
  if (const int rc = prepare_analysis(a.params, spec, analysis); rc != kExitOk) return rc;
  std::string error;
  const Plan& plan = analysis.plan;
  std::vector<std::string> errors;
  auto source = open_any_trace(a.db, error);
  if (!source) {
    print_error(error);
    return kExitInput;
  }
  std::unique_ptr<SqliteSink> sink;
  if (!a.save.empty()) {
    sink = SqliteSink::create(a.save, error);
    if (!sink) {
      print_error(error);
      return kExitInput;
    }
  }
  // With --save, events pass through a tee so the database holds the trace and its chains.
  struct Tee final : EventSource {
    EventSource& in;
    SqliteSink* out;
    bool meta_written = false;
    Tee(EventSource& i, SqliteSink* o) : in(i), out(o) {}
    bool next(Batch& b) override {
      if (!in.next(b)) return false;
      if (out) {
        if (!meta_written) meta_written = out->write_meta(in.meta());
        out->write_events(b.events);
      }
      return true;
    }
    TraceMeta& meta() override { return in.meta(); }
  } tee(*source, sink.get());

  EngineOptions opts;
  opts.threads = a.threads;
  opts.join_resident_bytes = replay_join_resident_bytes();
  // Every chain gets its threads, top stacks and (rate/gap chains) the launching thread's time
  // split, computed as the engine emits it (bounded memory on long traces); launch_gap chains come
  // from the annotator's built-in detector.
  // Warm-up (`param warmup`) and the tail re-judgement follow the pack's params and --param.
  LiveChainAnnotator annotator(annotate_options(analysis, LiveChainAnnotator::replay_defaults()));
  // Where each main GPU-feeding thread's time went (operators/time_accounting.h): result.accounting,
  // and each chain's own thread over its window (Chain::accounting).
  AccountingOptions acct_opts;
  acct_opts.chain_accounting = true;
  acct_opts.meta = &tee.meta();
  TimeAccounting accounting(acct_opts);
  // The step period of each process, inferred with no markers (operators/step_inference.h), or
  // taken from the markers the program sent when the trace has them (ip_annotations, or Ingero's
  // own annotations table: docs/steps.md "Explicit step markers").
  StepInference steps;
  std::vector<Annotation> program_annotations;
  if (!a.db.empty() && is_sqlite_file(a.db)) {
    AnnotationReadStats as;
    if (!read_annotations(a.db, source->meta().nodes, program_annotations, as, error)) {
      std::fprintf(stderr, "warning: %s (the steps are inferred instead)\n", error.c_str());
      program_annotations.clear();
    } else if (as.skipped) {
      std::string why;
      for (const auto& [r, n] : as.reasons) why += (why.empty() ? "" : "; ") + r + " x" + std::to_string(n);
      std::fprintf(stderr, "warning: %s: %llu %s row(s) skipped: %s\n", a.db.c_str(),
                   static_cast<unsigned long long>(as.skipped), as.table.c_str(), why.c_str());
    }
    std::vector<StepMarker> markers;
    for (const Annotation& x : program_annotations)
      if (StepMarker m; step_marker_of(x, m)) markers.push_back(m);
    steps.add_markers(markers);
    if (!markers.empty()) opts.step_markers = std::make_shared<const std::vector<StepMarker>>(markers);
  }
  GpuUsage gpus;  // the devices each process's calls named: an incident's GPUs
  ObservingSource observed(tee, {&accounting, &steps, &gpus});
  EventSource& annotated = annotator.tap(observed);
  opts.on_chain = [&annotator](const Chain& c) { annotator.annotate(c); };
  AnalysisResult r = run_plan(plan, annotated, opts, &errors);
  if (!errors.empty()) {
    for (const auto& e : errors) print_error("plan: " + e);
    return kExitInput;
  }
  annotator.finish(r);  // first: chains get their threads, then their accounting
  observed.finish(r);
  add_step_stragglers(a.db, r);
  assemble_incidents(r, incident_opts, &gpus);                // severity, incidents, the verdict
  if (!a.html.empty()) add_accounting_series(accounting, r);  // the report's charts over time
  if (const std::string w = annotator_spill_warning(annotator.spill_counters()); !w.empty())
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (const std::string w = join_spill_warning(r.counters); !w.empty())
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (sink) {
    sink->write_meta(r.meta);
    if (!sink->write_result(r) || !sink->close(error)) {
      print_error(a.save + ": " + (error.empty() ? sink->error() : error));
      return kExitRuntime;
    }
    if (!program_annotations.empty() && !write_annotations(a.save, program_annotations, r.meta.nodes, error))
      std::fprintf(stderr, "warning: %s\n", error.c_str());
  }
  if (!a.html.empty()) {  // a second pass over the trace for the charts
    auto again = open_any_trace(a.db, error);
    if (!again || !write_html_report(a.html, r, *again, error)) {
      print_error(error);
      return kExitInput;
    }
  }
  if (!a.why_not.empty()) {
    for (const auto& o : r.rules)
      if (o.rule == a.why_not) {
        // What the warm-up did to this rule's chains, naming the param (operators/chain_annotate.h).
        const WarmupEffect w = warmup_effect(r.chains, o.rule);
        if (a.json) {
          auto j = rule_outcome_json(o);
          j["warmup"] = {{"param", "warmup"},    {"window_ns", analysis.warmup_ns}, {"chains", w.chains},
                         {"calls", w.calls},     {"only_warmup", w.only},           {"only_warmup_calls", w.only_calls},
                         {"demoted", w.demoted}, {"abnormal", w.abnormal}};
          std::cout << j.dump(2) << "\n";
        } else if (o.over_time) {
          // A rule over time judges each feeding thread's time; warm-up is not applied to it. On a
          // trace without switch-out states it cannot see preemption or blocking: say so.
          std::cout << why_not_text(o);
          bool sched = false;
          for (const auto& t : r.accounting) sched = sched || t.scheduler_data;
          std::cout << "  a rule over time (from accounting): it judges each GPU-feeding thread's time window by "
                       "window (docs/rules.md, \"Rules over time\"); warm-up does not apply to it.\n";
          if (!r.accounting.empty() && !sched)
            std::cout << "  this trace records no switch-out state (an Ingero trace, or a capture without "
                         "scheduler events): time outside calls is unknown, so it cannot show preemption or "
                         "blocking; capture with `ingero-pipeline trace` to judge this rule\n";
        } else {
          std::cout << why_not_text(o) << warmup_why_not_text(w, analysis.warmup_ns);
        }
        std::cout.flush();
        return input_damage_status(r.meta);
      }
    std::string names;
    for (const auto& o : r.rules) names += (names.empty() ? "" : ", ") + o.rule;
    print_error("no rule named '" + a.why_not + "' (rules: " + names + ")");
    return kExitUsage;
  }
  if (a.json) {
    std::cout << explain_json(r).dump(2) << "\n";
  } else {
    ReportOptions ro;
    ro.color = stdout_is_terminal();
    ro.max_chains = a.limit;
    ro.show_values = a.verbose;
    std::cout << explain_text(r, ro);
    if (!a.save.empty()) std::cout << "\nSaved trace and chains to " << a.save << "\n";
  }
  std::cout.flush();
  return input_damage_status(r.meta);
}

Registrar reg{"explain", 20, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<ExplainArgs>();
                auto* cmd = app.add_subcommand(
                    "explain",
                    "Causal chains of a trace: slow CUDA/driver calls joined, on the same thread and time\n"
                    "interval, with what the host was doing (off-CPU time, block I/O, TCP retransmits,\n"
                    "socket I/O, page allocation). Worst first, each with evidence, the checks it passed\n"
                    "and what to do. A heavy tail no host signal covers is reported as unexplained_tail.\n"
                    "Examples:\n"
                    "  ingero-pipeline explain                         # the embedded sample trace\n"
                    "  ingero-pipeline explain --db trace.db --json\n"
                    "  ingero-pipeline explain --db trace.db --why-not cpu_contention\n"
                    "  ingero-pipeline explain --db trace.db --save analysed.db");
                cmd->add_option("--db", args->db, "Trace database; default: the embedded sample");
                cmd->add_flag("--json", args->json, "Machine-readable output (shape in docs/cli.md)");
                cmd->add_option("--threads", args->threads,
                                "Engine threads; 0 or none: chosen from the machine and the trace (results do not "
                                "depend on it)")
                    ->check(CLI::Range(0u, 256u));
                cmd->add_option("--rules", args->rules, "Rule files to load (in addition to the default pack)");
                cmd->add_flag("--no-default-rules", args->no_default_rules, "Use only the --rules files");
                add_param_option(cmd, &args->params);
                cmd->add_flag("--builtin", args->builtin,
                              "Run the hand-built C++ plans instead of the rule pack (for comparison)");
                cmd->add_option("--why-not", args->why_not,
                                "Say why RULE did not fire: its closest miss, by how much, for which key/window");
                cmd->add_option("--save", args->save, "Also write the trace and its chains to this SQLite database");
                cmd->add_option(
                    "--html", args->html,
                    "Also write a self-contained HTML report (chains, latency histograms, call rate, off-CPU share)");
                cmd->add_option("--limit", args->limit, "Show at most N chains in text output (0 = all)");
                cmd->add_flag("-v,--verbose", args->verbose, "Print every computed value of each chain");
                add_cost_options(cmd, &args->cost);
                add_quiet_flag(cmd);
                cmd->add_option("--nodes", args->fleet.nodes,
                                "Ask these nodes' MCP HTTP endpoints (http://HOST:PORT/mcp, comma-separated) instead")
                    ->delimiter(',');
                cmd->add_option("--token", args->fleet.token, "--nodes: bearer token (default $INGERO_MCP_TOKEN)");
                cmd->add_option("--node-timeout", args->fleet.timeout_s, "--nodes: per-node deadline in seconds")
                    ->check(CLI::Range(0.1, 600.0));
                cmd->callback([args, &rc] { rc = run_explain(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
