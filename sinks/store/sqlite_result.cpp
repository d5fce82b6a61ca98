// read_result: loads stored analysis results (ours from ip_*, Ingero's from causal_chains).
#include <algorithm>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "model/predicate_json.h"
#include "model/result_json.h"
#include "sinks/store/sqlite_store.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {
namespace {

using nlohmann::json;
using sqlite_detail::Stmt;

Severity parse_severity(const std::string& s) {
  if (s == "HIGH") return Severity::kHigh;
  if (s == "LOW") return Severity::kLow;
  return Severity::kMedium;
}

json parse_json(const std::string& text, const json& fallback) {
  auto j = json::parse(text, nullptr, false);
  return j.is_discarded() ? fallback : j;
}

double num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<uint64_t> ids(const json& j) {
  std::vector<uint64_t> out;
  if (auto it = j.find("event_ids"); it != j.end() && it->is_array())
    for (const auto& x : *it)
      if (x.is_number_unsigned() || x.is_number_integer()) out.push_back(x.get<uint64_t>());
  return out;
}

std::vector<std::string> strings(const json& j) {
  std::vector<std::string> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_string()) out.push_back(x.get<std::string>());
  return out;
}

std::map<std::string, uint64_t> ns_map(const json& j) {
  std::map<std::string, uint64_t> m;
  if (!j.is_object()) return m;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_number_unsigned()) {
      m[it.key()] = it->get<uint64_t>();
    } else if (it->is_number_integer()) {
      m[it.key()] = static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
    }
  }
  return m;
}

uint64_t u64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) return static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
  return 0;
}

// ip_accounting (written since the time accounting; absent from older databases).
bool read_accounting(sqlite3* db, AnalysisResult& r, std::string& error) {
  if (!sqlite_detail::table_exists(db, "ip_accounting")) return true;
  Stmt s(db,
         "SELECT node_index, pid, tid, comm, rank, start_ns, end_ns, wall_ns, in_calls_ns, on_cpu_ns, preempted_ns, "
         "preempted_by, blocked_ns, unknown_ns, scheduler_data FROM ip_accounting ORDER BY position, rowid");
  if (!s.ok()) return error = "cannot read ip_accounting: " + s.error(), false;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    ThreadAccounting a;
    a.node = static_cast<uint16_t>(s.i64(0));
    a.pid = static_cast<uint32_t>(s.i64(1));
    a.tid = static_cast<uint32_t>(s.i64(2));
    a.comm = s.text(3);
    a.rank = s.is_null(4) ? int16_t{-1} : static_cast<int16_t>(s.i64(4));
    a.start_ns = static_cast<uint64_t>(s.i64(5));
    a.end_ns = static_cast<uint64_t>(s.i64(6));
    a.wall_ns = static_cast<uint64_t>(s.i64(7));
    a.in_calls_ns = ns_map(parse_json(s.text(8), json::object()));
    a.on_cpu_ns = static_cast<uint64_t>(s.i64(9));
    a.preempted_ns = static_cast<uint64_t>(s.i64(10));
    for (const auto& p : parse_json(s.text(11), json::array()))
      if (p.is_object())
        a.preempted_by.push_back(
            {static_cast<uint32_t>(u64(p, "pid")), static_cast<uint32_t>(u64(p, "tid")), str(p, "comm"), u64(p, "ns")});
    a.blocked_ns = ns_map(parse_json(s.text(12), json::object()));
    a.unknown_ns = static_cast<uint64_t>(s.i64(13));
    a.scheduler_data = s.i64(14) != 0;
    r.accounting.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  return true;
}

