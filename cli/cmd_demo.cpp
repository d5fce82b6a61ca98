// `ingero-pipeline demo`: synthetic traces with a known, injected cause, analysed like a real
// trace, then explained: what was injected, what the analysis found, and whether the same
// workload without the fault (the control) stays clean. No GPU, no root, no files needed.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/result_json.h"
#include "model/synth.h"
#include "sinks/report/text_report.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::cli {
namespace {

struct DemoArgs {
  std::string scenario;
  bool control = false, json = false, list = false, builtin = false, verbose = false;
  std::string save;
  uint64_t seed = 1, events = 1'000'000;
  unsigned threads = 1;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Writes events (from a source), metadata and chains to SQLite or LMDB (by extension).
bool save_trace(const std::string& path, EventSource& src, const std::vector<Chain>& chains, std::string& error) {
  const bool lmdb = ends_with(path, ".lmdb") || ends_with(path, ".mdb");
  std::unique_ptr<LmdbSink> l;
  std::unique_ptr<SqliteSink> s;
  if (lmdb) {
    LmdbSink::Options o;
    o.durable = false;
    l = LmdbSink::create(path, error, o);
  } else {
    s = SqliteSink::create(path, error);
  }
  if (!l && !s) return false;
  bool ok = l ? l->write_meta(src.meta()) : s->write_meta(src.meta());
  Batch b;
  while (ok && src.next(b)) ok = l ? l->write_events(b.events) : s->write_events(b.events);
  if (ok) ok = l ? l->write_meta(src.meta()) : s->write_meta(src.meta());
  if (ok && !chains.empty()) {
    if (l) {
      ok = l->write_chains(chains);
    } else {
      AnalysisResult r;
      r.chains = chains;
      r.meta = src.meta();
      ok = s->write_result(r);
    }
  }
  if (ok) ok = l ? l->close(error) : s->close(error);
  if (!ok && error.empty()) error = l ? l->error() : s->error();
  return ok;
}

struct Verdict {
  bool found = false;  // a chain of the expected category, about the faulty process/rank
  size_t chains = 0;
  std::vector<const Chain*> matching;
};

Verdict judge(const synth::SynthTrace& t, const AnalysisResult& r) {
  Verdict v;
  v.chains = r.chains.size();
  for (const auto& c : r.chains) {
    if (c.category != t.category) continue;
    const bool who = t.rank >= 0 ? c.rank == t.rank : c.pid == t.pid;
    if (who && c.window_start < t.fault_end && c.window_end > t.fault_start) v.matching.push_back(&c);
  }
  v.found = !v.matching.empty();
  return v;
}

AnalysisResult analyse(const synth::SynthTrace& t, const Plan& plan, unsigned threads) {
  VectorSource src(t.events, 4096, t.meta);
  EngineOptions eo;
  eo.threads = threads;
  return run_plan(plan, src, eo);
}

int list_scenarios() {
  std::printf("%-16s %-16s %s\n", "SCENARIO", "CATEGORY", "WHAT IS INJECTED");
  for (const auto& s : synth::all_scenarios())
    std::printf("%-16s %-16s %s\n", std::string(s.name).c_str(), std::string(s.category).c_str(),
                std::string(s.title).c_str());
  std::printf("%-16s %-16s %s\n", "large", "-", "a large mixed workload for benchmarks (--events N)");
  return kExitOk;
}

int run_large(const DemoArgs& a, const Plan& plan) {
  if (!a.save.empty()) {
    synth::LargeTraceSource src(a.events, a.seed);
    std::string error;
    const auto t0 = std::chrono::steady_clock::now();
    if (!save_trace(a.save, src, {}, error)) {
      print_error(error);
      return kExitRuntime;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %llu synthetic events to %s in %.1f s\n", static_cast<unsigned long long>(a.events),
                a.save.c_str(), s);
    return kExitOk;
  }
  synth::LargeTraceSource src(a.events, a.seed);
  EngineOptions eo;
  eo.threads = a.threads;
  const AnalysisResult r = run_plan(plan, src, eo);
  if (a.json) {
    std::cout << explain_json(r).dump(2) << "\n";
  } else {
    ReportOptions ro;
    ro.color = stdout_is_terminal();
    ro.max_chains = 5;
    std::cout << explain_text(r, ro);
  }
  return kExitOk;
}

int run_one(const DemoArgs& a, const synth::ScenarioInfo& info, const Plan& plan) {
  const synth::SynthTrace fault = synth::make_scenario(info.id, true, a.seed);
  const synth::SynthTrace control = synth::make_scenario(info.id, false, a.seed);
  const AnalysisResult rf = analyse(fault, plan, a.threads);
  const AnalysisResult rc = analyse(control, plan, a.threads);
  const Verdict vf = judge(fault, rf);
  const bool control_clean = rc.chains.empty();
  const AnalysisResult& shown = a.control ? rc : rf;
  if (!a.save.empty()) {
    const synth::SynthTrace& t = a.control ? control : fault;
    VectorSource src(t.events, 4096, t.meta);
    std::string error;
    if (!save_trace(a.save, src, shown.chains, error)) {
      print_error(error);
      return kExitRuntime;
    }
  }
  if (a.json) {
    nlohmann::json j = explain_json(shown);
    j["demo"] = {{"scenario", info.name},
                 {"expected_category", info.category},
                 {"analysed", a.control ? "control" : "fault"},
                 {"injected", info.cause},
                 {"fix", info.fix},
                 {"found", vf.found},
                 {"fault_chains", rf.chains.size()},
                 {"control_chains", rc.chains.size()},
                 {"control_clean", control_clean}};
    std::cout << j.dump(2) << "\n";
    return vf.found && control_clean ? kExitOk : kExitFindings;
  }
  ReportOptions ro;
  ro.color = stdout_is_terminal();
  ro.show_values = a.verbose;
  std::printf("demo: %s - %s (%s, %zu events, synthetic)\n\n", std::string(info.name).c_str(),
              std::string(info.title).c_str(), a.control ? "control run, no fault" : "fault injected",
              (a.control ? control : fault).events.size());
  std::cout << explain_text(shown, ro);
  std::printf("\n-- what this demo injected ------------------------------------------------\n");
  std::printf("%s\n", std::string(info.cause).c_str());
  std::printf("fix: %s\n", std::string(info.fix).c_str());
  std::printf("\n-- verdict -----------------------------------------------------------------\n");
  if (vf.found)
    std::printf("found:   %s chain on %s: %s\n", std::string(info.category).c_str(),
                fault.rank >= 0 ? ("rank " + std::to_string(fault.rank)).c_str()
                                : process_label(fault.meta, fault.pid).c_str(),
                vf.matching.front()->summary.c_str());
  else
    std::printf("MISSED:  no %s chain on the faulty %s (%zu other chains)\n", std::string(info.category).c_str(),
                fault.rank >= 0 ? "rank" : "process", rf.chains.size());
  std::printf("control: %s\n", control_clean ? "clean (the same workload without the fault gives no chain)"
                                             : ("NOT clean: " + std::to_string(rc.chains.size()) + " chains").c_str());
  if (!a.save.empty()) std::printf("saved:   %s\n", a.save.c_str());
  return vf.found && control_clean ? kExitOk : kExitFindings;
}

int run_all(const DemoArgs& a, const Plan& plan) {
  nlohmann::json all = nlohmann::json::array();
  bool ok = true;
  if (!a.json)
    std::printf("%-16s %-16s %-8s %-8s %s\n", "SCENARIO", "CATEGORY", "FAULT", "CONTROL", "WHAT THE ANALYSIS SAID");
  for (const auto& info : synth::all_scenarios()) {
    const synth::SynthTrace fault = synth::make_scenario(info.id, true, a.seed);
    const AnalysisResult rf = analyse(fault, plan, a.threads);
    const AnalysisResult rc = analyse(synth::make_scenario(info.id, false, a.seed), plan, a.threads);
    const Verdict v = judge(fault, rf);
    ok = ok && v.found && rc.chains.empty();
    if (a.json) {
      all.push_back({{"scenario", info.name},
                     {"expected_category", info.category},
                     {"found", v.found},
                     {"fault_chains", rf.chains.size()},
                     {"control_chains", rc.chains.size()},
                     {"summary", v.found ? v.matching.front()->summary : ""},
                     {"injected", info.cause}});
      continue;
    }
    std::printf("%-16s %-16s %-8s %-8s %s\n", std::string(info.name).c_str(), std::string(info.category).c_str(),
                v.found ? "found" : "MISSED", rc.chains.empty() ? "clean" : "NOISY",
                v.found ? v.matching.front()->summary.c_str() : "-");
  }
  if (a.json) {
    std::cout << all.dump(2) << "\n";
    return ok ? kExitOk : kExitFindings;
  }
  std::printf("\nWhat each scenario injected:\n");
  for (const auto& info : synth::all_scenarios())
    std::printf("  %-16s %s\n  %-16s fix: %s\n", std::string(info.name).c_str(), std::string(info.cause).c_str(), "",
                std::string(info.fix).c_str());
  std::printf("\n%s\nRun one with its full report: ingero-pipeline demo cpu_contention\n",
              ok ? "Every injected cause was found with the right category, and every control is clean."
                 : "Some scenarios were missed or their controls were not clean (see above).");
  return ok ? kExitOk : kExitFindings;
}

int run_demo(const DemoArgs& a) {
  if (a.list) return list_scenarios();
  AnalysisSpec spec;
  spec.builtin = a.builtin;
  AnalysisPlan ap;
  std::string errors;
  if (!build_analysis(spec, ap, errors)) {
    std::fputs(errors.c_str(), stderr);
    return kExitInput;
  }
  if (a.scenario == "large") return run_large(a, ap.plan);
  if (a.scenario.empty() || a.scenario == "all") {
    if (!a.save.empty()) {
      print_error("--save needs one scenario (e.g. `demo cpu_contention --save t.db`)");
      return kExitUsage;
    }
    return run_all(a, ap.plan);
  }
  const auto* info = synth::find_scenario(a.scenario);
  if (!info) {
    std::string names;
    for (const auto& s : synth::all_scenarios()) names += (names.empty() ? "" : ", ") + std::string(s.name);
    print_error("unknown scenario '" + a.scenario + "' (scenarios: " + names + ", large)");
    return kExitUsage;
  }
  return run_one(a, *info, ap.plan);
}

Registrar reg{"demo", 80, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<DemoArgs>();
                auto* cmd = app.add_subcommand(
                    "demo",
                    "Synthetic traces with a known, injected cause - a CPU hog preempting the launching\n"
                    "thread, DataLoader starvation, checkpoint block I/O, TCP retransmits, allocator latency\n"
                    "climbing, a throughput drop, a straggling rank - analysed like a recorded trace and\n"
                    "explained at the end, with a control run of the same workload without the fault.\n"
                    "No GPU or root needed.\n"
                    "Examples:\n"
                    "  ingero-pipeline demo                      # every scenario, found / control clean\n"
                    "  ingero-pipeline demo cpu_contention       # one, with its full report\n"
                    "  ingero-pipeline demo straggler --control  # the same workload without the fault\n"
                    "  ingero-pipeline demo tcp_retransmit --save tcp.db\n"
                    "  ingero-pipeline demo large --events 20000000 --save big.lmdb");
                cmd->add_option("scenario", args->scenario, "Scenario name (demo --list), 'large', or none for all");
                cmd->add_flag("--list", args->list, "List the scenarios");
                cmd->add_flag("--control", args->control, "Analyse the control (no fault) instead");
                cmd->add_flag("--json", args->json, "Machine-readable output");
                cmd->add_option("--save", args->save, "Write the trace and its chains (.db = SQLite, .lmdb = LMDB)");
                cmd->add_option("--seed", args->seed, "Random seed of the generator (same seed, same trace)");
                cmd->add_option("--events", args->events, "Events of the 'large' scenario");
                cmd->add_option("--threads", args->threads, "Engine threads")->check(CLI::Range(1u, 256u));
                cmd->add_flag("--builtin", args->builtin, "Built-in plans instead of the rule pack");
                cmd->add_flag("-v,--verbose", args->verbose, "Print every computed value of each chain");
                cmd->callback([args, &rc] { rc = run_demo(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
