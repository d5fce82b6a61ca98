#include "sinks/report/text_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/format.h"
#include "model/ops.h"
#include "model/result_json.h"

namespace ingero {
namespace {

std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

const char* sev_color(Severity s) {
  switch (s) {
    case Severity::kHigh: return "\x1b[1;31m";
    case Severity::kMedium: return "\x1b[1;33m";
    default: return "\x1b[1;36m";
  }
}

uint64_t trace_span(const TraceMeta& m) { return m.last_ts > m.first_ts ? m.last_ts - m.first_ts : 0; }

}  // namespace

std::string trace_offset(const TraceMeta& meta, uint64_t ts) {
  if (ts < meta.first_ts || meta.first_ts == 0) return "+0.0s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "+%.1fs", static_cast<double>(ts - meta.first_ts) / 1e9);
  return buf;
}

static std::string header_line(const AnalysisResult& r) {
  const auto& m = r.meta;
  std::ostringstream o;
  o << (m.path.empty() ? "<trace>" : m.path);
  if (!m.format.empty()) o << " (" << m.format << ")";
  o << ": " << format_count(static_cast<double>(r.counters.events_in)) << " events over "
    << format_ns(static_cast<double>(trace_span(m)));
  std::vector<std::string> nodes;
  for (const auto& n : m.nodes)
    if (!n.empty()) nodes.push_back(n);
  if (!nodes.empty()) o << ", " << nodes.size() << " node(s)";
  o << "\n";
  if (m.health.rows_skipped || m.health.dropped_events) {
    o << "  warning: " << format_count(static_cast<double>(m.health.rows_skipped)) << " row(s) skipped";
    if (m.health.dropped_events)
      o << ", " << format_count(static_cast<double>(m.health.dropped_events)) << " event(s) dropped at capture";
    o << "\n";
    for (const auto& [reason, n] : m.health.reasons)
      o << "    " << format_count(static_cast<double>(n)) << " x " << reason << "\n";
  }
  if (!m.health.missed.empty()) {
    o << "  warning: the capture's self-check found probe hits that are not in this trace:\n";
    for (const auto& [reason, n] : m.health.missed)
      o << "    " << format_count(static_cast<double>(n)) << " x " << reason << "\n";
  }
  // Processes whose capture began after they started: their earlier calls are not here.
  for (const auto& [pid, c] : m.captures) {
    if (!c.predates && !(c.started_at && c.attached_at > c.started_at + 1'000'000)) continue;
    auto name = m.process_names.find(pid);
    o << "  note: pid " << pid;
    if (name != m.process_names.end() && !name->second.empty()) o << " (" << name->second << ")";
    o << (c.predates ? " was running before the trace started" : " started while the tracer was attaching")
      << ": its calls are captured from " << trace_offset(m, c.attached_at)
      << " (attached_at); calls it made before that are not in this trace\n";
  }
  return o.str();
}

std::string stats_text(const AnalysisResult& r, const ReportOptions&) {
  std::ostringstream o;
  o << header_line(r) << "\n";
  o << pad("SOURCE", 7) << pad("OP", 22) << pad("COUNT", 9, true) << pad("P50", 10, true) << pad("P95", 10, true)
    << pad("P99", 10, true) << pad("MAX", 10, true) << pad("TOTAL", 10, true) << pad("P99/P50", 9, true) << "\n";
  bool any_sketch = false;
  for (const auto& s : r.ops) {
    std::string ratio = s.p50_ns ? format_value(s.tail_ratio, Unit::kRatio) : "-";
    if (!s.exact) any_sketch = true;
    o << pad(source_name(s.source), 7) << pad(op_name(s.source, s.op), 22)
      << pad(format_count(static_cast<double>(s.count)), 9, true)
      << pad(format_ns(static_cast<double>(s.p50_ns)), 10, true)
      << pad(format_ns(static_cast<double>(s.p95_ns)), 10, true)
      << pad(format_ns(static_cast<double>(s.p99_ns)), 10, true)
      << pad(format_ns(static_cast<double>(s.max_ns)), 10, true)
      << pad(format_ns(static_cast<double>(s.total_ns)), 10, true) << pad(ratio, 9, true) << (s.exact ? "" : " ~")
      << (s.errors ? "  (" + format_count(static_cast<double>(s.errors)) + " errors)" : "") << "\n";
  }
  if (r.ops.empty()) o << "  (no events)\n";
  o << "\nPercentiles are nearest-rank (index ceil(p*n)-1 of the sorted durations)";
  if (any_sketch) o << "; ~ marks ops past the exact limit, estimated by DDSketch within 1% relative error";
  o << ".\nHOST sched_switch rows are off-CPU spans: their duration is the time the thread was off CPU.\n";
  return o.str();
}

std::string why_not_text(const RuleOutcome& o) {
  std::ostringstream s;
  s << "rule " << o.rule << " (" << o.category << "): ";
  if (o.chains) {
    s << "fired " << o.chains << " time(s) over " << o.windows << " window(s).\n";
  } else if (o.windows == 0) {
    s << "never evaluated: no window had events this rule selects.\n";
    return s.str();
  } else {
    s << "did not fire in " << o.windows << " window(s).\n";
  }
  if (!o.has_miss) return s.str();
  s << "  closest miss: " << o.miss.label << "\n";
  s << "    value " << (o.miss.lhs_text.empty() ? format_value(o.miss.lhs, Unit::kNone) : o.miss.lhs_text)
    << " vs threshold " << (o.miss.rhs_text.empty() ? format_value(o.miss.rhs, Unit::kNone) : o.miss.rhs_text)
    << " (short by " << format_value(-o.miss.margin, Unit::kNone) << ")\n";
  s << "    for " << o.miss_key << ", window [" << o.miss_window_start << ", " << o.miss_window_end << ") ns\n";
  s << "    row:";
  int shown = 0;
  for (const auto& [k, v] : o.miss_values) {
    if (v != v) continue;
    s << (shown++ % 4 == 0 ? "\n      " : "  ") << k << "=" << format_value(v, Unit::kNone);
  }
  s << "\n";
  return s.str();
}

namespace {
// "48.2 ms", "1.52 s", "850 us": the steps line's durations.
std::string step_dur(double ns) {
  char buf[48];
  if (ns >= 1e9) std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  else if (ns >= 1e6) std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f us", ns / 1e3);
  return buf;
}
}  // namespace

std::string steps_text(const AnalysisResult& r) {
  std::ostringstream o;
  for (const auto& s : r.steps) {
    o << "pid " << s.pid << " (" << process_label(r.meta, s.pid) << ")";
    if (s.rank >= 0) o << " rank " << s.rank;
    if (s.node && s.node < r.meta.nodes.size()) o << " node " << r.meta.nodes[s.node];
    o << ": ";
    if (s.method == "none" || s.period_ns == 0) {
      o << "no period: " << (s.reason.empty() ? "not recognised" : s.reason);
      if (s.fallback_interval_ns)
        o << "; fixed " << step_dur(static_cast<double>(s.fallback_interval_ns)) << " intervals instead";
      o << "\n";
      continue;
    }
    char conf[16];
    std::snprintf(conf, sizeof conf, "%.2f", s.confidence);
    o << format_count(static_cast<double>(s.count)) << " steps, period " << step_dur(static_cast<double>(s.period_ns))
      << " (p50 " << step_dur(static_cast<double>(s.p50_ns)) << ", p99 " << step_dur(static_cast<double>(s.p99_ns))
      << "), recognised by " << s.method << ", confidence " << conf << "\n";
  }
  return o.str();
}

// "12.0s: in calls 3% (sync 2%, launch 1%), on CPU 50%, preempted 40% (mostly by stress (pid 77) tid 77,
// 4.8s), blocked 7% (lock 7%), unknown 0%": one thread's accounting, for the report's lines.
std::string accounting_parts(const ThreadAccounting& a) {
  std::ostringstream o;
  const double wall = a.wall_ns ? static_cast<double>(a.wall_ns) : 1.0;
  auto pct = [wall](uint64_t ns) { return format_value(static_cast<double>(ns) / wall, Unit::kPercent); };
  // The non-zero parts of a map, largest first: "sync 30%, launch 8%".
  auto parts = [&pct](const std::map<std::string, uint64_t>& m) {
    std::vector<std::pair<uint64_t, std::string>> v;
    for (const auto& [k, ns] : m)
      if (ns) v.emplace_back(ns, k);
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::string s;
    for (const auto& [ns, k] : v) s += (s.empty() ? "" : ", ") + k + " " + pct(ns);
    return s;
  };
  o << format_ns(static_cast<double>(a.wall_ns)) << ": in calls " << pct(a.in_calls_total());
  if (const std::string c = parts(a.in_calls_ns); !c.empty()) o << " (" << c << ")";
  o << ", on CPU " << pct(a.on_cpu_ns) << ", preempted " << pct(a.preempted_ns);
  if (!a.preempted_by.empty()) {
    const PreemptedBy& p = a.preempted_by.front();
    o << " (mostly by " << (p.comm.empty() ? "" : p.comm + " ") << (p.pid ? "pid " + std::to_string(p.pid) + " " : "")
      << "tid " << p.tid << ", " << format_ns(static_cast<double>(p.ns)) << ")";
  }
  o << ", blocked " << pct(a.blocked_total());
  if (const std::string b = parts(a.blocked_ns); !b.empty()) o << " (" << b << ")";
  o << ", unknown " << pct(a.unknown_ns);
  return o.str();
}

std::string accounting_text(const AnalysisResult& r, size_t max_threads) {
  if (r.accounting.empty()) return "";
  std::ostringstream o;
  o << "\nWhere the time went (main GPU-feeding threads, each from its first event to its last):\n";
  size_t shown = 0;
  for (const auto& a : r.accounting) {
    if (shown++ == max_threads) {
      o << "  ... " << (r.accounting.size() - max_threads) << " more thread(s) in --json\n";
      break;
    }
    o << "  tid " << a.tid;
    if (!a.comm.empty()) o << " (" << a.comm << ")";
    o << " pid " << a.pid;
    if (a.rank >= 0) o << " rank " << a.rank;
    if (a.node && a.node < r.meta.nodes.size()) o << " node " << r.meta.nodes[a.node];
    o << ", " << accounting_parts(a) << "\n";
    const double wall = a.wall_ns ? static_cast<double>(a.wall_ns) : 1.0;
    auto pct = [wall](uint64_t ns) { return format_value(static_cast<double>(ns) / wall, Unit::kPercent); };
    if (auto sync = a.in_calls_ns.find("sync");
        sync != a.in_calls_ns.end() && a.wall_ns && sync->second * 10 >= a.wall_ns * 6)
      o << "    GPU-bound: " << pct(sync->second)
        << " of its time waiting for the GPU to finish (synchronising calls): the healthy outcome, the GPU sets the "
           "pace\n";
    if (a.unknown_ns) {
      if (!a.scheduler_data)
        o << "    unknown " << pct(a.unknown_ns)
          << ": this trace does not record why threads were off CPU, nor every switch (no switch-out state), so "
             "time outside calls cannot be split into on CPU, preempted and blocked\n";
      else o << "    unknown " << pct(a.unknown_ns) << ": off-CPU spans whose state this trace does not record\n";
    }
  }
  return o.str();
}

std::string wrap_text(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  bool fresh = true;  // nothing on the line yet (the first line has no indent)
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (!fresh && line.size() + 1 + w.size() > width) {
      out += line + "\n";
      line = indent;
      fresh = true;
    }
    if (!fresh) line += ' ';
    line += w;
    fresh = false;
  }
  if (!fresh) out += line + "\n";
  return out;
}