// ip_steps (absent from older databases).
bool read_steps(sqlite3* db, AnalysisResult& r, std::string& error) {
  if (!sqlite_detail::table_exists(db, "ip_steps")) return true;
  const auto cols = sqlite_detail::table_columns(db, "ip_steps");
  const bool has_epochs = std::find(cols.begin(), cols.end(), "epochs") != cols.end();
  Stmt s(db, std::string("SELECT node_index, pid, rank, count, period_ns, p50_ns, p99_ns, method, reason, confidence, "
                         "boundaries, fallback_interval_ns, first_ns, last_ns, ") +
                 (has_epochs ? "epochs" : "0") + " FROM ip_steps ORDER BY position, rowid");
  if (!s.ok()) return error = "cannot read ip_steps: " + s.error(), false;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    ProcessSteps p;
    p.node = static_cast<uint16_t>(s.i64(0));
    p.pid = static_cast<uint32_t>(s.i64(1));
    p.rank = s.is_null(2) ? int16_t{-1} : static_cast<int16_t>(s.i64(2));
    p.count = static_cast<uint64_t>(s.i64(3));
    p.period_ns = static_cast<uint64_t>(s.i64(4));
    p.p50_ns = static_cast<uint64_t>(s.i64(5));
    p.p99_ns = static_cast<uint64_t>(s.i64(6));
    p.method = s.text(7);
    p.reason = s.text(8);
    p.confidence = s.f64(9);
    for (const auto& b : parse_json(s.text(10), json::array()))
      if (b.is_number_unsigned() || b.is_number_integer()) p.boundaries.push_back(b.get<uint64_t>());
    p.fallback_interval_ns = static_cast<uint64_t>(s.i64(11));
    p.first_ns = static_cast<uint64_t>(s.i64(12));
    p.last_ns = static_cast<uint64_t>(s.i64(13));
    p.epochs = static_cast<uint64_t>(s.i64(14));
    r.steps.push_back(std::move(p));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  return true;
}

// ip_incidents (absent from older databases; step_ns added later).
bool read_incidents(sqlite3* db, AnalysisResult& r, std::string& error) {
  if (!sqlite_detail::table_exists(db, "ip_incidents")) return true;
  const auto cols = sqlite_detail::table_columns(db, "ip_incidents");
  const bool has_step = std::find(cols.begin(), cols.end(), "step_ns") != cols.end();
  Stmt s(db, std::string("SELECT id, rule, category, severity, pid, tid, node, rank, start_ns, end_ns, steps, lost_ns, "
                         "lost_basis, lost_share, gpus, gpus_from, gpu_hours, cost, currency, what_if_step_ns, "
                         "summary, chains, ") +
                 (has_step ? "step_ns" : "NULL") + " FROM ip_incidents ORDER BY position, rowid");
  if (!s.ok()) return error = "cannot read ip_incidents: " + s.error(), false;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    Incident in;
    in.id = s.text(0);
    in.rule = s.text(1);
    in.category = s.text(2);
    const std::string sev = s.text(3);
    in.severity = sev == "HIGH" ? Severity::kHigh : sev == "LOW" ? Severity::kLow : Severity::kMedium;
    in.pid = static_cast<uint32_t>(s.i64(4));
    in.tid = static_cast<uint32_t>(s.i64(5));
    const std::string node = s.text(6);
    for (size_t k = 0; k < r.meta.nodes.size(); ++k)
      if (r.meta.nodes[k] == node) in.node = static_cast<uint16_t>(k);
    in.rank = s.is_null(7) ? int16_t{-1} : static_cast<int16_t>(s.i64(7));
    in.start_ns = static_cast<uint64_t>(s.i64(8));
    in.end_ns = static_cast<uint64_t>(s.i64(9));
    in.steps = static_cast<uint64_t>(s.i64(10));
    in.lost_ns = static_cast<uint64_t>(s.i64(11));
    in.lost_basis = s.text(12);
    in.lost_share = s.f64(13);
    in.gpus = s.f64(14);
    in.gpus_from = s.text(15);
    in.gpu_hours = s.f64(16);
    if (!s.is_null(17)) {
      in.cost = s.f64(17);
      in.currency = s.text(18);
    }
    if (!s.is_null(19)) in.what_if_step_ns = static_cast<uint64_t>(s.i64(19));
    in.summary = s.text(20);
    for (const auto& id : parse_json(s.text(21), json::array()))
      if (id.is_string()) in.chains.push_back(id.get<std::string>());
    if (!s.is_null(22)) in.step_ns = static_cast<uint64_t>(s.i64(22));
    r.incidents.push_back(std::move(in));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  return true;
}

