#include "sinks/mcp/diff_run.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "engine/engine.h"
#include "model/annotation.h"
#include "model/ops.h"
#include "operators/event_observer.h"
#include "operators/incidents.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "sinks/fleet/merge.h"
#include "sinks/fleet/stragglers.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::diff {
namespace {

// Keeps the events that start in [first + from, first + to), `first` the first event's start.
class RangeSource final : public EventSource {
 public:
  RangeSource(EventSource& in, const TimeRange& r) : in_(in), r_(r) {}
  bool next(Batch& out) override {
    if (done_) return false;
    Batch b;
    while (in_.next(b)) {
      const std::vector<Event>& v = b.view();
      if (!v.empty() && !first_) first_ = v.front().ts_ns;
      out.events.clear();
      out.lent = nullptr;
      out.watermark = b.watermark;
      out.seq = b.seq;
      out.final = b.final;
      bool past = false;
      for (const Event& e : v) {
        const double rel = static_cast<double>(e.ts_ns - *first_) / 1e9;
        if (rel >= r_.to_s) {
          past = true;
          break;
        }
        if (rel >= r_.from_s) out.events.push_back(e);
      }
      if (past) done_ = true;
      if (!out.events.empty()) return true;
      if (done_) return false;
    }
    return false;
  }
  TraceMeta& meta() override { return in_.meta(); }
  unsigned busy_threads() const override { return in_.busy_threads(); }

 private:
  EventSource& in_;
  TimeRange r_;
  std::optional<uint64_t> first_;
  bool done_ = false;
};

// A uniform sample of each GPU API op's call durations (reservoir, deterministic), its true count,
// and the span of the events seen.
class OpSampler final : public EventObserver {
 public:
  static constexpr size_t kMaxSamples = 20000;
  void observe(const Event* events, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      const Event& e = events[i];
      if (first_ == 0 || e.ts_ns < first_) first_ = e.ts_ns;
      last_ = std::max(last_, e.end_ns());
      if (!is_gpu_api(e.source)) continue;
      OpSample& s = ops_[{e.source, e.op}];
      s.source = e.source;
      s.op = e.op;
      ++s.count;
      if (s.durations_ns.size() < kMaxSamples) {
        s.durations_ns.push_back(static_cast<double>(e.dur_ns));
      } else {
        const uint64_t j = next_random() % s.count;
        if (j < kMaxSamples) s.durations_ns[j] = static_cast<double>(e.dur_ns);
      }
    }
  }
  void finish(const TraceMeta&, AnalysisResult&) override {}
  std::vector<OpSample> take() {
    std::vector<OpSample> v;
    for (auto& [k, s] : ops_) v.push_back(std::move(s));
    return v;
  }
  uint64_t wall_ns() const { return last_ > first_ ? last_ - first_ : 0; }

 private:
  uint64_t next_random() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::map<std::pair<Source, uint8_t>, OpSample> ops_;
  uint64_t first_ = 0, last_ = 0, state_ = 1;
};

// A merged trace of several nodes: the stragglers per step as `merge` judges them, each with the
// pid of its rank's process. A second pass over the trace; the whole trace, not a range.
void add_stragglers(const std::string& path, const TimeRange& range, Analysed& out) {
  if (out.result.meta.nodes.size() < 2 || !(is_sqlite_file(path) || is_lmdb_file(path))) return;
  if (range.set) {
    out.notes.push_back(path + ": stragglers per step are compared on whole merged traces only, not over a range");
    return;
  }
  StragglerReport sr;
  std::string error;
  if (!stragglers_of_merged_trace(path, sr, error)) {
    out.notes.push_back(path + ": stragglers per step: " + error);
    return;
  }
  out.fleet = true;
  const auto& nodes = out.result.meta.nodes;
  for (const Straggler& g : sr.stragglers) {
    RankStraggler r{g.node, g.rank, 0, g.method, g.last_share, g.median_lag_ns, g.step_ns, g.cost_share, g.collectives};
    for (const auto& t : out.result.accounting)
      if (t.rank == g.rank && t.node < nodes.size() && nodes[t.node] == g.node) r.pid = t.pid;
    out.stragglers.push_back(std::move(r));
  }
}

