// `ingero-pipeline run --config FILE`: runs a pipeline graph (cli/config.h): sources (live eBPF,
// SQLite/LMDB replay, synthetic) -> the analysis (rule pack, built-in plans, rule files, with
// parameter overrides) -> sinks (SQLite, LMDB, MCP, JSON lines, text report).
//
// Order of things: the whole config is validated and every rule file compiled before any source
// is opened or any file written; `--dry-run` stops there and prints the resolved graph. Sources
// that feed the analysis are merged by timestamp; sources that only feed sinks are drained after
// it. Events reach their sinks as they stream past (a tap before the merge); chains go to sinks
// when the analysis ends, or as they are found when a live source is in the graph. An `mcp` sink
// writes a SQLite database and then serves it over MCP on stdio until stdin closes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/metrics_cli.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/result_json.h"
#include "model/synth.h"
#include "operators/chain_annotate.h"
#include "operators/incidents.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "sinks/report/perfetto.h"
#include "sinks/report/text_report.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/spooling_writer.h"
#include "sinks/store/sqlite_store.h"

#ifdef INGERO_HAVE_IP_BPF
#include "bpf/live_source.h"
#endif
#ifdef INGERO_HAVE_IP_MCP
#include "sinks/mcp/server.h"
#include "sinks/mcp/transport.h"
#endif

namespace ingero::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

struct RunArgs {
  std::string config;
  bool dry_run = false, print_default = false, quiet = false;
  MetricsCliArgs metrics;  // --metrics-addr and friends (cli/metrics_cli.h)
  CostArgs cost;           // --gpus, --gpu-hour-price, --rates (operators/incidents.h)
};

struct SinkRt {
  const SinkConfig* cfg = nullptr;
  // sqlite and mcp: the database is written on its own thread (sinks/store/spooling_writer.h), so a
  // live source never waits for SQLite.
  std::unique_ptr<SpoolingWriter> sqlite;
  std::unique_ptr<LmdbSink> lmdb;
  std::unique_ptr<PerfettoWriter> perfetto;  // trace-event JSON, renamed into place at the end
  FILE* out = nullptr;                       // jsonl
  bool owns_out = false;
  bool takes_chains = false;
  bool meta_written = false;
  bool failed = false;
  std::string error;

  bool takes_events_from(const std::string& source) const {
    for (const auto& e : cfg->from)
      if (e.node == source) return true;
    return false;
  }
  void fail(const std::string& what) {
    if (!failed) error = cfg->name + ": " + what;
    failed = true;
  }
};

struct SourceRt {
  const SourceConfig* cfg = nullptr;
  std::unique_ptr<EventSource> src;
  std::unique_ptr<TapSource> tap;
  bool live = false;
  std::function<void()> stop;  // live sources: ask for the final batch
};

std::unique_ptr<EventSource> open_source(const SourceConfig& s, const EngineSettings& e, SourceRt& rt,
                                         std::string& error) {
  switch (s.kind) {
    case SourceKind::kSqlite:
      if (s.path != "<embedded-sample>" && is_lmdb_file(s.path)) {
        error = s.path + ": is an LMDB trace; declare the source with `type: lmdb`";
        return nullptr;
      }
      return open_trace(s.path == "<embedded-sample>" ? "" : s.path, error, e.batch_size);
    case SourceKind::kLmdb: {
      LmdbReadOptions o;
      o.batch_size = e.batch_size;
      return open_lmdb_trace(s.path, error, o);
    }
    case SourceKind::kSynthetic: {
      if (s.scenario == "large") return std::make_unique<synth::LargeTraceSource>(s.events, s.seed, e.batch_size);
      const auto* info = synth::find_scenario(s.scenario);
      if (!info) {
        error = "unknown scenario " + s.scenario;
        return nullptr;
      }
      auto t = synth::make_scenario(info->id, s.fault, s.seed);
      return std::make_unique<VectorSource>(std::move(t.events), e.batch_size, std::move(t.meta));
    }
    case SourceKind::kEbpf: {
#ifdef INGERO_HAVE_IP_BPF
      bpf::LiveOptions o;
      if (!s.probes.empty()) {
        auto& f = o.probes.families;
        f = bpf::ProbeFamilies{false, false, false, false, false, false, false, false, false, false, false};
        for (const auto& p : s.probes) {
          if (p == "cuda") f.cuda = true;
          else if (p == "driver") f.driver = true;
          else if (p == "graph") f.graph = true;
          else if (p == "nccl") f.nccl = true;
          else if (p == "sched") f.sched = true;
          else if (p == "wakeup") f.wakeup = true;
          else if (p == "process") f.process = true;
          else if (p == "memory") f.memory = true;
          else if (p == "block") f.block = true;
          else if (p == "tcp") f.tcp = true;
          else if (p == "net") f.net = true;
        }
      }
      if (!s.pids.empty()) {
        o.probes.filter = bpf::FilterMode::kPids;
        o.probes.pids = s.pids;
      } else if (!s.cgroup.empty()) {
        o.probes.filter = bpf::FilterMode::kCgroup;
        o.probes.cgroup_path = s.cgroup;
      }
      keep_large_buffers_out_of_the_heap();
      auto live = bpf::LiveSource::start(o, error);
      if (!live) return nullptr;
      rt.live = true;
      auto* raw = live.get();
      rt.stop = [raw] { raw->stop(); };
      return live;
#else
      (void)rt;
      error = "source `" + s.name + "`: this build has no eBPF support (configure with -DINGERO_BUILD_BPF=ON)";
      return nullptr;
#endif
    }
  }
  error = "unknown source kind";
  return nullptr;
}