bool read_ours(sqlite3* db, AnalysisResult& r, std::string& error) {
  {
    Stmt s(db, "SELECT key, value FROM ip_meta");
    while (s.ok() && s.step() == SQLITE_ROW) {
      const std::string k = s.text(0), v = s.text(1);
      if (k == "format") {
        r.meta.format = v;
      } else if (k == "nodes") {
        const json j = parse_json(v, json::array());
        if (j.is_array() && !j.empty()) {
          r.meta.nodes.clear();
          for (const auto& x : j) r.meta.nodes.push_back(x.is_string() ? x.get<std::string>() : "");
        }
      } else if (k == "verdict") {
        const json j = parse_json(v, json::object());
        if (j.is_object()) {
          r.verdict = j.value("text", "");
          r.bound = j.value("bound", "");
        }
      } else if (k == "engine_counters") {
        const json j = parse_json(v, json::object());
        auto u = [&](const char* key) {
          auto it = j.find(key);
          return it != j.end() && it->is_number() ? it->get<uint64_t>() : uint64_t{0};
        };
        r.counters.events_in = u("events_in");
        r.counters.batches = u("batches");
        r.counters.windows_closed = u("windows_closed");
        r.counters.late_events = u("late_events");
        r.counters.node_errors = u("node_errors");
        r.counters.evicted_spans = u("evicted_spans");
        r.counters.tail_windows_capped = u("tail_windows_capped");
        r.counters.threads = static_cast<unsigned>(u("threads"));
      } else if (k == "first_ts") {
        r.meta.first_ts = std::strtoull(v.c_str(), nullptr, 10);
      } else if (k == "last_ts") {
        r.meta.last_ts = std::strtoull(v.c_str(), nullptr, 10);
      }
    }
  }
  if (sqlite_detail::table_exists(db, "ip_op_stats")) {
    Stmt s(db,
           "SELECT source, op, count, p50_ns, p95_ns, p99_ns, min_ns, max_ns, total_ns, "
           "tail_ratio, exact, rel_error, errors FROM ip_op_stats ORDER BY source, op");
    if (!s.ok()) return error = "cannot read ip_op_stats: " + s.error(), false;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      OpStats o;
      o.source = static_cast<Source>(s.i64(0));
      o.op = static_cast<uint8_t>(s.i64(1));
      o.count = static_cast<uint64_t>(s.i64(2));
      o.p50_ns = static_cast<uint64_t>(s.i64(3));
      o.p95_ns = static_cast<uint64_t>(s.i64(4));
      o.p99_ns = static_cast<uint64_t>(s.i64(5));
      o.min_ns = static_cast<uint64_t>(s.i64(6));
      o.max_ns = static_cast<uint64_t>(s.i64(7));
      o.total_ns = static_cast<uint64_t>(s.i64(8));
      o.tail_ratio = s.f64(9);
      o.exact = s.i64(10) != 0;
      o.rel_error = s.f64(11);
      o.errors = static_cast<uint64_t>(s.i64(12));
      r.ops.push_back(o);
    }
    if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  }
  // threads/stacks/time_split, then accounting/over_time were added later: older databases read
  // without them.
  const auto chain_cols = sqlite_detail::table_columns(db, "ip_chains");
  const auto has_col = [&chain_cols](const char* c) {
    return std::find(chain_cols.begin(), chain_cols.end(), c) != chain_cols.end();
  };
  const bool has_where = has_col("stacks");
  const bool has_accounting = has_col("accounting") && has_col("over_time");
  Stmt s(db, std::string("SELECT id, rule, rule_hash, severity, category, source, op, pid, tid, node_index, rank, "
                         "window_start, window_end, summary, root_cause, explanation, recommendations, evidence, "
                         "predicates, slot_values, p50_ns, p99_ns, tail_ratio, dropped_events, ") +
                 (has_where ? "threads, stacks, time_split" : "'[]', '[]', 'null'") +
                 (has_accounting ? ", accounting, over_time" : ", 'null', 0") +
                 " FROM ip_chains ORDER BY position, rowid");
  if (!s.ok()) return error = "cannot read ip_chains: " + s.error(), false;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    Chain c;
    c.id = s.text(0);
    c.rule = s.text(1);
    c.rule_hash = s.text(2);
    c.severity = parse_severity(s.text(3));
    c.category = s.text(4);
    c.source = static_cast<Source>(s.i64(5));
    c.op = static_cast<uint8_t>(s.i64(6));
    c.pid = static_cast<uint32_t>(s.i64(7));
    c.tid = static_cast<uint32_t>(s.i64(8));
    c.node = static_cast<uint16_t>(s.i64(9));
    c.rank = s.is_null(10) ? int16_t{-1} : static_cast<int16_t>(s.i64(10));
    c.window_start = static_cast<uint64_t>(s.i64(11));
    c.window_end = static_cast<uint64_t>(s.i64(12));
    c.summary = s.text(13);
    c.root_cause = s.text(14);
    c.explanation = s.text(15);
    c.recommendations = strings(parse_json(s.text(16), json::array()));
    for (const auto& e : parse_json(s.text(17), json::array()))
      if (e.is_object())
        c.evidence.push_back({str(e, "kind"), str(e, "detail"), num(e, "value"), str(e, "unit"), ids(e)});
    for (const auto& p : parse_json(s.text(18), json::array()))
      if (p.is_object()) c.predicates.push_back(predicate_from_json(p));
    for (const auto& v : parse_json(s.text(19), json::array()))
      if (v.is_object()) c.values.emplace_back(str(v, "name"), num(v, "value"));
    c.p50_ns = static_cast<uint64_t>(s.i64(20));
    c.p99_ns = static_cast<uint64_t>(s.i64(21));
    c.tail_ratio = s.f64(22);
    c.dropped_events = static_cast<uint64_t>(s.i64(23));
    chain_where_from_json(parse_json(s.text(24), json::array()), parse_json(s.text(25), json::array()),
                          parse_json(s.text(26), json(nullptr)), c);
    if (const json a = parse_json(s.text(27), json(nullptr)); a.is_object())
      c.accounting = thread_accounting_from_json(a, r.meta, c.node);
    c.over_time = s.i64(28) != 0;
    r.chains.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  if (!read_accounting(db, r, error) || !read_steps(db, r, error) || !read_incidents(db, r, error)) return false;
  if (!sqlite_detail::table_exists(db, "ip_rule_outcomes")) return true;      // written before it existed
  const auto ro_cols = sqlite_detail::table_columns(db, "ip_rule_outcomes");  // over_time: added later
  const bool ro_over_time = std::find(ro_cols.begin(), ro_cols.end(), "over_time") != ro_cols.end();
  Stmt ro(db, std::string("SELECT rule, rule_hash, category, windows, chains, has_miss, miss_stage, miss, miss_key, "
                          "miss_window_start, miss_window_end, miss_values, ") +
                  (ro_over_time ? "over_time" : "0") + " FROM ip_rule_outcomes ORDER BY position, rowid");
  if (!ro.ok()) return error = "cannot read ip_rule_outcomes: " + ro.error(), false;
  while ((rc = ro.step()) == SQLITE_ROW) {
    RuleOutcome o;
    o.rule = ro.text(0);
    o.rule_hash = ro.text(1);
    o.category = ro.text(2);
    o.windows = static_cast<uint64_t>(ro.i64(3));
    o.chains = static_cast<uint64_t>(ro.i64(4));
    o.has_miss = ro.i64(5) != 0;
    o.miss_stage = static_cast<int>(ro.i64(6));
    const json m = parse_json(ro.text(7), json::object());
    if (m.is_object()) o.miss = predicate_from_json(m);
    o.miss_key = ro.text(8);
    o.miss_window_start = static_cast<uint64_t>(ro.i64(9));
    o.miss_window_end = static_cast<uint64_t>(ro.i64(10));
    for (const auto& v : parse_json(ro.text(11), json::array()))
      if (v.is_object()) o.miss_values.emplace_back(str(v, "name"), num(v, "value"));
    o.over_time = ro.i64(12) != 0;
    r.rules.push_back(std::move(o));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  return true;
}