nlohmann::json buckets_json(const std::array<double, acct::kBuckets>& b) {
  nlohmann::json j = nlohmann::json::object();
  for (uint8_t i = 0; i < acct::kBuckets; ++i) j[acct::bucket_name(i)] = std::llround(b[i]);
  return j;
}

nlohmann::json side_json(const SideSummary& s, const std::string& unit) {
  return {{"trace", s.label},
          {"process", s.process},
          {"pid", s.pid},
          {"thread", s.thread},
          {"tid", s.tid},
          {"step_ns", s.step_ns},
          {"period_ns", s.period_ns},
          {"p50_ns", s.p50_ns},
          {"p99_ns", s.p99_ns},
          {"steps", s.steps},
          {"method", s.method},
          {"wall_ns", s.wall_ns},
          {"unit", unit},
          {"buckets_ns_per_unit", buckets_json(s.per_unit)}};
}

std::string ms(double ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%9.3f", ns / 1e6);
  return buf;
}

}  // namespace

nlohmann::json report_json(const DiffReport& r) {
  nlohmann::json j;
  j["verdict"] = r.verdict;
  j["unit"] = r.unit;
  j["before"] = side_json(r.before, r.unit);
  j["after"] = side_json(r.after, r.unit);
  j["step_delta_ns"] = std::llround(r.delta_ns);
  j["step_delta_pct"] = r.delta_pct * 100;
  j["step_significant"] = r.step_significant;
  j["step_p"] = r.step_p;
  j["notes"] = r.notes;
  j["causes"] = nlohmann::json::array();
  for (const auto& c : r.causes)
    j["causes"].push_back({{"what", c.what},
                           {"category", c.category},
                           {"bucket", c.bucket},
                           {"added_ns_per_step", std::llround(c.added_ns)},
                           {"before_ns", std::llround(c.before_ns)},
                           {"after_ns", std::llround(c.after_ns)},
                           {"significant", c.significant},
                           {"p", c.p},
                           {"explained_by", c.explained_by},
                           {"evidence", c.evidence}});
  j["threads"] = nlohmann::json::array();
  for (const auto& t : r.threads)
    j["threads"].push_back({{"process", t.process},
                            {"thread", t.thread},
                            {"before", t.in_before ? buckets_json(t.before) : nlohmann::json()},
                            {"after", t.in_after ? buckets_json(t.after) : nlohmann::json()}});
  j["ops"] = nlohmann::json::array();
  for (const auto& o : r.ops)
    j["ops"].push_back(
        {{"op", o.op},
         {"kind", o.kind},
         {"before",
          {{"count", o.before_count},
           {"per_unit", o.before_per_unit},
           {"p50_ns", o.before_p50},
           {"p99_ns", o.before_p99}}},
         {"after",
          {{"count", o.after_count}, {"per_unit", o.after_per_unit}, {"p50_ns", o.after_p50}, {"p99_ns", o.after_p99}}},
         {"median_change", o.median_change},
         {"p", o.p},
         {"significant", o.significant}});
  j["incidents"] = nlohmann::json::array();
  for (const auto& in : r.incidents) {
    auto side = [](const std::string& sev, uint64_t count, uint64_t lost, double per_unit) {
      if (count == 0) return nlohmann::json();
      return nlohmann::json{{"severity", sev},
                            {"incidents", count},
                            {"lost_ns", lost},
                            {"lost_ns_per_unit", std::llround(per_unit)}};
    };
    nlohmann::json row = {{"change", in.change},
                          {"rule", in.rule},
                          {"category", in.category},
                          {"process", in.process},
                          {"thread", in.thread},
                          {"before", side(in.before_severity, in.before_count, in.before_lost_ns, in.before_ns)},
                          {"after", side(in.after_severity, in.after_count, in.after_lost_ns, in.after_ns)},
                          {"added_ns_per_step", std::llround(in.after_ns - in.before_ns)},
                          {"evidence", in.evidence}};
    if (!in.node.empty()) row["node"] = in.node;
    if (in.rank >= 0) row["rank"] = in.rank;
    j["incidents"].push_back(std::move(row));
  }
  j["chains"] = nlohmann::json::array();
  for (const auto& c : r.chains)
    j["chains"].push_back({{"rule", c.rule},
                           {"category", c.category},
                           {"process", c.process},
                           {"thread", c.thread},
                           {"before", c.before},
                           {"after", c.after},
                           {"change", c.change}});
  return j;
}

