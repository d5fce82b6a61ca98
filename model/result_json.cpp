#include "model/result_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include "model/format.h"
#include "model/ops.h"
#include "model/stack.h"

namespace ingero {
namespace {

using nlohmann::json;

json num_or_null(double v) { return v == v && std::isfinite(v) ? json(v) : json(nullptr); }

uint64_t trace_span(const TraceMeta& m) { return m.last_ts > m.first_ts ? m.last_ts - m.first_ts : 0; }

}  // namespace

std::string process_label(const TraceMeta& meta, uint32_t pid) {
  auto it = meta.process_names.find(pid);
  if (it != meta.process_names.end() && !it->second.empty()) return it->second;
  return "pid " + std::to_string(pid);
}

json health_json(const InputHealth& h) {
  json reasons = json::object();
  for (const auto& [reason, n] : h.reasons) reasons[reason] = n;
  json out = {{"rows_read", h.rows_read},
              {"rows_skipped", h.rows_skipped},
              {"skip_reasons", reasons},
              {"dropped_events", h.dropped_events}};
  if (!h.loss_spans.empty()) {  // where a live capture lost events (unix ns)
    json spans = json::array();
    for (const LossSpan& l : h.loss_spans)
      spans.push_back(
          {{"start_ns", l.start_ns}, {"end_ns", l.end_ns}, {"gpu", l.gpu}, {"host", l.host}, {"queue", l.queue}});
    out["loss_spans"] = std::move(spans);
  }
  // Only a damaged input file writes these (docs/storage.md, "Damaged files"). Damage worked
  // around exactly is only noted on stderr: the results are the undamaged file's, so is stdout.
  if (!h.damage.empty()) {
    out["damage"] = h.damage;
    out["rows_unreadable"] = h.rows_unreadable;
  }
  if (!h.missed.empty()) {  // only live captures' self-check writes these
    json missed = json::object();
    for (const auto& [reason, n] : h.missed) missed[reason] = n;
    out["missed_by_self_check"] = missed;
  }
  return out;
}

json trace_json(const TraceMeta& meta, const AnalysisResult& r) {
  json nodes = json::array();
  for (const auto& n : meta.nodes)
    if (!n.empty()) nodes.push_back(n);
  std::set<uint32_t> pids;
  for (const auto& c : r.chains) pids.insert(c.pid);
  json procs = json::array();
  for (const auto& [pid, name] : meta.process_names) {
    json p = {{"pid", pid}, {"name", name}};
    if (auto c = meta.captures.find(pid); c != meta.captures.end()) {
      p["attached_at_ns"] = c->second.attached_at;
      p["started_at_ns"] = c->second.started_at;
      p["predates_trace"] = c->second.predates;
    }
    procs.push_back(std::move(p));
  }
  return {{"path", meta.path},
          {"format", meta.format},
          {"events", r.counters.events_in},
          {"first_ts_ns", meta.first_ts},
          {"last_ts_ns", meta.last_ts},
          {"duration_ns", trace_span(meta)},
          {"nodes", nodes},
          {"processes", procs}};
}

json op_stats_json(const OpStats& s) {
  return {{"source", source_name(s.source)},
          {"op", op_name(s.source, s.op)},
          {"count", s.count},
          {"p50_ns", s.p50_ns},
          {"p95_ns", s.p95_ns},
          {"p99_ns", s.p99_ns},
          {"max_ns", s.max_ns},
          {"min_ns", s.min_ns},
          {"total_ns", s.total_ns},
          {"tail_ratio", s.tail_ratio},
          {"errors", s.errors},
          {"exact", s.exact},
          {"relative_error", s.rel_error}};
}

json frame_json(const StackFrame& f) {
  json j = {{"kind", frame_kind_name(f.kind)},
            {"function", f.function},
            {"file", f.file},
            {"line", f.line},
            {"module", f.module}};
  if (f.function.empty() && f.ip) {  // an unresolved native frame: its address
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(f.ip));
    j["ip"] = buf;
  }
  return j;
}

json chain_stack_json(const ChainStack& s) {
  json frames = json::array();
  for (const auto& f : s.frames) frames.push_back(frame_json(f));
  return {{"role", s.role},   {"stack_id", s.stack_id},   {"share", num_or_null(s.share)},
          {"calls", s.calls}, {"truncated", s.truncated}, {"frames", frames}};
}

json time_split_json(const TimeSplit& t) {
  if (!t.present) return nullptr;
  return {{"tid", t.tid},
          {"start_ns", t.start_ns},
          {"end_ns", t.end_ns},
          {"in_calls", num_or_null(t.in_calls)},
          {"off_cpu_preempted", num_or_null(t.off_cpu_preempted)},
          {"off_cpu_blocked", num_or_null(t.off_cpu_blocked)},
          {"off_cpu_unknown", num_or_null(t.off_cpu_unknown)},
          {"on_cpu", num_or_null(t.on_cpu)},
          {"dominant", t.dominant}};
}