// Ingero's own chains: what its live correlator concluded. No predicates or exemplars exist;
// the timeline rows become evidence items.
bool read_ingero(sqlite3* db, AnalysisResult& r, std::string& error) {
  const auto cols = sqlite_detail::table_columns(db, "causal_chains");
  const bool has_node = std::find(cols.begin(), cols.end(), "node") != cols.end();
  Stmt s(db, std::string("SELECT id, detected_at, severity, summary, root_cause, explanation, "
                         "recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, ") +
                 (has_node ? "node" : "''") + " FROM causal_chains ORDER BY detected_at, id");
  if (!s.ok()) return error = "cannot read causal_chains: " + s.error(), false;
  r.meta.format = has_node ? "ingero-0.9" : "ingero-0.8";
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    Chain c;
    c.id = s.text(0);
    c.rule = "ingero";
    c.window_end = static_cast<uint64_t>(s.i64(1));
    c.window_start = c.window_end;
    c.severity = parse_severity(s.text(2));
    c.summary = s.text(3);
    c.root_cause = s.text(4);
    c.explanation = s.text(5);
    c.recommendations = strings(parse_json(s.text(6), json::array()));
    if (const auto* info = find_op(s.text(7))) {
      c.source = info->source;
      c.op = info->op;
    }
    c.p99_ns = static_cast<uint64_t>(s.i64(8)) * 1000;
    c.p50_ns = static_cast<uint64_t>(s.i64(9)) * 1000;
    c.tail_ratio = s.f64(10);
    for (const auto& t : parse_json(s.text(11), json::array())) {
      if (!t.is_object()) continue;
      const std::string op = str(t, "op");
      std::string kind = op == "sched_switch" ? "offcpu" : op == "block_io" ? "block_io" : op;
      if (find_op(op) && find_op(op)->source == c.source && c.op && find_op(op)->op == c.op) kind = "tail";
      c.evidence.push_back({kind, str(t, "detail"), num(t, "dur_us") * 1000, "ns", {}});
    }
    c.node = r.meta.node_index(s.text(12));
    r.chains.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE) return error = sqlite_detail::describe_sqlite_error(db, rc), false;
  return true;
}

}  // namespace

bool read_result(const std::string& path, AnalysisResult& result, std::string& error) {
  const std::string shown = path.empty() ? "(empty path)" : path;
  try {
    const auto probe = sqlite_detail::probe_sqlite_file(path);
    if (!probe.problem.empty()) return error = shown + ": " + probe.problem, false;
    std::string why;
    auto db = sqlite_detail::open_readonly(path, probe, why);
    if (!db) return error = shown + ": " + why, false;
    AnalysisResult r;
    r.meta.path = path;
    bool ok;
    if (sqlite_detail::table_exists(db.get(), "ip_chains")) ok = read_ours(db.get(), r, why);
    else if (sqlite_detail::table_exists(db.get(), "causal_chains")) ok = read_ingero(db.get(), r, why);
    else return error = shown + ": no stored results (neither ip_chains nor causal_chains table)", false;
    if (!ok) return error = shown + ": " + why, false;
    result = std::move(r);
    return true;
  } catch (const std::exception& e) {
    error = shown + ": cannot load results (" + e.what() + ")";
    return false;
  }
}

}  // namespace ingero
