// `ingero-pipeline export --format perfetto`: a trace and its causal chains as a Perfetto /
// chrome://tracing timeline (sinks/report/perfetto.h).
//
// Two passes over the trace, both streaming: the first runs the default analyses (the chains and
// their exemplar events) and counts what the filters keep, so a filter that keeps nothing or an
// output too large for the viewers is refused before anything is written; the second writes the
// events, with flow arrows from each chain to its exemplars as they go by. The file appears at
// its path only when complete (PerfettoWriter writes a temporary file and renames it).
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "model/result_json.h"
#include "operators/chain_annotate.h"
#include "operators/incidents.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "sinks/report/perfetto.h"

namespace ingero::cli {
namespace {

// A rough size of one exported event, used only to refuse up front an export that would be far
// too large (the writer also stops at the limit itself). Measured: 166 bytes on the 5M-event
// synthetic trace, 205 on the sample trace (stacks in args).
constexpr uint64_t kBytesPerEvent = 200;

struct ExportArgs {
  std::string format = "perfetto";
  std::vector<std::string> dbs;
  std::string out;
  std::string from, to, max_size = "1GiB", counter_window = "1s";
  std::vector<uint32_t> pids;
  std::vector<std::string> ops;
  bool no_chains = false;
  bool quiet = false;
  unsigned threads = 1;
  std::vector<std::string> rules, params;  // the chains' analysis, as explain's --rules/--param
  bool no_default_rules = false;
};

struct Opened {
  std::vector<std::unique_ptr<EventSource>> parts;
  std::unique_ptr<MergeSource> merged;
  EventSource* src = nullptr;
};

bool open_all(const std::vector<std::string>& dbs, Opened& o, std::string& error) {
  const std::vector<std::string> paths = dbs.empty() ? std::vector<std::string>{""} : dbs;
  for (const auto& p : paths) {
    auto s = open_any_trace(p, error);
    if (!s) return false;
    o.parts.push_back(std::move(s));
  }
  if (o.parts.size() == 1) {
    o.src = o.parts[0].get();
  } else {
    std::vector<EventSource*> in;
    for (auto& p : o.parts) in.push_back(p.get());
    o.merged = std::make_unique<MergeSource>(in);
    o.src = o.merged.get();
  }
  return true;
}

std::string secs_text(uint64_t s) { return std::to_string(s) + "s"; }

// What the first pass learns about the events the filters keep.
struct Census {
  bool started = false;
  uint64_t start = 0, last = 0;
  uint64_t total = 0, kept = 0;
  std::vector<uint64_t> per_second;      // kept by pid/op filters, by second since start
  std::map<uint32_t, uint64_t> per_pid;  // kept by time/op filters
};

// The filters' description, for messages.
std::string filter_text(const ExportArgs& a) {
  std::string t;
  if (!a.from.empty()) t += " --from " + a.from;
  if (!a.to.empty()) t += " --to " + a.to;
  for (auto p : a.pids) t += " --pid " + std::to_string(p);
  for (const auto& o : a.ops) t += " --op " + o;
  return t.empty() ? "(no filter)" : t.substr(1);
}

// Filters that would keep at most `budget` events: the longest time range and the largest process.
std::string fitting_filters(const Census& c, uint64_t budget, const TraceMeta& meta) {
  std::string hint;
  size_t best_lo = 0, best_len = 0;
  uint64_t sum = 0, best_sum = 0;
  for (size_t lo = 0, hi = 0; hi < c.per_second.size(); ++hi) {
    sum += c.per_second[hi];
    while (sum > budget && lo <= hi) sum -= c.per_second[lo++];
    if (hi + 1 - lo > best_len) {
      best_len = hi + 1 - lo;
      best_lo = lo;
      best_sum = sum;
    }
  }
  if (best_len > 0)
    hint += "--from " + secs_text(best_lo) + " --to " + secs_text(best_lo + best_len) + " (" +
            std::to_string(best_sum) + " events)";
  uint32_t best_pid = 0;
  uint64_t best_n = 0;
  for (const auto& [pid, n] : c.per_pid)
    if (n <= budget && n > best_n) {
      best_n = n;
      best_pid = pid;
    }
  if (best_n > 0)
    hint += std::string(hint.empty() ? "" : ", or ") + "--pid " + std::to_string(best_pid) + " (" +
            process_label(meta, best_pid) + ", " + std::to_string(best_n) + " events)";
  return hint.empty() ? "narrow it with --from/--to (offsets from the trace start), --pid or --op"
                      : "this would fit: " + hint;
}

int run_export(const ExportArgs& a) {
  use_one_malloc_arena();
  if (a.format != "perfetto") {
    print_error("unknown --format '" + a.format + "' (supported: perfetto)");
    return kExitUsage;
  }
  AnalysisSpec spec;
  spec.use_default = !a.no_default_rules;
  spec.rule_files = a.rules;
  if (std::string error; !parse_param_overrides(a.params, spec.params, error)) {
    print_error(error);
    return kExitUsage;
  }
  if (a.no_chains && (!a.rules.empty() || !a.params.empty() || a.no_default_rules)) {
    print_error("--rules/--param/--no-default-rules choose the chains' analysis; --no-chains runs none");
    return kExitUsage;
  }
  PerfettoOptions po;
  uint64_t from_off = 0, to_off = UINT64_MAX, max_size = 0;
  if (!a.from.empty() && !parse_duration(a.from, from_off)) {
    print_error("--from: '" + a.from + "' is not a duration from the trace start (e.g. 10s, 1500ms)");
    return kExitUsage;
  }
  if (!a.to.empty() && !parse_duration(a.to, to_off)) {
    print_error("--to: '" + a.to + "' is not a duration from the trace start (e.g. 20s)");
    return kExitUsage;
  }
  if (to_off <= from_off) {
    print_error("--to must be after --from");
    return kExitUsage;
  }
  if (!parse_size(a.max_size, max_size)) {
    print_error("--max-size: '" + a.max_size + "' is not a size (e.g. 1GiB, 500MB; 0 = no limit)");
    return kExitUsage;
  }
  if (!parse_duration(a.counter_window, po.counter_window_ns) || po.counter_window_ns == 0) {
    print_error("--counter-window: '" + a.counter_window + "' is not a positive duration (e.g. 1s)");
    return kExitUsage;
  }
  for (auto p : a.pids) po.filter.pids.insert(p);
  for (const auto& name : a.ops) {
    const OpInfo* info = find_op(name);
    if (!info) {
      print_error("--op: unknown operation '" + name +
                  "' (names as `ingero-pipeline stats` prints them, e.g. "
                  "cudaLaunchKernel, sched_switch, block_read)");
      return kExitUsage;
    }
    po.filter.ops.insert({info->source, info->op});
  }

  // The output first: an unwritable path fails before a long first pass.
  std::string error;
  auto writer = PerfettoWriter::create(a.out, po, error);
  if (!writer) {
    print_error(error);
    return kExitInput;
  }

  const auto t0 = std::chrono::steady_clock::now();
  // Pass 1: chains and the census of what the filters keep.
  Opened in1;
  if (!open_all(a.dbs, in1, error)) {
    print_error(error);
    return kExitInput;
  }
  Census census;
  PerfettoFilter time_only;  // filled when the start is known
  auto tally = [&](const Batch& b, const TraceMeta&) {
    for (const auto& e : b.events) {
      if (!census.started) {
        census.started = true;
        census.start = e.ts_ns;
        po.filter.from_ns = from_off == 0 ? 0 : e.ts_ns + from_off;
        po.filter.to_ns = to_off == UINT64_MAX ? UINT64_MAX : e.ts_ns + to_off;
      }
      ++census.total;
      census.last = std::max(census.last, e.ts_ns);
      const bool in_time = e.ts_ns >= po.filter.from_ns && e.ts_ns < po.filter.to_ns;
      const bool in_pid = po.filter.pids.empty() || po.filter.pids.count(e.pid);
      const bool in_op = po.filter.ops.empty() || po.filter.ops.count({e.source, e.op});
      if (in_pid && in_op) {
        const uint64_t sec = e.ts_ns >= census.start ? (e.ts_ns - census.start) / 1'000'000'000ull : 0;
        if (sec < (uint64_t{1} << 24)) {  // bounded: 194 days of seconds
          if (census.per_second.size() <= sec) census.per_second.resize(sec + 1, 0);
          ++census.per_second[sec];
        }
      }
      if (in_time && in_op) ++census.per_pid[e.pid];
      if (in_time && in_pid && in_op) ++census.kept;
    }
  };
  TapSource tap(*in1.src, tally);
  // Where each main GPU-feeding thread's time went, second by second: its counter track
  // (docs/accounting.md), and each chain's accounting in its args.
  AccountingOptions acct_opts;
  acct_opts.chain_accounting = true;
  acct_opts.meta = &tap.meta();
  TimeAccounting accounting(acct_opts);
  StepInference steps;  // with the GPUs each process drives: severity and incidents, as `explain`
  GpuUsage gpus;
  ObservingSource observed(tap, {&accounting, &steps, &gpus});
  AnalysisResult result;
  if (!a.no_chains) {
    AnalysisPlan analysis;
    if (!build_analysis(spec, analysis, error)) {
      print_error(error);
      return kExitInput;
    }
    EngineOptions eo;
    eo.threads = a.threads;
    eo.join_resident_bytes = replay_join_resident_bytes();
    // As `explain`: chains annotated as the engine emits them, with bounded memory; warm-up and
    // the tail re-judgement follow the pack's params and --param.
    LiveChainAnnotator annotator(annotate_options(analysis, LiveChainAnnotator::replay_defaults()));
    EventSource& annotated = annotator.tap(observed);
    eo.on_chain = [&annotator](const Chain& c) { annotator.annotate(c); };
    std::vector<std::string> errors;
    result = run_plan(analysis.plan, annotated, eo, &errors);
    if (!errors.empty()) {
      for (const auto& e : errors) print_error("plan: " + e);
      return kExitInput;
    }
    annotator.finish(result);  // first: chains get their threads, then their accounting
  } else {
    Batch b;
    while (observed.next(b)) {
    }
    result.meta = tap.meta();
  }
  observed.finish(result);
  // The chains' severity decided as `explain` decides it (operators/severity.h); the incidents are
  // assembled with it but not drawn (the chains are).
  if (!a.no_chains) assemble_incidents(result, {}, &gpus);
  add_accounting_series(accounting, result);
  const bool filtered = !a.from.empty() || !a.to.empty() || !a.pids.empty() || !a.ops.empty();
  if (filtered && census.kept == 0) {
    std::string pids;
    size_t shown = 0;
    for (const auto& [pid, n] : census.per_pid) {
      (void)n;
      if (shown++ == 8) {
        pids += ", ...";
        break;
      }
      pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
    }
    print_error("no event matches " + filter_text(a) + "; the trace has " + std::to_string(census.total) +
                " events over " +
                secs_text((census.last - census.start) / 1'000'000'000ull + (census.started ? 1 : 0)) +
                (pids.empty() ? std::string() : " (processes in range: " + pids + ")") + "; nothing was written");
    return kExitInput;
  }
  if (max_size && census.kept * kBytesPerEvent > max_size) {
    print_error("the export would be about " + std::to_string(census.kept * kBytesPerEvent >> 20) + " MiB (" +
                std::to_string(census.kept) + " events), more than --max-size " + a.max_size +
                " (ui.perfetto.dev and chrome://tracing struggle beyond ~1 GB of JSON); " +
                fitting_filters(census, max_size / kBytesPerEvent, result.meta) + "; nothing was written");
    return kExitUsage;
  }

  // Pass 2: the events, then the chains. The first pass's source is closed first, so two
  // readers never hold their buffers at once.
  const TraceMeta meta1 = result.meta;
  in1.merged.reset();
  in1.parts.clear();
  in1.src = nullptr;
  Opened in2;
  if (!open_all(a.dbs, in2, error)) {
    print_error(error);
    return kExitInput;
  }
  // Times are written relative to a whole second at or before the first event and every chain.
  uint64_t first = census.started ? census.start : UINT64_MAX;
  for (const auto& c : result.chains)
    if (po.filter.matches(c)) first = std::min(first, c.window_start);
  po.base_ns = first == UINT64_MAX ? 0 : first - first % 1'000'000'000ull;
  po.max_bytes = max_size;
  po.max_bytes_hint = fitting_filters(census, max_size / kBytesPerEvent / 2, meta1);
  writer->abort();  // reopen with the resolved time filter and base
  writer = PerfettoWriter::create(a.out, po, error);
  if (!writer) {
    print_error(error);
    return kExitInput;
  }
  if (!a.no_chains) writer->set_chains(result.chains);
  writer->set_accounting(std::move(result.accounting_series));
  Batch b;
  while (in2.src->next(b)) {
    writer->write_batch(b, in2.src->meta());
    if (!writer->ok()) break;
  }
  const TraceMeta& meta = in2.src->meta();
  if (!writer->finish(nullptr, meta, error)) {
    print_error(error + "; nothing was written");
    return error.find("would exceed") != std::string::npos ? kExitUsage : kExitRuntime;
  }
  const auto& c = writer->counters();
  if (!a.quiet) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "export: %llu events (%llu slices, %llu instants), %llu chains with %llu flow arrows, %llu counter "
                 "samples -> %s (%.1f MiB of JSON) in %.2f s, peak RSS %.0f MiB\n",
                 static_cast<unsigned long long>(c.events), static_cast<unsigned long long>(c.slices),
                 static_cast<unsigned long long>(c.instants), static_cast<unsigned long long>(c.chains),
                 static_cast<unsigned long long>(c.flows), static_cast<unsigned long long>(c.counter_samples),
                 a.out.c_str(), static_cast<double>(c.bytes) / (1 << 20), secs,
                 static_cast<double>(peak_rss_bytes()) / (1 << 20));
    if (c.missing_exemplars)
      std::fprintf(stderr, "export: %llu exemplar event(s) of the chains are outside the filter: no arrow drawn\n",
                   static_cast<unsigned long long>(c.missing_exemplars));
    if (c.overlap_lanes || c.lanes_exhausted)
      std::fprintf(stderr,
                   "export: %llu slice(s) overlapped without nesting and went to \"(overlap k)\" tracks; %llu placed "
                   "on the last one anyway\n",
                   static_cast<unsigned long long>(c.overlap_lanes),
                   static_cast<unsigned long long>(c.lanes_exhausted));
    std::fprintf(stderr, "open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)\n");
  }
  // The first pass read every input whole (the second reads them again, in the same order).
  return input_damage_status(meta1);
}

Registrar reg{
    "export", 25, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<ExportArgs>();
      auto* cmd = app.add_subcommand(
          "export",
          "Write a trace as a timeline for ui.perfetto.dev / chrome://tracing (trace-event JSON):\n"
          "a track per process and thread (CUDA/driver/NCCL calls, off-CPU spans with their state\n"
          "and the task that ran instead, block and socket I/O), instants (fork/exec/exit, TCP\n"
          "retransmits), counters (calls/s and p99 per op, host memory), and every causal chain\n"
          "as a slice on the \"ingero chains\" track with flow arrows to its evidence events.\n"
          "Examples:\n"
          "  ingero-pipeline export --format perfetto --db trace.db -o trace.json\n"
          "  ingero-pipeline export --db trace.db -o trace.json.gz --from 10s --to 20s --pid 4242\n"
          "  ingero-pipeline export --db a.db --db b.db -o merged.json     # nodes as process groups");
      cmd->add_option("--format", args->format, "Output format (perfetto)")->capture_default_str();
      cmd->add_option("--db", args->dbs,
                      "Trace (Ingero SQLite, ours, or an LMDB log); repeat to merge; default: the embedded sample");
      cmd->add_option("-o,--output", args->out, "Output file: .json, or .json.gz (gzip)")->required();
      cmd->add_option("--from", args->from, "Keep events starting at or after this offset from the trace start (10s)");
      cmd->add_option("--to", args->to, "Keep events starting before this offset from the trace start (20s)");
      cmd->add_option("--pid", args->pids, "Keep these processes only (repeatable)");
      cmd->add_option("--op", args->ops, "Keep these operations only (repeatable; cudaLaunchKernel, sched_switch)");
      cmd->add_option("--max-size", args->max_size, "Refuse an output larger than this much JSON (0 = no limit)")
          ->capture_default_str();
      cmd->add_option("--counter-window", args->counter_window,
                      "Window of the calls/s, p99 and time (accounting) counters")
          ->capture_default_str();
      cmd->add_flag("--no-chains", args->no_chains, "Do not run the analyses (events only, one pass)");
      cmd->add_option("--rules", args->rules, "Rule files whose chains to draw (in addition to the default pack)");
      cmd->add_flag("--no-default-rules", args->no_default_rules, "Draw only the --rules files' chains");
      add_param_option(cmd, &args->params);
      cmd->add_option("--threads", args->threads, "Engine threads (results do not depend on it)")
          ->check(CLI::Range(1u, 256u));
      cmd->add_flag("-q,--quiet", args->quiet, "No summary on stderr");
      cmd->callback([args, &rc] { rc = run_export(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