bool open_sink(SinkRt& s, std::string& error) {
  const SinkConfig& c = *s.cfg;
  for (const auto& e : c.from) s.takes_chains = s.takes_chains || e.node == "analysis";
  switch (c.kind) {
    case SinkKind::kSqlite:
    case SinkKind::kMcp:
      if (auto sink = SqliteSink::create(c.path, error)) {
        SpoolingWriter::Options o;
        o.memory_cap_bytes = size_t{4} << 20;
        s.sqlite = SpoolingWriter::start(std::move(sink), o, error);
      }
      return s.sqlite != nullptr;
    case SinkKind::kLmdb: {
      LmdbSink::Options o;
      o.max_bytes = c.max_bytes;
      o.durable = c.durable;
      s.lmdb = LmdbSink::create(c.path, error, o);
      return s.lmdb != nullptr;
    }
    case SinkKind::kJsonl:
      if (c.path == "-") {
        s.out = stdout;
      } else {
        s.out = std::fopen(c.path.c_str(), "w");
        s.owns_out = true;
        if (!s.out) {
          error = c.path + ": cannot open for writing";
          return false;
        }
      }
      return true;
    case SinkKind::kReport: return true;  // written when the analysis ends
    case SinkKind::kPerfetto:
      s.perfetto = PerfettoWriter::create(c.path, PerfettoOptions{}, error);
      return s.perfetto != nullptr;
  }
  return false;
}

void write_events(SinkRt& s, const Batch& b, const TraceMeta& meta) {
  if (s.failed) return;
  if (s.sqlite) {
    if (!s.meta_written) {
      s.sqlite->write_meta(meta);
      s.meta_written = true;
    }
    s.sqlite->write_events(b.events);
  } else if (s.lmdb) {
    if (!s.meta_written) s.meta_written = s.lmdb->write_meta(meta);
    if (!s.lmdb->write_events(b.events)) s.fail(s.lmdb->error());
  } else if (s.out) {
    for (const auto& e : b.events) std::fprintf(s.out, "%s\n", event_json_line(e, meta).c_str());
  } else if (s.perfetto) {
    s.perfetto->write_batch(b, meta);
  }
}