std::string report_text(const DiffReport& r) {
  std::ostringstream o;
  char buf[512];
  o << r.verdict << "\n";
  for (const auto& n : r.notes) o << "note: " << n << "\n";
  o << "\n";
  o << "BEFORE: " << r.before.label << "\nAFTER:  " << r.after.label << "\n\n";
  if (r.unit == "step") {
    o << "Step time of " << r.before.process << " (pid " << r.before.pid << " -> " << r.after.pid << ")\n";
    std::snprintf(buf, sizeof buf, "  %-8s %10s %10s %10s  %s\n", "", "mean ms", "p50 ms", "p99 ms", "steps");
    o << buf;
    for (const auto* s : {&r.before, &r.after}) {
      std::snprintf(buf, sizeof buf, "  %-8s %10.3f %10.3f %10.3f  %llu (%s)\n", s == &r.before ? "before" : "after",
                    static_cast<double>(s->step_ns) / 1e6, static_cast<double>(s->p50_ns) / 1e6,
                    static_cast<double>(s->p99_ns) / 1e6, static_cast<unsigned long long>(s->steps), s->method.c_str());
      o << buf;
    }
    std::snprintf(buf, sizeof buf, "  step times differ: p=%.4g (Mann-Whitney U and Welch, Bonferroni)\n\n", r.step_p);
    o << buf;
  }
  o << "Causes (ms per " << r.unit << " of " << r.after.thread << ", tid " << r.before.tid << " -> " << r.after.tid
    << "; * = significant)\n";
  for (const auto& c : r.causes) {
    std::snprintf(buf, sizeof buf, "  %s %s %s -> %s  %-13s %s\n", c.significant ? "*" : " ",
                  (c.added_ns >= 0 ? "+" + ms(c.added_ns).substr(1) : ms(c.added_ns)).c_str(), ms(c.before_ns).c_str(),
                  ms(c.after_ns).c_str(), c.bucket.empty() ? c.category.c_str() : c.bucket.c_str(), c.what.c_str());
    o << buf;
    if (!c.explained_by.empty()) o << "        explained by " << c.explained_by << "\n";
    if (c.significant && c.explained_by.empty())
      for (const auto& e : c.evidence) o << "        " << e << "\n";
  }
  o << "\nFeeding threads of " << r.before.process << ", ms per " << r.unit << " (before -> after)\n";
  for (const auto& t : r.threads) {
    o << "  " << t.thread << (t.in_before ? "" : " (only after)") << (t.in_after ? "" : " (only before)") << "\n";
    for (uint8_t b = 0; b < acct::kBuckets; ++b) {
      if (t.before[b] < 1 && t.after[b] < 1) continue;
      std::snprintf(buf, sizeof buf, "    %-13s %s -> %s\n", acct::bucket_name(b), ms(t.before[b]).c_str(),
                    ms(t.after[b]).c_str());
      o << buf;
    }
  }
  o << "\nGPU API ops (calls per " << r.unit << "; latency p50/p99; * = significant shift of the median)\n";
  for (const auto& p : r.ops) {
    std::snprintf(buf, sizeof buf, "  %s %-24s %8.2f -> %8.2f  p50 %9s -> %9s  p99 %9s -> %9s  %+6.1f%%  p=%.3g\n",
                  p.significant ? "*" : " ", p.op.c_str(), p.before_per_unit, p.after_per_unit,
                  format_ns(p.before_p50).c_str(), format_ns(p.after_p50).c_str(), format_ns(p.before_p99).c_str(),
                  format_ns(p.after_p99).c_str(), p.median_change * 100, p.p);
    o << buf;
  }
  o << "\nIncidents (MEDIUM or HIGH on either side; time lost, ms per " << r.unit << ", before -> after)\n";
  if (r.incidents.empty()) o << "  none on either side\n";
  for (const auto& in : r.incidents) {
    std::string who = in.process + (in.thread.empty() ? "" : "/" + in.thread);
    if (!in.node.empty()) who += " node " + in.node;
    if (in.rank >= 0) who += " rank " + std::to_string(in.rank);
    std::snprintf(buf, sizeof buf, "  %-8s %s -> %s  %s (%s) on %s  %s -> %s\n", in.change.c_str(),
                  ms(in.before_ns).c_str(), ms(in.after_ns).c_str(), in.rule.c_str(), in.category.c_str(), who.c_str(),
                  in.before_severity.empty() ? "-" : in.before_severity.c_str(),
                  in.after_severity.empty() ? "-" : in.after_severity.c_str());
    o << buf;
    for (const auto& e : in.evidence) o << "        " << e << "\n";
  }
  o << "\nChains (before -> after)\n";
  if (r.chains.empty()) o << "  none on either side\n";
  for (const auto& c : r.chains)
    o << "  " << c.change << ": " << c.rule << " (" << c.category << ") " << c.process
      << (c.thread.empty() ? "" : "/" + c.thread) << "  " << c.before << " -> " << c.after << "\n";
  return o.str();
}

