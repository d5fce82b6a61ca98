#include "cli/pipeline_common.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "model/ops.h"
#include "sinks/store/lmdb_store.h"

#ifdef INGERO_HAVE_IP_RULES
#include "rules/pack.h"
#endif

namespace ingero::cli {

std::string trace_format_of(const std::string& path) { return is_lmdb_file(path) ? "lmdb" : "sqlite"; }

std::unique_ptr<EventSource> open_any_trace(const std::string& path, std::string& error, size_t batch_size) {
  if (!path.empty() && is_lmdb_file(path)) {
    LmdbReadOptions o;
    o.batch_size = batch_size;
    return open_lmdb_trace(path, error, o);
  }
  return open_trace(path, error, batch_size);
}

bool have_rule_compiler() {
#ifdef INGERO_HAVE_IP_RULES
  return true;
#else
  return false;
#endif
}

int prepare_analysis(const std::vector<std::string>& params, AnalysisSpec& spec, AnalysisPlan& out) {
  std::string error;
  if (!parse_param_overrides(params, spec.params, error)) {
    print_error(error);
    return kExitUsage;
  }
  if (!build_analysis(spec, out, error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return kExitInput;
  }
  return kExitOk;
}

bool build_analysis(const AnalysisSpec& spec, AnalysisPlan& out, std::string& errors) {
  out = AnalysisPlan{};
  const bool pack = spec.use_default && !spec.builtin && have_rule_compiler();
  if (!pack && spec.rule_files.empty()) {
    if (!spec.use_default) {
      errors = "no analysis: the default rules are off and no rule file was given\n";
      return false;
    }
    out.plan = default_plan(spec.options);
    out.description = "built-in analyses (engine/default_plans)";
    out.warmup_min_calls = spec.options.min_calls;
    out.warmup_tail_ratio = spec.options.min_tail_ratio;
    return true;
  }
#ifdef INGERO_HAVE_IP_RULES
  dsl::CompileOptions co;
  for (const auto& [k, v] : spec.params)
    if (k != "window") co.params[k] = v;  // the pack's windows are written in its rules
  rules::LoadResult lr = rules::load_rule_files(spec.rule_files, pack, co);
  if (!lr.ok()) {
    errors = dsl::render_diagnostics(lr.diagnostics);
    for (const auto& r : lr.rejected) errors += "rejected " + r + "\n";
    return false;
  }
  // Knobs the annotator applies beside the rules, read from the pack with the same overrides.
  for (const char* name : {"warmup", "min_calls", "min_tail_ratio"}) {
    rules::PackParam p;
    std::string err;
    if (!rules::pack_param(name, co.params, p, err)) {
      errors = err + "\n";
      return false;
    }
    const std::string n = name;
    if (n == "warmup" && p.value >= 0) out.warmup_ns = static_cast<uint64_t>(p.value);
    if (n == "min_calls" && p.value >= 1) out.warmup_min_calls = static_cast<uint64_t>(p.value);
    if (n == "min_tail_ratio" && p.value >= 1) out.warmup_tail_ratio = p.value;
    if (n == "warmup" && p.value < 0) {
      errors = "param `warmup` overridden with `" + p.text + "`: the warm-up cannot be negative (0s turns it off)\n";
      return false;
    }
  }
  out.plan = std::move(lr.plan);
  for (auto& r : lr.rules) out.rule_plans.emplace_back(r.name, std::move(r.plan));
  out.description = pack ? "rule pack (rules/*.rules, " + std::to_string(out.rule_plans.size()) + " rules)"
                         : std::to_string(out.rule_plans.size()) + " rules from files";
  if (!spec.rule_files.empty() && pack)
    out.description = "rule pack + " + std::to_string(spec.rule_files.size()) + " rule file(s), " +
                      std::to_string(out.rule_plans.size()) + " rules";
  if (spec.use_default && !pack) {
    out.plan.merge(default_plan(spec.options));
    out.description += " + built-in analyses";
  }
  return true;
#else
  errors = "rule files need the rule compiler, which this build does not have\n";
  return false;
#endif
}

AnnotateOptions annotate_options(const AnalysisPlan& a, AnnotateOptions base) {
  base.warmup_ns = a.warmup_ns;
  base.warmup_min_calls = a.warmup_min_calls;
  base.warmup_tail_ratio = a.warmup_tail_ratio;
  return base;
}

namespace {
// One line for a spill file's failures: a failed read loses what the block held (`loss`), a
// failed write only costs memory (its `what` stayed there).
std::string spill_warning(uint64_t read_errors, uint64_t write_errors, const std::string& file, const std::string& loss,
                          const std::string& what, const std::string& env) {
  if (read_errors > 0) return std::to_string(read_errors) + " read(s) of " + file + " failed: " + loss;
  if (write_errors > 0)
    return file + " in $TMPDIR (else /tmp) could not be written: " + what +
           " stayed in memory (set TMPDIR to a writable directory, or " + env + "=0 to keep them in memory)";
  return {};
}
}  // namespace

std::string annotator_spill_warning(const SpillCounters& c) {
  return spill_warning(c.read_errors, c.errors, "the chain annotator's spill file",
                       "some chains may lack their thread, stack and time split details", "its records",
                       "INGERO_ANNOTATE_RESIDENT_MB");
}

std::string join_spill_warning(const EngineCounters& k) {
  return spill_warning(k.join_spill_read_errors, k.join_spill_errors, "the join span spill file",
                       "those spans were left out of the joins, so some overlap figures may be low", "the spans",
                       "INGERO_JOIN_RESIDENT_MB");
}

uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

// --- MergeSource -------------------------------------------------------------------------------

MergeSource::MergeSource(std::vector<EventSource*> inputs) {
  for (auto* s : inputs) inputs_.push_back(Input{s, {}, 0, 0, false, {}});
  meta_.path = inputs.size() == 1 ? inputs[0]->meta().path : "<merged>";
  meta_.format = inputs.size() == 1 ? inputs[0]->meta().format : "merged";
  for (auto& in : inputs_) merge_meta(in);
}

void MergeSource::merge_meta(Input& in) {
  TraceMeta& m = in.src->meta();
  in.node_map.resize(m.nodes.size());
  for (size_t i = 0; i < m.nodes.size(); ++i) in.node_map[i] = meta_.node_index(m.nodes[i]);
  for (const auto& [pid, name] : m.process_names) meta_.process_names.emplace(pid, name);
  for (const auto& [id, st] : m.stacks) meta_.stacks.emplace(id, st);
  if (meta_.sessions.empty()) meta_.sessions = m.sessions;
}

void MergeSource::pull(Input& in) {
  Batch b;
  if (!in.src->next(b)) {
    in.done = true;
    return;
  }
  if (in.node_map.size() < in.src->meta().nodes.size()) merge_meta(in);
  if (in.pos > 0) {
    in.buf.erase(in.buf.begin(), in.buf.begin() + static_cast<std::ptrdiff_t>(in.pos));
    in.pos = 0;
  }
  for (auto& e : b.events) {
    if (e.node < in.node_map.size()) e.node = in.node_map[e.node];
    in.buf.push_back(e);
  }
  in.watermark = std::max(in.watermark, b.watermark);
  if (b.final) in.done = true;
}

bool MergeSource::next(Batch& out) {
  if (finished_) return false;
  out.events.clear();
  // Pull from the input that holds the merged watermark back, once per call.
  Input* lag = nullptr;
  for (auto& in : inputs_)
    if (!in.done && (!lag || in.watermark < lag->watermark)) lag = &in;
  if (lag) pull(*lag);
  uint64_t safe = std::numeric_limits<uint64_t>::max();
  bool all_done = true;
  for (auto& in : inputs_)
    if (!in.done) {
      safe = std::min(safe, in.watermark);
      all_done = false;
    }
  // k-way merge of what every input has buffered up to `safe`.
  for (;;) {
    Input* best = nullptr;
    for (auto& in : inputs_)
      if (in.pos < in.buf.size() && in.buf[in.pos].ts_ns <= safe &&
          (!best || in.buf[in.pos].ts_ns < best->buf[best->pos].ts_ns))
        best = &in;
    if (!best) break;
    out.events.push_back(best->buf[best->pos++]);
  }
  out.seq = seq_++;
  out.final = all_done;
  out.watermark = all_done ? std::numeric_limits<uint64_t>::max() : safe;
  if (all_done) {
    finished_ = true;
    for (auto& in : inputs_) {
      const TraceMeta& m = in.src->meta();
      meta_.health.rows_read += m.health.rows_read;
      meta_.health.rows_skipped += m.health.rows_skipped;
      meta_.health.dropped_events += m.health.dropped_events;
      for (const auto& [r, n] : m.health.reasons) meta_.health.reasons[r] += n;
      // Damage names its file: the merged meta's path is not the damaged one's.
      for (const auto& d : m.health.damage) meta_.health.damaged(m.path + ": " + d);
      for (const auto& r : m.health.recovered) meta_.health.recovered.push_back(m.path + ": " + r);
      meta_.health.rows_unreadable += m.health.rows_unreadable;
      if (m.first_ts && (!meta_.first_ts || m.first_ts < meta_.first_ts)) meta_.first_ts = m.first_ts;
      meta_.last_ts = std::max(meta_.last_ts, m.last_ts);
    }
  }
  return true;
}

std::string event_json_line(const Event& e, const TraceMeta& meta) {
  nlohmann::json j{{"id", e.id},
                   {"ts_ns", e.ts_ns},
                   {"dur_ns", e.dur_ns},
                   {"source", source_name(e.source)},
                   {"op", op_name(e.source, e.op)},
                   {"pid", e.pid},
                   {"tid", e.tid}};
  if (e.node && e.node < meta.nodes.size()) j["node"] = meta.nodes[e.node];
  if (e.rank >= 0) j["rank"] = e.rank;
  if (e.ret) j["ret"] = e.ret;
  if (e.arg0) j["arg0"] = e.arg0;
  if (e.arg1) j["arg1"] = e.arg1;
  if (e.stack_id) j["stack_id"] = e.stack_id;
  if (e.prev_state != OffCpuState::kUnknown) j["prev_state"] = static_cast<int>(e.prev_state);
  return j.dump();
}

void add_accounting_series(const TimeAccounting& accounting, AnalysisResult& r) {
  r.accounting_series.clear();
  for (const auto& a : r.accounting)
    if (auto s = accounting.series(a.node, a.tid)) r.accounting_series.push_back(std::move(*s));
}

void add_cost_options(CLI::App* cmd, CostArgs* args) {
  cmd->add_option("--gpus", args->gpus,
                  "GPUs each traced process drives, for the GPU-hours of an incident when the trace does not "
                  "name its devices (default 1)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--gpu-hour-price", args->price, "Price of one GPU-hour: incidents then state their cost")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--rates", args->rates,
                  "GPU-hour prices per node: lines \"NODE PRICE\", \"* PRICE\" for the rest, \"currency CODE\"");
}

int incident_options(const CostArgs& args, IncidentOptions& out) {
  out.gpus = args.gpus;
  out.rates.fallback = args.price;
  if (args.rates.empty()) return kExitOk;
  std::ifstream in(args.rates);
  if (!in) {
    print_error(args.rates + ": cannot read the rates file");
    return kExitInput;
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string error;
  const double fallback = out.rates.fallback;
  if (!parse_gpu_rates(text.str(), args.rates, out.rates, error)) {
    print_error(error);
    return kExitInput;
  }
  if (out.rates.fallback == 0) out.rates.fallback = fallback;
  return kExitOk;
}

}  // namespace ingero::cli
