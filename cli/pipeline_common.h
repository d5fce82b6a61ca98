// Helpers of the pipeline commands (run, bench, convert, demo): opening a trace by its content,
// building the analysis (rule pack, built-in plans, rule files with parameter overrides), merging
// and tapping sources, and measuring memory.
//
// Contract:
// - open_any_trace() picks the reader by the file's first bytes (an LMDB meta page or not), never
//   by its extension; an empty path is the embedded sample (cli/common.h).
// - build_analysis(): `default` is the rule pack (rules/*.rules, embedded) when the build has the
//   rule compiler, else the hand-built plans of engine/default_plans.h; `builtin` always the
//   latter. Parameter overrides go to both (the pack by name through the rule compiler, the
//   built-in plans through DefaultPlanOptions). Errors are rendered, ready for stderr.
// - build_analysis() also reads the knobs the chain annotator applies beside the rules from the
//   pack's params after the overrides (`warmup`, `min_calls`, `min_tail_ratio`: rules/pack.h
//   pack_param()); annotate_options() puts them into an annotator's options. Without the rule
//   compiler they come from DefaultPlanOptions, and warm-up keeps its default (10 s).
// - MergeSource merges sources by timestamp with watermarks: an event is released only when
//   every unfinished source has promised nothing earlier will follow. Node indexes of each input
//   are remapped into the merged TraceMeta. TapSource hands every batch to a callback first.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/default_plans.h"
#include "model/plan.h"
#include "model/result.h"
#include "model/trace.h"
#include "operators/chain_annotate.h"
#include "operators/event_observer.h"
#include "operators/incidents.h"
#include "operators/time_accounting.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ingero::cli {

std::unique_ptr<EventSource> open_any_trace(const std::string& path, std::string& error, size_t batch_size = 4096);

// "lmdb" when the file starts like an LMDB environment, else "sqlite".
std::string trace_format_of(const std::string& path);

struct AnalysisSpec {
  bool use_default = true;  // the default analyses (pack or built-in)
  bool builtin = false;     // force the hand-built plans for the default analyses
  std::vector<std::string> rule_files;
  DefaultPlanOptions options;                 // built-in plans
  std::map<std::string, std::string> params;  // rule-pack / rule-file overrides, as text
};

struct AnalysisPlan {
  Plan plan;
  std::string description;                               // "rule pack (12 rules)" ...
  std::vector<std::pair<std::string, Plan>> rule_plans;  // each rule alone (per-rule timing)
  // The annotator's knobs from the pack's params (after overrides): see annotate_options().
  uint64_t warmup_ns = AnnotateOptions{}.warmup_ns;                // param warmup
  uint64_t warmup_min_calls = AnnotateOptions{}.warmup_min_calls;  // param min_calls
  double warmup_tail_ratio = AnnotateOptions{}.warmup_tail_ratio;  // param min_tail_ratio
};

// `base` (e.g. LiveChainAnnotator::replay_defaults()) with the analysis' warm-up knobs.
AnnotateOptions annotate_options(const AnalysisPlan& a, AnnotateOptions base);
// What went wrong with the annotator's spill file (operators/spill_file.h), as one line for stderr;
// empty when nothing did. A failed write only costs memory; a failed read loses the records of a
// block, so chains may lack thread and stack details.
std::string annotator_spill_warning(const SpillCounters& c);
// The same for the engine's join span spill file (EngineOptions::join_resident_bytes).
std::string join_spill_warning(const EngineCounters& k);

bool build_analysis(const AnalysisSpec& spec, AnalysisPlan& out, std::string& errors);
// `--param NAME=VALUE` overrides into spec.params, then build_analysis: kExitOk, or the exit
// status after printing why (kExitUsage: a malformed --param; kExitInput: rules that do not compile).
int prepare_analysis(const std::vector<std::string>& params, AnalysisSpec& spec, AnalysisPlan& out);
bool have_rule_compiler();

// What an incident's lost time is worth (operators/incidents.h): `--gpus N` (GPUs per process when
// the trace does not name its devices), `--gpu-hour-price P` and `--rates FILE` (a price per node
// name, "* P" for the rest, "currency CODE"; the file wins over --gpu-hour-price for its nodes).
struct CostArgs {
  double gpus = 0;
  double price = 0;
  std::string rates;
};
void add_cost_options(CLI::App* cmd, CostArgs* args);
// CostArgs into IncidentOptions: kExitOk, or kExitInput after printing why (an unreadable or
// malformed rates file: file:line and what was expected).
int incident_options(const CostArgs& args, IncidentOptions& out);

// Peak resident set size of this process (VmHWM), bytes; 0 if unknown.
uint64_t peak_rss_bytes();

class MergeSource final : public EventSource {
 public:
  explicit MergeSource(std::vector<EventSource*> inputs);
  bool next(Batch& out) override;
  TraceMeta& meta() override { return meta_; }

 private:
  struct Input {
    EventSource* src;
    std::vector<Event> buf;
    size_t pos = 0;
    uint64_t watermark = 0;
    bool done = false;
    std::vector<uint16_t> node_map;
  };
  void pull(Input& in);
  void merge_meta(Input& in);

  std::vector<Input> inputs_;
  TraceMeta meta_;
  uint64_t seq_ = 0;
  bool finished_ = false;
};

class TapSource final : public EventSource {
 public:
  TapSource(EventSource& in, std::function<void(const Batch&, const TraceMeta&)> tap) : in_(in), tap_(std::move(tap)) {}
  bool next(Batch& out) override {
    if (!in_.next(out)) return false;
    if (tap_) tap_(out, in_.meta());
    return true;
  }
  TraceMeta& meta() override { return in_.meta(); }
  PrefetchHint upcoming() override { return in_.upcoming(); }
  unsigned busy_threads() const override { return in_.busy_threads(); }

 private:
  EventSource& in_;
  std::function<void(const Batch&, const TraceMeta&)> tap_;
};

// ObservingSource (a pass-through source that shows every batch to observers): operators/event_observer.h.

// r.accounting_series = the per-second series of r.accounting's threads (the HTML report's and the
// Perfetto export's charts), from an accounting observer run with chain_accounting after its
// finish(); threads without bins are left out.
void add_accounting_series(const TimeAccounting& accounting, AnalysisResult& r);

// One event as a JSON line (jsonl sinks fed with events).
std::string event_json_line(const Event& e, const TraceMeta& meta);

}  // namespace ingero::cli