bool parse_range(const std::string& s, TimeRange& out) {
  if (s.empty()) return true;
  const auto colon = s.find(':');
  if (colon == std::string::npos) return false;
  try {
    size_t used = 0;
    const std::string a = s.substr(0, colon), b = s.substr(colon + 1);
    out.from_s = a.empty() ? 0 : std::stod(a, &used);
    if (!a.empty() && used != a.size()) return false;
    if (!b.empty()) {
      out.to_s = std::stod(b, &used);
      if (used != b.size()) return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  if (out.from_s < 0 || !(out.to_s > out.from_s)) return false;
  out.set = true;
  out.text = s;
  return true;
}

std::string side_label(const std::string& path, const TimeRange& range) {
  return path + (range.set ? " [" + range.text + " s]" : "");
}

bool analyse_side(EventSource& source, const std::string& path, const TimeRange& range, const SideOptions& options,
                  Analysed& out, std::string& error) {
  RangeSource ranged(source, range);
  EventSource& in = range.set ? static_cast<EventSource&>(ranged) : source;
  EngineOptions opts;
  opts.threads = options.threads;
  opts.join_resident_bytes = replay_join_resident_bytes();
  LiveChainAnnotator annotator(options.annotate);
  AccountingOptions acct_opts;
  acct_opts.chain_accounting = true;  // per-second bins: the significance test of each bucket
  acct_opts.meta = &in.meta();
  TimeAccounting accounting(acct_opts);
  StepInference steps;
  if (is_sqlite_file(path)) {  // the program's own step markers, as `explain` reads them
    std::vector<Annotation> notes;
    AnnotationReadStats as;
    std::string ignored;
    if (read_annotations(path, source.meta().nodes, notes, as, ignored)) {
      std::vector<StepMarker> markers;
      for (const Annotation& x : notes)
        if (StepMarker m; step_marker_of(x, m)) markers.push_back(m);
      steps.add_markers(markers);
    }
  }
  OpSampler sampler;
  GpuUsage gpus;
  ObservingSource observed(in, {&accounting, &steps, &sampler, &gpus});
  EventSource& annotated = annotator.tap(observed);
  opts.on_chain = [&annotator](const Chain& c) { annotator.annotate(c); };
  std::vector<std::string> errors;
  out.result = run_plan(*options.plan, annotated, opts, &errors);
  if (!errors.empty()) {
    error = path + ": plan: " + errors.front();
    return false;
  }
  annotator.finish(out.result);
  observed.finish(out.result);
  out.result.accounting_series.clear();
  for (const auto& a : out.result.accounting)
    if (auto s = accounting.series(a.node, a.tid)) out.result.accounting_series.push_back(std::move(*s));
  out.ops = sampler.take();
  out.wall_ns = sampler.wall_ns();
  if (out.result.accounting.empty()) {
    error = path + (range.set ? " (range " + range.text + ")" : "") +
            ": no GPU API calls: nothing to compare (expected a trace of a process that calls CUDA)";
    return false;
  }
  // Severity and incidents as `explain` decides them: the incidents that appeared, vanished or grew.
  assemble_incidents(out.result, options.incidents, &gpus);
  add_stragglers(path, range, out);
  return true;
}

}  // namespace ingero::diff