std::string incidents_text(const AnalysisResult& r, size_t max) {
  if (r.incidents.empty()) return "";
  std::ostringstream o;
  o << "Incidents (one per cause over consecutive windows; most time lost first):\n";
  size_t shown = 0;
  for (const auto& in : r.incidents) {
    if (max && shown >= max) {
      o << "  ... " << (r.incidents.size() - shown) << " more (--json)\n";
      break;
    }
    ++shown;
    o << "  [" << severity_name(in.severity) << "] " << in.category << " (" << in.rule << ")";
    if (in.pid) o << "  pid " << in.pid << " (" << process_label(r.meta, in.pid) << ")";
    if (in.tid) o << " tid " << in.tid;
    if (in.rank >= 0) o << "  rank " << in.rank;
    o << "  " << trace_offset(r.meta, in.start_ns) << " .. " << trace_offset(r.meta, in.end_ns);
    if (in.steps) o << " (" << format_count(static_cast<double>(in.steps)) << " steps)";
    o << "\n    lost " << format_ns(static_cast<double>(in.lost_ns)) << " ("
      << format_value(in.lost_share, Unit::kPercent) << " of the job; " << in.lost_basis << ")";
    if (in.lost_ns) {
      char gh[48];
      std::snprintf(gh, sizeof gh, "%.3g", in.gpu_hours);
      o << ", " << gh << " GPU-hours (" << format_count(in.gpus) << " GPU" << (in.gpus == 1 ? "" : "s") << ", "
        << in.gpus_from << ")";
      if (in.cost) {
        char c[48];
        std::snprintf(c, sizeof c, "%.2f", *in.cost);
        o << ", cost " << c << " " << in.currency;
      }
      if (in.what_if_step_ns)
        o << "; step " << format_ns(static_cast<double>(in.step_ns)) << " -> "
          << format_ns(static_cast<double>(*in.what_if_step_ns)) << " without it";
    }
    o << "\n    " << in.chains.size() << " chain(s): " << in.summary << "\n";
  }
  return o.str();
}