json threads_json(const std::vector<ThreadShare>& threads) {
  json out = json::array();
  for (const auto& t : threads) out.push_back({{"tid", t.tid}, {"name", t.name}, {"share", num_or_null(t.share)}});
  return out;
}

namespace {

uint64_t u64_of(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) return static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
  return 0;
}

double num_of(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string str_of(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

FrameKind frame_kind_of(const std::string& k) {
  if (k == "python") return FrameKind::kPython;
  if (k == "kernel") return FrameKind::kKernel;
  return FrameKind::kNative;
}

}  // namespace

void chain_where_from_json(const json& threads, const json& stacks, const json& split, Chain& c) {
  if (threads.is_array())
    for (const auto& t : threads)
      if (t.is_object())
        c.threads.push_back({static_cast<uint32_t>(u64_of(t, "tid")), str_of(t, "name"), num_of(t, "share")});
  if (stacks.is_array())
    for (const auto& st : stacks) {
      if (!st.is_object()) continue;
      ChainStack cs;
      cs.role = str_of(st, "role");
      cs.stack_id = u64_of(st, "stack_id");
      cs.share = num_of(st, "share");
      cs.calls = u64_of(st, "calls");
      auto tr = st.find("truncated");
      cs.truncated = tr != st.end() && tr->is_boolean() && tr->get<bool>();
      if (auto fr = st.find("frames"); fr != st.end() && fr->is_array())
        for (const auto& f : *fr) {
          if (!f.is_object()) continue;
          StackFrame sf;
          sf.kind = frame_kind_of(str_of(f, "kind"));
          sf.function = str_of(f, "function");
          sf.file = str_of(f, "file");
          sf.line = static_cast<uint32_t>(std::min<uint64_t>(u64_of(f, "line"), UINT32_MAX));
          sf.module = str_of(f, "module");
          cs.frames.push_back(std::move(sf));
        }
      c.stacks.push_back(std::move(cs));
    }
  if (split.is_object()) {
    TimeSplit& t = c.time_split;
    t.present = true;
    t.tid = static_cast<uint32_t>(u64_of(split, "tid"));
    t.start_ns = u64_of(split, "start_ns");
    t.end_ns = u64_of(split, "end_ns");
    t.in_calls = num_of(split, "in_calls");
    t.off_cpu_preempted = num_of(split, "off_cpu_preempted");
    t.off_cpu_blocked = num_of(split, "off_cpu_blocked");
    t.off_cpu_unknown = num_of(split, "off_cpu_unknown");
    t.on_cpu = num_of(split, "on_cpu");
    t.dominant = str_of(split, "dominant");
  }
}

std::string chain_call_site(const Chain& c) {
  // A rate/gap chain points where its launching thread's time went: sampled stacks when it was on
  // CPU, off-CPU stacks when it was off CPU, the calls' stacks when it was inside calls.
  std::vector<const char*> roles = {"call", "sample", "offcpu"};
  if (c.time_split.present && c.time_split.dominant == "on_cpu") roles = {"sample", "call", "offcpu"};
  else if (c.time_split.present && c.time_split.dominant.rfind("off_cpu", 0) == 0) roles = {"offcpu", "sample", "call"};
  for (const char* role : roles)
    for (const auto& s : c.stacks) {
      if (s.role != role || s.frames.empty()) continue;
      ParsedStack p;
      p.frames = s.frames;
      if (const StackFrame* f = call_site(p)) return "from " + frame_label(*f);
    }
  return {};
}

json chain_json(const Chain& c, const TraceMeta& meta) {
  json evidence = json::array();
  for (const auto& e : c.evidence)
    evidence.push_back({{"kind", e.kind},
                        {"detail", e.detail},
                        {"value", num_or_null(e.value)},
                        {"unit", e.unit},
                        {"event_ids", e.event_ids}});
  json predicates = json::array();
  for (const auto& p : c.predicates)
    predicates.push_back({{"label", p.label},
                          {"value", num_or_null(p.lhs)},
                          {"threshold", num_or_null(p.rhs)},
                          {"margin", num_or_null(p.margin)},
                          {"passed", p.passed},
                          {"value_text", p.lhs_text},
                          {"threshold_text", p.rhs_text}});
  json values = json::object();
  for (const auto& [k, v] : c.values) values[k] = num_or_null(v);
  const std::string node = c.node < meta.nodes.size() ? meta.nodes[c.node] : "";
  json stacks = json::array();
  for (const auto& st : c.stacks) stacks.push_back(chain_stack_json(st));
  return {{"id", c.id},
          {"rule", c.rule},
          {"rule_hash", c.rule_hash},
          {"severity", severity_name(c.severity)},
          {"category", c.category},
          {"source", c.op || c.source != Source::kUnknown ? source_name(c.source) : ""},
          {"op", c.op ? op_name(c.source, c.op) : ""},
          {"pid", c.pid},
          {"tid", c.tid},
          {"process", c.pid ? process_label(meta, c.pid) : ""},
          {"node", node},
          {"rank", c.rank},
          {"window_start_ns", c.window_start},
          {"window_end_ns", c.window_end},
          {"summary", c.summary},
          {"root_cause", c.root_cause},
          {"explanation", c.explanation},
          {"recommendations", c.recommendations},
          {"evidence", evidence},
          {"predicates", predicates},
          {"values", values},
          {"p50_ns", c.p50_ns},
          {"p99_ns", c.p99_ns},
          {"tail_ratio", num_or_null(c.tail_ratio)},
          {"dropped_events", c.dropped_events},
          {"threads", threads_json(c.threads)},
          {"stacks", stacks},
          {"time_split", time_split_json(c.time_split)},
          {"accounting", c.accounting ? thread_accounting_json(*c.accounting, meta) : json(nullptr)},
          {"over_time", c.over_time}};
}

json rule_outcome_json(const RuleOutcome& o) {
  json j = {{"rule", o.rule},       {"rule_hash", o.rule_hash}, {"category", o.category},
            {"windows", o.windows}, {"chains", o.chains},       {"over_time", o.over_time}};
  if (o.has_miss) {
    json values = json::object();
    for (const auto& [k, v] : o.miss_values) values[k] = num_or_null(v);
    j["closest_miss"] = {{"stage", o.miss_stage},
                         {"predicate", o.miss.label},
                         {"value", num_or_null(o.miss.lhs)},
                         {"threshold", num_or_null(o.miss.rhs)},
                         {"margin", num_or_null(o.miss.margin)},
                         {"key", o.miss_key},
                         {"window_start_ns", o.miss_window_start},
                         {"window_end_ns", o.miss_window_end},
                         {"values", values}};
  } else {
    j["closest_miss"] = nullptr;
  }
  return j;
}

json thread_accounting_json(const ThreadAccounting& a, const TraceMeta& meta) {
  json by = json::array();
  for (const auto& p : a.preempted_by) by.push_back({{"pid", p.pid}, {"tid", p.tid}, {"comm", p.comm}, {"ns", p.ns}});
  return {{"pid", a.pid},
          {"tid", a.tid},
          {"comm", a.comm},
          {"node", a.node < meta.nodes.size() ? meta.nodes[a.node] : std::to_string(a.node)},
          {"rank", a.rank},
          {"start_ns", a.start_ns},
          {"end_ns", a.end_ns},
          {"wall_ns", a.wall_ns},
          {"in_calls_ns", a.in_calls_ns},
          {"on_cpu_ns", a.on_cpu_ns},
          {"preempted_ns", a.preempted_ns},
          {"preempted_by", by},
          {"blocked_ns", a.blocked_ns},
          {"unknown_ns", a.unknown_ns},
          {"scheduler_data", a.scheduler_data}};
}

ThreadAccounting thread_accounting_from_json(const json& j, const TraceMeta& meta, uint16_t fallback_node) {
  ThreadAccounting a;
  if (!j.is_object()) return a;
  a.pid = static_cast<uint32_t>(u64_of(j, "pid"));
  a.tid = static_cast<uint32_t>(u64_of(j, "tid"));
  a.comm = str_of(j, "comm");
  a.node = fallback_node;
  const std::string node = str_of(j, "node");
  for (size_t i = 0; i < meta.nodes.size(); ++i)
    if (meta.nodes[i] == node) {
      a.node = static_cast<uint16_t>(i);
      break;
    }
  if (auto it = j.find("rank"); it != j.end() && it->is_number_integer())
    a.rank = static_cast<int16_t>(std::clamp<int64_t>(it->get<int64_t>(), -1, INT16_MAX));
  a.start_ns = u64_of(j, "start_ns");
  a.end_ns = u64_of(j, "end_ns");
  a.wall_ns = u64_of(j, "wall_ns");
  auto ns_map = [&j](const char* key) {
    std::map<std::string, uint64_t> m;
    if (auto it = j.find(key); it != j.end() && it->is_object())
      for (auto kv = it->begin(); kv != it->end(); ++kv)
        if (kv->is_number_unsigned() || kv->is_number_integer()) m[kv.key()] = u64_of(*it, kv.key().c_str());
    return m;
  };
  a.in_calls_ns = ns_map("in_calls_ns");
  a.blocked_ns = ns_map("blocked_ns");
  a.on_cpu_ns = u64_of(j, "on_cpu_ns");
  a.preempted_ns = u64_of(j, "preempted_ns");
  a.unknown_ns = u64_of(j, "unknown_ns");
  if (auto it = j.find("preempted_by"); it != j.end() && it->is_array())
    for (const auto& p : *it)
      if (p.is_object())
        a.preempted_by.push_back({static_cast<uint32_t>(u64_of(p, "pid")), static_cast<uint32_t>(u64_of(p, "tid")),
                                  str_of(p, "comm"), u64_of(p, "ns")});
  auto sd = j.find("scheduler_data");
  a.scheduler_data = sd != j.end() && sd->is_boolean() && sd->get<bool>();
  return a;
}

json stats_json(const AnalysisResult& r) {
  json ops = json::array();
  for (const auto& s : r.ops) ops.push_back(op_stats_json(s));
  return {{"trace", trace_json(r.meta, r)}, {"ops", ops}, {"health", health_json(r.meta.health)}};
}

json steps_json(const std::vector<ProcessSteps>& steps, const TraceMeta& meta) {
  json out = json::array();
  for (const auto& s : steps)
    out.push_back({{"pid", s.pid},
                   {"node", s.node < meta.nodes.size() ? meta.nodes[s.node] : std::string()},
                   {"rank", s.rank},
                   {"count", s.count},
                   {"period_ns", s.period_ns},
                   {"p50_ns", s.p50_ns},
                   {"p99_ns", s.p99_ns},
                   {"method", s.method},
                   {"confidence", num_or_null(s.confidence)},
                   {"reason", s.reason},
                   {"epochs", s.epochs}});
  return out;
}

json incident_json(const Incident& in, const TraceMeta& meta) {
  json chains = json::array();
  for (const auto& id : in.chains) chains.push_back(id);
  return {{"id", in.id},
          {"rule", in.rule},
          {"category", in.category},
          {"severity", severity_name(in.severity)},
          {"pid", in.pid},
          {"tid", in.tid},
          {"node", in.node < meta.nodes.size() ? meta.nodes[in.node] : ""},
          {"rank", in.rank},
          {"start_ns", in.start_ns},
          {"end_ns", in.end_ns},
          {"steps", in.steps},
          {"lost_ns", in.lost_ns},
          {"lost_basis", in.lost_basis},
          {"lost_share", num_or_null(in.lost_share)},
          {"gpus", num_or_null(in.gpus)},
          {"gpus_from", in.gpus_from},
          {"gpu_hours", num_or_null(in.gpu_hours)},
          {"cost", in.cost ? num_or_null(*in.cost) : json(nullptr)},
          {"currency", in.cost ? json(in.currency) : json(nullptr)},
          {"step_ns", in.step_ns ? json(in.step_ns) : json(nullptr)},
          {"what_if_step_ns", in.what_if_step_ns ? json(*in.what_if_step_ns) : json(nullptr)},
          {"summary", in.summary},
          {"chains", chains}};
}

json explain_json(const AnalysisResult& r) {
  json chains = json::array();
  for (const auto& c : r.chains) chains.push_back(chain_json(c, r.meta));
  json rules = json::array();
  for (const auto& o : r.rules) rules.push_back(rule_outcome_json(o));
  json accounting = json::array();
  for (const auto& a : r.accounting) accounting.push_back(thread_accounting_json(a, r.meta));
  json counts = {{"HIGH", 0}, {"MEDIUM", 0}, {"LOW", 0}};
  for (const auto& c : r.chains) counts[severity_name(c.severity)] = counts[severity_name(c.severity)].get<int>() + 1;
  json out = {{"trace", trace_json(r.meta, r)},
              {"chains", chains},
              {"severity_counts", counts},
              {"rules", rules},
              {"health", health_json(r.meta.health)},
              {"accounting", accounting},
              {"engine",
               {{"threads", r.counters.threads},
                {"batches", r.counters.batches},
                {"windows_closed", r.counters.windows_closed},
                {"late_events", r.counters.late_events},
                {"tail_windows_capped", r.counters.tail_windows_capped},
                {"node_errors", r.counters.node_errors}}}};
  if (!r.steps.empty()) out["steps"] = steps_json(r.steps, r.meta);
  json incidents = json::array();
  for (const auto& in : r.incidents) incidents.push_back(incident_json(in, r.meta));
  out["incidents"] = incidents;
  out["verdict"] = r.verdict;
  out["bound"] = r.bound;
  return out;
}

}  // namespace ingero