int run_pipeline(const RunArgs& a) {
  if (a.print_default) {
    std::fputs(kDefaultConfigText, stdout);
    return kExitOk;
  }
  IncidentOptions incident_opts;
  if (const int rc = incident_options(a.cost, incident_opts); rc != kExitOk) return rc;
  PipelineConfig cfg;
  std::vector<ConfigDiagnostic> diags;
  const bool ok = a.config.empty() ? parse_config(kDefaultConfigText, "<embedded>", cfg, diags)
                                   : load_config(a.config, cfg, diags);
  if (!ok) {
    std::fputs(render_diagnostics(diags).c_str(), stderr);
    std::fprintf(stderr, "%zu error%s in %s; nothing was started\n", diags.size(), diags.size() == 1 ? "" : "s",
                 a.config.empty() ? "the embedded config" : a.config.c_str());
    return kExitInput;
  }
  AnalysisPlan ap;
  if (cfg.analysis.enabled) {
    AnalysisSpec spec;
    spec.use_default = false;
    for (const auto& r : cfg.analysis.rules) {
      if (r.builtin) {
        spec.use_default = true;
        spec.builtin = spec.builtin || r.name == "builtin";
      } else {
        spec.rule_files.push_back(r.name);
      }
    }
    spec.options.window_ns = cfg.analysis.window_ns;
    spec.options.min_calls = cfg.analysis.min_calls;
    spec.options.min_tail_ratio = cfg.analysis.min_tail_ratio;
    spec.options.min_share = cfg.analysis.min_share;
    spec.params = cfg.analysis.params;
    std::string errors;
    if (!build_analysis(spec, ap, errors)) {
      std::fputs(errors.c_str(), stderr);
      std::fprintf(stderr, "the analysis of %s does not compile; nothing was started\n",
                   a.config.empty() ? "the embedded config" : a.config.c_str());
      return kExitInput;
    }
  }
  if (a.dry_run) {
    std::fputs(describe_config(cfg).c_str(), stdout);
    if (cfg.analysis.enabled) {
      std::printf("plan %s, %zu nodes", ap.description.c_str(), ap.plan.nodes.size());
      if (!ap.rule_plans.empty()) {
        std::printf(", rules:");
        for (const auto& [name, p] : ap.rule_plans) std::printf(" %s", name.c_str());
      }
      std::printf("\n");
    }
    return kExitOk;
  }

  // Sinks first: a file we cannot create should stop us before a live capture starts.
  std::vector<SinkRt> sinks(cfg.sinks.size());
  for (size_t i = 0; i < cfg.sinks.size(); ++i) {
    sinks[i].cfg = &cfg.sinks[i];
    std::string error;
    if (!open_sink(sinks[i], error)) {
      print_error("sink `" + cfg.sinks[i].name + "`: " + error);
      return kExitInput;
    }
  }
  MetricsHook metrics;
  if (std::string error; !metrics.start(a.metrics, error, &g_interrupted)) {
    print_error(error);
    return kExitUsage;
  }
  if (std::none_of(cfg.sources.begin(), cfg.sources.end(),
                   [](const SourceConfig& s) { return s.kind == SourceKind::kEbpf; }))
    use_one_malloc_arena();  // replay only (cli/common.h)
  std::vector<SourceRt> sources(cfg.sources.size());
  for (size_t i = 0; i < cfg.sources.size(); ++i) {
    SourceRt& rt = sources[i];
    rt.cfg = &cfg.sources[i];
    std::string error;
    rt.src = open_source(cfg.sources[i], cfg.engine, rt, error);
    if (!rt.src) {
      print_error("source `" + cfg.sources[i].name + "`: " + error);
      return rt.cfg->kind == SourceKind::kEbpf ? kExitRuntime : kExitInput;
    }
    std::vector<SinkRt*> taps;
    for (auto& s : sinks)
      if (s.takes_events_from(rt.cfg->name)) taps.push_back(&s);
    rt.tap = std::make_unique<TapSource>(*rt.src,
                                         [taps, &metrics, live = rt.live](const Batch& b, const TraceMeta& meta) {
                                           metrics.observe(b, meta, live);
                                           for (auto* s : taps) write_events(*s, b, meta);
                                         });
  }

  // Live sources stop on Ctrl-C or after their duration.
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  std::atomic<bool> finished{false};
  std::thread watcher;
  bool any_live = false;
  for (const auto& s : sources) any_live = any_live || s.live;
  if (any_live) {
    watcher = std::thread([&sources, &finished] {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<bool> stopped(sources.size(), false);
      while (!finished.load()) {
        const auto elapsed = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
        for (size_t i = 0; i < sources.size(); ++i) {
          auto& s = sources[i];
          if (!s.live || stopped[i]) continue;
          if (g_interrupted.load() || (s.cfg->duration_ns && elapsed >= s.cfg->duration_ns)) {
            s.stop();
            stopped[i] = true;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    std::fprintf(stderr, "capturing; Ctrl-C stops and writes the results\n");
  }

  const auto t0 = std::chrono::steady_clock::now();
  AnalysisResult result;
  std::vector<bool> in_analysis(sources.size(), false);
  if (cfg.analysis.enabled) {
    std::vector<EventSource*> inputs;
    for (size_t i = 0; i < sources.size(); ++i) {
      bool use = cfg.analysis.from.empty();
      for (const auto& e : cfg.analysis.from) use = use || e.node == sources[i].cfg->name;
      if (use) {
        inputs.push_back(sources[i].tap.get());
        in_analysis[i] = true;
      }
    }
    MergeSource merged(inputs);
    EventSource& input = inputs.size() == 1 ? *inputs[0] : static_cast<EventSource&>(merged);
    EngineOptions eo;
    eo.threads = cfg.engine.threads;
    if (!any_live) eo.join_resident_bytes = replay_join_resident_bytes();
    // Threads, stacks, time split and launch_gap chains (operators/chain_annotate.h), each chain
    // annotated as the engine emits it, over a bounded horizon (live: 15 s; replay: at least 2M
    // events).
    LiveChainAnnotator annotator(
        annotate_options(ap, any_live ? LiveChainAnnotator::defaults() : LiveChainAnnotator::replay_defaults()));
    // As `explain`: where each feeding thread's time went (and each chain's thread over its
    // window), the steps, and the GPUs each process drives, for severity and incidents.
    AccountingOptions acct_opts;
    acct_opts.chain_accounting = true;
    acct_opts.meta = &input.meta();
    TimeAccounting accounting(acct_opts);
    StepInference steps;
    GpuUsage gpus;
    ObservingSource observed(input, {&accounting, &steps, &gpus});
    EventSource& annotated = annotator.tap(observed);
    eo.on_chain = [&annotator](const Chain& c) { annotator.annotate(c); };
    if (any_live) {
      // Live: chains reach JSON-lines sinks as they are found.
      std::vector<SinkRt*> streaming;
      for (auto& s : sinks)
        if (s.takes_chains && s.out) streaming.push_back(&s);
      eo.on_chain = [streaming, &input, &annotator](const Chain& c) {
        if (streaming.empty()) return;
        const Chain a = annotator.annotate(c);
        for (auto* s : streaming) {
          std::fprintf(s->out, "%s\n", chain_json(a, input.meta()).dump().c_str());
          std::fflush(s->out);
        }
      };
    }
    eo.on_chain = metrics.wrap(std::move(eo.on_chain));
    std::vector<std::string> errs;
    result = run_plan(ap.plan, annotated, eo, &errs);
    if (!errs.empty()) {
      for (const auto& e : errs) print_error("plan: " + e);
      finished = true;
      if (watcher.joinable()) watcher.join();
      return kExitInput;
    }
    if (inputs.size() > 1) result.meta = merged.meta();
    annotator.finish(result);  // first: chains get their threads, then their accounting
    observed.finish(result);
    assemble_incidents(result, incident_opts, &gpus);  // severity, incidents, the verdict
    if (const std::string w = annotator_spill_warning(annotator.spill_counters()); !w.empty())
      std::fprintf(stderr, "warning: %s\n", w.c_str());
    if (const std::string w = join_spill_warning(result.counters); !w.empty())
      std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (in_analysis[i]) continue;
    Batch b;
    while (sources[i].tap->next(b)) {
    }
  }
  metrics.finish(result, g_interrupted);
  finished = true;
  if (watcher.joinable()) watcher.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int rc = kExitOk;
  for (auto& s : sinks) {
    std::string error;
    const TraceMeta& meta = result.meta;
    if (s.sqlite) {
      if (s.takes_chains) s.sqlite->write_meta(meta);
      const auto progress = [&](const std::string& m) {
        if (!a.quiet) std::fprintf(stderr, "%s: %s\n", s.cfg->name.c_str(), m.c_str());
      };
      if (!s.sqlite->finish(s.takes_chains ? &result : nullptr, error, progress)) s.fail(error);
    } else if (s.lmdb) {
      if (s.takes_chains && !s.lmdb->write_meta(meta)) s.fail(s.lmdb->error());
      if (s.takes_chains && !s.failed && !s.lmdb->write_result(result)) s.fail(s.lmdb->error());
      if (!s.lmdb->close(error)) s.fail(error);
    } else if (s.out) {
      if (s.takes_chains && !any_live)
        for (const auto& c : result.chains) std::fprintf(s.out, "%s\n", chain_json(c, meta).dump().c_str());
      if (s.owns_out) std::fclose(s.out);
      else std::fflush(s.out);
      s.out = nullptr;
    } else if (s.perfetto) {
      // Flow arrows need the chains' exemplar events, known only now: one replay source is read
      // again for them (live or merged sources: the chains are drawn without arrows).
      const std::vector<Chain> none;
      const std::vector<Chain>& chains = s.takes_chains ? result.chains : none;
      const SourceConfig* only = nullptr;
      size_t feeding = 0;
      for (const auto& src : cfg.sources)
        if (s.takes_events_from(src.name)) only = &src, ++feeding;
      if (!chains.empty() && feeding == 1 && only->kind != SourceKind::kEbpf) {
        SourceRt again_rt;
        if (auto again = open_source(*only, cfg.engine, again_rt, error)) s.perfetto->resolve_flows(chains, *again);
      }
      if (!s.perfetto->finish(&chains, meta, error)) s.fail(error);
    } else if (s.cfg->kind == SinkKind::kReport) {
      ReportOptions ro;
      ro.color = s.cfg->path == "-" && stdout_is_terminal();
      const std::string text = explain_text(result, ro);
      if (s.cfg->path == "-") {
        std::fputs(text.c_str(), stdout);
      } else if (FILE* f = std::fopen(s.cfg->path.c_str(), "w")) {
        std::fputs(text.c_str(), f);
        std::fclose(f);
      } else {
        s.fail(s.cfg->path + ": cannot open for writing");
      }
    }
    if (s.failed) {
      print_error("sink " + s.error);
      rc = kExitRuntime;
    }
  }
  if (!a.quiet) {
    uint64_t events = result.counters.events_in;
    std::fprintf(stderr, "run: %llu events through %s in %.2f s, %zu chains", static_cast<unsigned long long>(events),
                 cfg.analysis.enabled ? ap.description.c_str() : "no analysis", secs, result.chains.size());
    for (const auto& s : sinks)
      if (s.cfg->path != "-") std::fprintf(stderr, "; %s -> %s", s.cfg->name.c_str(), s.cfg->path.c_str());
    std::fprintf(stderr, "\n");
  }

  for (const auto& s : sinks) {
    if (s.cfg->kind != SinkKind::kMcp || s.failed) continue;
#ifdef INGERO_HAVE_IP_MCP
    mcp::ServerOptions so;
    so.db_path = s.cfg->path;
    so.plan = ap.plan;
    for (const auto& r : cfg.analysis.rules)
      if (!r.builtin) so.rule_files.push_back(r.name);
    so.engine_threads = cfg.engine.threads;
    so.incidents = incident_opts;
    mcp::Server server(std::move(so));
    std::fprintf(stderr, "serving %s over MCP on stdio (close stdin to stop)\n", s.cfg->path.c_str());
    return mcp::run_stdio(server, 0, 1) == 0 ? rc : kExitRuntime;
#else
    print_error("sink `" + s.cfg->name + "`: this build has no MCP server; " + s.cfg->path + " was written");
    return kExitRuntime;
#endif
  }
  return rc;
}

Registrar reg{"run", 50, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<RunArgs>();
                auto* cmd = app.add_subcommand(
                    "run",
                    "Run a pipeline graph from a YAML config: sources (live eBPF, SQLite/LMDB replay,\n"
                    "synthetic), the analysis (rule pack, rule files, parameter overrides) and sinks\n"
                    "(SQLite, LMDB, MCP, JSON lines, report). The config is validated in full, with\n"
                    "file:line:col errors, before anything starts. Without --config the embedded default\n"
                    "runs: the sample trace through the default analyses, report on stdout.\n"
                    "Examples:\n"
                    "  ingero-pipeline run --print-default > pipeline.yaml\n"
                    "  ingero-pipeline run --config pipeline.yaml --dry-run\n"
                    "  ingero-pipeline run --config pipeline.yaml\n"
                    "Reference: docs/pipeline.md");
                cmd->add_option("-c,--config", args->config, "Pipeline config (YAML)");
                cmd->add_flag("--dry-run", args->dry_run,
                              "Validate, compile the rules, print the resolved graph, stop");
                cmd->add_flag("--print-default", args->print_default, "Print the embedded default config");
                cmd->add_flag("-q,--quiet", args->quiet, "No summary line on stderr");
                add_metrics_options(cmd, args->metrics);
                add_cost_options(cmd, &args->cost);
                cmd->callback([args, &rc] { rc = run_pipeline(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