std::string explain_text(const AnalysisResult& r, const ReportOptions& opt) {
  std::ostringstream o;
  // The verdict first (operators/incidents.h make_verdict); detail follows.
  if (!r.verdict.empty()) o << wrap_text("Verdict: " + r.verdict, 100, "  ") << "\n";
  o << header_line(r);
  int counts[3] = {0, 0, 0};
  for (const auto& c : r.chains) ++counts[static_cast<int>(c.severity)];
  if (r.chains.empty()) {
    o << "\nNo causal chain fired. ";
    o << "Run `ingero-pipeline explain --why-not RULE` to see how close each rule came.\n";
  } else {
    o << "\n"
      << r.chains.size() << " causal chain(s): " << counts[2] << " HIGH, " << counts[1] << " MEDIUM, " << counts[0]
      << " LOW (worst first)\n";
  }
  if (!r.incidents.empty()) o << "\n" << incidents_text(r, opt.max_chains ? opt.max_chains : 10);
  if (!r.steps.empty()) {
    bool marked = false, inferred = false;
    for (const auto& st : r.steps) (st.method.rfind("annotated", 0) == 0 ? marked : inferred) = true;
    o << "\nSteps ("
      << (marked && inferred
              ? "from the program's markers where it sent them, else inferred from sync and launch timing"
          : marked ? "from the markers the program sent (trace --annotate)"
                   : "inferred from sync and launch timing, no markers")
      << "):\n";
    std::istringstream lines(steps_text(r));
    for (std::string line; std::getline(lines, line);) o << "  " << line << "\n";
  }
  size_t shown = 0;
  for (const auto& c : r.chains) {
    if (opt.max_chains && shown >= opt.max_chains) {
      o << "\n... " << (r.chains.size() - shown) << " more (use --json or --limit 0 for all)\n";
      break;
    }
    ++shown;
    o << "\n";
    const std::string sev = std::string("[") + severity_name(c.severity) + "]";
    o << (opt.color ? sev_color(c.severity) : "") << sev << (opt.color ? "\x1b[0m" : "") << " " << c.category;
    if (c.op) o << "  " << op_name(c.source, c.op);
    if (c.pid) o << "  pid " << c.pid << " (" << process_label(r.meta, c.pid) << ")";
    if (c.tid) o << " tid " << c.tid;
    if (c.rank >= 0) o << "  rank " << c.rank;
    if (c.node && c.node < r.meta.nodes.size()) o << "  node " << r.meta.nodes[c.node];
    o << "  window " << trace_offset(r.meta, c.window_start) << " .. " << trace_offset(r.meta, c.window_end) << "\n";
    o << "  " << c.summary << "\n";
    if (const std::string site = chain_call_site(c); !site.empty()) o << "  " << site << "\n";
    o << "  Root cause: " << c.root_cause << "\n";
    if (c.time_split.present) {
      const TimeSplit& t = c.time_split;
      o << "  Launching thread tid " << t.tid << " over " << trace_offset(r.meta, t.start_ns) << " .. "
        << trace_offset(r.meta, t.end_ns) << ": in calls " << format_value(t.in_calls, Unit::kPercent) << ", on CPU "
        << format_value(t.on_cpu, Unit::kPercent) << ", preempted " << format_value(t.off_cpu_preempted, Unit::kPercent)
        << ", blocked " << format_value(t.off_cpu_blocked, Unit::kPercent) << ", off CPU (unknown) "
        << format_value(t.off_cpu_unknown, Unit::kPercent) << "\n";
    }
    if (c.accounting) {
      const ThreadAccounting& a = *c.accounting;
      o << "  Time of tid " << a.tid << (a.comm.empty() ? "" : " (" + a.comm + ")") << " over "
        << trace_offset(r.meta, a.start_ns) << " .. " << trace_offset(r.meta, a.end_ns) << ": " << accounting_parts(a)
        << "\n";
    }
    if (c.threads.size() > 1) {
      o << "  Threads:";
      for (size_t i = 0; i < c.threads.size() && i < 4; ++i)
        o << "  tid " << c.threads[i].tid << (c.threads[i].name.empty() ? "" : " (" + c.threads[i].name + ")") << " "
          << format_value(c.threads[i].share, Unit::kPercent);
      if (c.threads.size() > 4) o << "  ...";
      o << "\n";
    }
    if (!c.explanation.empty()) o << "  Why: " << c.explanation << "\n";
    if (!c.evidence.empty()) {
      o << "  Evidence:\n";
      for (const auto& e : c.evidence) {
        o << "    - " << e.kind << ": " << e.detail;
        if (!e.event_ids.empty()) {
          o << " [events";
          for (size_t i = 0; i < e.event_ids.size() && i < 6; ++i) o << " " << e.event_ids[i];
          if (e.event_ids.size() > 6) o << " ...";
          o << "]";
        }
        o << "\n";
      }
    }
    if (!c.predicates.empty()) {
      o << "  Checks passed:";
      for (const auto& p : c.predicates)
        o << "  " << p.label << " (" << (p.lhs_text.empty() ? format_value(p.lhs, Unit::kNone) : p.lhs_text) << ")";
      o << "\n";
    }
    if (c.dropped_events)
      o << "  Note: " << c.dropped_events << " event(s) were dropped at capture "
        << (r.meta.health.loss_spans.empty() ? "in this trace" : "in or next to this chain's window") << ".\n";
    if (!c.recommendations.empty()) {
      o << "  Fix:\n";
      for (size_t i = 0; i < c.recommendations.size(); ++i)
        o << "    " << (i + 1) << ". " << c.recommendations[i] << "\n";
    }
    if (opt.show_values && !c.stacks.empty()) {
      o << "  Stacks:\n";
      for (const auto& st : c.stacks) {
        o << "    " << st.role << " stack " << st.stack_id << ": " << format_value(st.share, Unit::kPercent) << ", "
          << st.calls << " event(s)" << (st.truncated ? ", truncated" : "") << "\n";
        for (const auto& f : st.frames) o << "      " << frame_label(f) << "\n";
        if (st.frames.empty()) o << "      (frames not in the trace)\n";
      }
    }
    if (opt.show_values) {
      o << "  Values:";
      int n = 0;
      for (const auto& [k, v] : c.values)
        o << (n++ % 4 == 0 ? "\n    " : "  ") << k << "=" << format_value(v, Unit::kNone);
      o << "\n";
    }
  }
  o << accounting_text(r);
  return o.str();
}

}  // namespace ingero
