// SqliteSink: writes an Ingero-0.9-compatible database plus our ip_* tables.
// See sinks/store/sqlite_store.h for the contract and docs/storage.md for the tables.
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/format.h"
#include "model/ops.h"
#include "model/predicate_json.h"
#include "model/result_json.h"
#include "sinks/store/sqlite_schema.h"
#include "sinks/store/sqlite_store.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {

using nlohmann::json;
using sqlite_detail::Stmt;

struct SqliteSink::Impl {
  sqlite_detail::Db db;
  Stmt insert_event;
  std::vector<std::string> nodes{""};
  // events.id prefix per node ("" for the unnamed node, else "name:"): built once per
  // write_meta so the per-event path formats ids without allocating.
  std::vector<std::string> id_prefixes{""};
  std::string id;        // reused buffer for one event's id
  std::string fallback;  // name of a node index the meta does not list ("node#N")
  bool meta_written = false;
  bool indexes_built = false;

  void set_nodes(std::vector<std::string> names) {
    nodes = names.empty() ? std::vector<std::string>{""} : std::move(names);
    id_prefixes.clear();
    for (const auto& n : nodes) id_prefixes.push_back(n.empty() ? n : n + ":");
  }
};

namespace {

constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Decides whether create() may replace what is at `path`. Returns "" when it may (or nothing is
// there); a message otherwise. Only SQLite files (or empty ones) are replaced: a typo that points
// --out at a source file or a report must not destroy it.
std::string check_target(const std::string& path, bool overwrite, bool& exists) {
  struct stat st {};
  exists = false;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return std::string("cannot access: ") + std::strerror(errno);
  }
  exists = true;
  if (S_ISDIR(st.st_mode)) return "is a directory; give a file path for the database";
  if (!S_ISREG(st.st_mode)) return "not a regular file; refusing to write there";
  if (!overwrite) return "already exists (refusing to overwrite)";
  if (st.st_size == 0) return {};
  std::ifstream in(path, std::ios::binary);
  char magic[16] = {};
  in.read(magic, sizeof magic);
  if (in.gcount() != 16 || std::memcmp(magic, "SQLite format 3", 16) != 0)
    return "exists and is not a SQLite database; refusing to overwrite it";
  return {};
}

std::string timeline_layer(const Chain& c, const EvidenceItem& ev, std::string& op) {
  // Ingero's timeline rows name a layer (source) and an op; our evidence kinds map onto them.
  if (ev.kind == "tail") {
    op = c.op ? op_name(c.source, c.op) : "";
    return source_name(c.source);
  }
  if (ev.kind == "offcpu") return op = "sched_switch", "HOST";
  if (ev.kind == "block_io") return op = "block_io", "IO";
  if (ev.kind == "tcp") return op = "tcp_retransmit", "TCP";
  if (ev.kind == "net") return op = "net_io", "NET";
  if (ev.kind == "memory" || ev.kind == "page_alloc") return op = "mm_page_alloc", "HOST";
  op = ev.kind;
  return "";
}

json evidence_json(const std::vector<EvidenceItem>& evidence) {
  json a = json::array();
  for (const auto& ev : evidence)
    a.push_back({{"kind", ev.kind},
                 {"detail", ev.detail},
                 {"value", ev.value},
                 {"unit", ev.unit},
                 {"event_ids", ev.event_ids}});
  return a;
}

std::string node_name_of(const TraceMeta& names, uint16_t node) {
  return node < names.nodes.size() ? names.nodes[node] : "node#" + std::to_string(node);
}

// ip_accounting: one row per main feeding thread (result.accounting), replaced.
bool write_accounting(sqlite3* db, const AnalysisResult& r, const TraceMeta& names, std::string& why) {
  if (!sqlite_detail::exec(db, "DELETE FROM ip_accounting", why)) return false;
  Stmt st(db,
          "INSERT OR REPLACE INTO ip_accounting(position, node, node_index, pid, tid, comm, rank, start_ns, end_ns, "
          "wall_ns, in_calls_total_ns, in_calls_ns, on_cpu_ns, preempted_ns, preempted_by, blocked_total_ns, "
          "blocked_ns, unknown_ns, scheduler_data) "
          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)");
  if (!st.ok()) return why = st.error(), false;
  int64_t position = 0;
  for (const auto& a : r.accounting) {
    json by = json::array();
    for (const auto& p : a.preempted_by) by.push_back({{"pid", p.pid}, {"tid", p.tid}, {"comm", p.comm}, {"ns", p.ns}});
    st.bind(1, position++);
    st.bind(2, node_name_of(names, a.node));
    st.bind(3, static_cast<int64_t>(a.node));
    st.bind(4, static_cast<int64_t>(a.pid));
    st.bind(5, static_cast<int64_t>(a.tid));
    st.bind(6, a.comm);
    if (a.rank < 0) st.bind_null(7);
    else st.bind(7, static_cast<int64_t>(a.rank));
    st.bind_u64(8, a.start_ns);
    st.bind_u64(9, a.end_ns);
    st.bind_u64(10, a.wall_ns);
    st.bind_u64(11, a.in_calls_total());
    st.bind(12, json(a.in_calls_ns).dump());
    st.bind_u64(13, a.on_cpu_ns);
    st.bind_u64(14, a.preempted_ns);
    st.bind(15, by.dump());
    st.bind_u64(16, a.blocked_total());
    st.bind(17, json(a.blocked_ns).dump());
    st.bind_u64(18, a.unknown_ns);
    st.bind(19, static_cast<int64_t>(a.scheduler_data ? 1 : 0));
    const int rc = st.step();
    st.reset();
    if (rc != SQLITE_DONE) return why = sqlite3_errmsg(db), false;
  }
  return true;
}

// ip_incidents: one row per incident of the result (kIncidentsSql), replaced.
bool write_incidents(sqlite3* db, const AnalysisResult& r, const TraceMeta& names, std::string& why) {
  if (!sqlite_detail::exec(db, sqlite_detail::kIncidentsSql, why) ||
      !sqlite_detail::exec(db, "DELETE FROM ip_incidents", why))
    return false;
  Stmt st(db,
          "INSERT INTO ip_incidents(position, id, rule, category, severity, pid, tid, node, rank, start_ns, end_ns, "
          "steps, lost_ns, lost_basis, lost_share, gpus, gpus_from, gpu_hours, cost, currency, what_if_step_ns, "
          "summary, chains, step_ns) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
          "?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)");
  if (!st.ok()) return why = st.error(), false;
  int64_t position = 0;
  auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };
  for (const auto& in : r.incidents) {
    st.bind(1, position++);
    st.bind(2, in.id);
    st.bind(3, in.rule);
    st.bind(4, in.category);
    st.bind(5, std::string(severity_name(in.severity)));
    st.bind(6, static_cast<int64_t>(in.pid));
    st.bind(7, static_cast<int64_t>(in.tid));
    st.bind(8, node_name_of(names, in.node));
    if (in.rank < 0) st.bind_null(9);
    else st.bind(9, static_cast<int64_t>(in.rank));
    st.bind_u64(10, in.start_ns);
    st.bind_u64(11, in.end_ns);
    st.bind_u64(12, in.steps);
    st.bind_u64(13, in.lost_ns);
    st.bind(14, in.lost_basis);
    st.bind(15, finite(in.lost_share));
    st.bind(16, finite(in.gpus));
    st.bind(17, in.gpus_from);
    st.bind(18, finite(in.gpu_hours));
    if (in.cost) {
      st.bind(19, finite(*in.cost));
      st.bind(20, in.currency);
    } else {
      st.bind_null(19);
      st.bind_null(20);
    }
    if (in.what_if_step_ns) st.bind_u64(21, *in.what_if_step_ns);
    else st.bind_null(21);
    st.bind(22, in.summary);
    st.bind(23, json(in.chains).dump());
    if (in.step_ns) st.bind_u64(24, in.step_ns);
    else st.bind_null(24);
    const int rc = st.step();
    st.reset();
    if (rc != SQLITE_DONE) return why = sqlite3_errmsg(db), false;
  }
  return true;
}

// ip_steps: one row per process (and rank) of result.steps, replaced.
bool write_steps(sqlite3* db, const AnalysisResult& r, const TraceMeta& names, std::string& why) {
  if (!sqlite_detail::exec(db, "DELETE FROM ip_steps", why)) return false;
  Stmt st(db,
          "INSERT INTO ip_steps(position, node, node_index, pid, rank, count, period_ns, p50_ns, p99_ns, method, "
          "reason, confidence, boundaries, fallback_interval_ns, first_ns, last_ns, epochs) "
          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)");
  if (!st.ok()) return why = st.error(), false;
  int64_t position = 0;
  for (const auto& s : r.steps) {
    st.bind(1, position++);
    st.bind(2, node_name_of(names, s.node));
    st.bind(3, static_cast<int64_t>(s.node));
    st.bind(4, static_cast<int64_t>(s.pid));
    if (s.rank < 0) st.bind_null(5);
    else st.bind(5, static_cast<int64_t>(s.rank));
    st.bind_u64(6, s.count);
    st.bind_u64(7, s.period_ns);
    st.bind_u64(8, s.p50_ns);
    st.bind_u64(9, s.p99_ns);
    st.bind(10, s.method);
    st.bind(11, s.reason);
    st.bind(12, std::isfinite(s.confidence) ? s.confidence : 0.0);
    st.bind(13, json(s.boundaries).dump());
    st.bind_u64(14, s.fallback_interval_ns);
    st.bind_u64(15, s.first_ns);
    st.bind_u64(16, s.last_ns);
    st.bind_u64(17, s.epochs);
    const int rc = st.step();
    st.reset();
    if (rc != SQLITE_DONE) return why = sqlite3_errmsg(db), false;
  }
  return true;
}

}  // namespace

SqliteSink::SqliteSink(std::string path, Options options)
    : path_(std::move(path)), options_(options), impl_(std::make_unique<Impl>()) {}

SqliteSink::~SqliteSink() {
  std::string ignored;
  close(ignored);
}

std::unique_ptr<SqliteSink> SqliteSink::create(const std::string& path, std::string& error) {
  return create(path, error, Options{});
}

std::unique_ptr<SqliteSink> SqliteSink::create(const std::string& path, std::string& error, const Options& options) {
  if (path.empty()) {
    error = "(empty path): no output database path given";
    return nullptr;
  }
  if (options.page_size < 512 || options.page_size > 65536 ||
      !std::has_single_bit(static_cast<unsigned>(options.page_size))) {
    error = path + ": page_size " + std::to_string(options.page_size) + " is not a power of two between 512 and 65536";
    return nullptr;
  }
  bool exists = false;
  if (auto problem = check_target(path, options.overwrite, exists); !problem.empty()) {
    error = path + ": " + problem;
    return nullptr;
  }
  if (exists) {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      const std::string p = path + suffix;
      if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
        error = p + ": cannot replace (" + std::strerror(errno) + ")";
        return nullptr;
      }
    }
  }
  std::unique_ptr<SqliteSink> sink(new SqliteSink(path, options));
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  sink->impl_->db.reset(raw);
  if (rc != SQLITE_OK) {
    error = path + ": cannot create database (" + sqlite_detail::describe_sqlite_error(raw, rc) + ")";
    return nullptr;
  }
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, 5000);
  std::string why;
  // The page size only takes effect before the first write, and WAL fixes it: set it first.
  // 16 KiB pages made the deferred index build about 10% cheaper here and the inserts no
  // slower (docs/storage.md); the page cache keeps SQLite's default byte budget (about 2 MB).
  // WAL: readers (replay, `query`) never block the writer, and a killed writer loses only the
  // transaction in flight. synchronous=NORMAL keeps commits durable against a process crash;
  // after a power cut the last transactions may be gone but the file stays consistent.
  std::string pragmas = "PRAGMA page_size=" + std::to_string(options.page_size) +
                        "; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;";
  if (options.wal_pages > 0)
    pragmas += " PRAGMA wal_autocheckpoint=" + std::to_string(options.wal_pages) +
               "; PRAGMA journal_size_limit=" + std::to_string(int64_t{options.wal_pages} * options.page_size) + ";";
  if (!sqlite_detail::exec(raw, pragmas.c_str(), why) || !sqlite_detail::exec(raw, "BEGIN", why) ||
      !sqlite_detail::exec(raw, sqlite_detail::kSchemaSql, why) ||
      (!options.defer_indexes && !sqlite_detail::exec(raw, sqlite_detail::kEventIndexSql, why))) {
    error = path + ": cannot create database (" + why + ")";
    return nullptr;
  }
  {
    Stmt src(raw, "INSERT INTO sources(id, name, description) VALUES(?1, ?2, ?3)");
    for (const auto& s : all_sources()) {
      src.bind(1, static_cast<int64_t>(s.source));
      src.bind(2, s.name);
      src.bind(3, s.description);
      if (src.step() != SQLITE_DONE) why = sqlite3_errmsg(raw);
      src.reset();
    }
    Stmt ops(raw, "INSERT INTO ops(source_id, op_id, name, description) VALUES(?1, ?2, ?3, ?4)");
    for (const auto& o : all_ops()) {
      ops.bind(1, static_cast<int64_t>(o.source));
      ops.bind(2, static_cast<int64_t>(o.op));
      ops.bind(3, o.name);
      ops.bind(4, o.description);
      if (ops.step() != SQLITE_DONE) why = sqlite3_errmsg(raw);
      ops.reset();
    }
    Stmt info(raw, "INSERT INTO schema_info(key, value) VALUES(?1, ?2)");
    const std::pair<const char*, std::string> rows[] = {
        {"version", "0.9"},
        {"timestamp_unit", "nanoseconds (Unix epoch)"},
        {"duration_unit", "nanoseconds"},
        {"writer", std::string("ingero-pipeline ") + kSqliteToolVersion + " (" + kSqliteStoreFormat + ")"},
        {"node_note", "events.id format: {node}:{seq}, or {seq} when the node is unnamed."},
        {"sched_switch_note",
         "HOST sched_switch rows follow Ingero: timestamp = switch-in time (end of the off-CPU "
         "interval), duration = time off CPU. prev_state says why the thread was off CPU."},
        {"ip_note",
         "ip_* tables are ingero-pipeline's: ip_chains, ip_incidents, ip_op_stats, ip_accounting, ip_steps, ip_meta, "
         "ip_health, ip_thread_names, ip_process_capture, ip_rule_outcomes, ip_annotations."},
    };
    for (const auto& [k, v] : rows) {
      info.bind(1, k);
      info.bind(2, v);
      if (info.step() != SQLITE_DONE) why = sqlite3_errmsg(raw);
      info.reset();
    }
    Stmt meta(raw, "INSERT INTO ip_meta(key, value) VALUES(?1, ?2)");
    const std::pair<const char*, std::string> meta_rows[] = {
        {"format", kSqliteStoreFormat},
        {"tool_version", kSqliteToolVersion},
        {"created_at_ns", std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count())},
        {"nodes", "[\"\"]"},
    };
    for (const auto& [k, v] : meta_rows) {
      meta.bind(1, k);
      meta.bind(2, v);
      if (meta.step() != SQLITE_DONE) why = sqlite3_errmsg(raw);
      meta.reset();
    }
  }
  if (!why.empty() || !sqlite_detail::exec(raw, "COMMIT", why)) {
    error = path + ": cannot create database (" + why + ")";
    return nullptr;
  }
  // The schema into the database file itself: a writer killed before SQLite's first automatic
  // checkpoint would otherwise leave a 0-byte file with everything in the WAL, which readers that
  // look at the file first (Ingero's, ours) refuse. Best effort: a failure only delays it.
  sqlite_detail::exec(raw, "PRAGMA wal_checkpoint(PASSIVE)", why);
  why.clear();
  sink->impl_->indexes_built = !options.defer_indexes;
  sink->impl_->insert_event = Stmt(
      raw,
      "INSERT INTO events(id, timestamp, pid, tid, source, op, duration, gpu_id, arg0, arg1, "
      "ret_code, stack_hash, node, rank, cgroup_id, prev_state, flags) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)");
  if (!sink->impl_->insert_event.ok()) {
    error = path + ": cannot prepare insert (" + sink->impl_->insert_event.error() + ")";
    return nullptr;
  }
  return sink;
}

bool SqliteSink::fail(const std::string& what) {
  error_ = path_ + ": " + what;
  return false;
}

bool SqliteSink::begin_if_needed() {
  if (in_txn_) return true;
  std::string why;
  if (!sqlite_detail::exec(impl_->db.get(), "BEGIN IMMEDIATE", why)) return fail("begin: " + why);
  in_txn_ = true;
  return true;
}

bool SqliteSink::commit_pending() {
  if (!in_txn_) return true;
  std::string why;
  if (!sqlite_detail::exec(impl_->db.get(), "COMMIT", why)) {
    // Leave the transaction to be retried (e.g. SQLITE_BUSY) rather than losing its events.
    return fail("commit: " + why);
  }
  in_txn_ = false;
  events_committed_ += pending_;
  pending_ = 0;
  return true;
}

bool SqliteSink::commit() {
  if (closed_) return fail("sink is closed");
  return commit_pending();
}

bool SqliteSink::write_events(std::span<const Event> events) {
  if (closed_) return fail("sink is closed");
  auto& st = impl_->insert_event;
  sqlite3_stmt* raw = st.get();
  Impl& im = *impl_;
  std::string& id = im.id;
  for (const Event& e : events) {
    // SQLite integers are signed 64-bit; times past year 2262 cannot be stored as Ingero does.
    uint64_t stored_ts = e.ts_ns;
    const bool is_switch = e.source == Source::kHost && e.op == op::kSchedSwitch;
    if (is_switch) stored_ts = e.ts_ns + e.dur_ns;  // Ingero's convention: the span's end
    if (e.ts_ns > kMaxI64 || e.dur_ns > kMaxI64 || stored_ts > kMaxI64 || stored_ts < e.ts_ns) {
      ++events_rejected_;
      continue;
    }
    if (!begin_if_needed()) return false;
    std::string_view node_name;
    if (e.node < im.nodes.size()) {
      node_name = im.nodes[e.node];
      id.assign(im.id_prefixes[e.node]);
    } else {
      im.fallback = "node#" + std::to_string(e.node);
      node_name = im.fallback;
      id.assign(im.fallback).push_back(':');
    }
    char digits[24];
    const auto conv = std::to_chars(digits, digits + sizeof digits, e.id);
    id.append(digits, conv.ptr);
    // SQLITE_STATIC: `id` and the node name stay untouched until the step below has copied
    // them into the row, and every parameter is rebound for the next event.
    sqlite3_bind_text(raw, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
    st.bind(2, static_cast<int64_t>(stored_ts));
    st.bind(3, static_cast<int64_t>(e.pid));
    st.bind(4, static_cast<int64_t>(e.tid));
    st.bind(5, static_cast<int64_t>(e.source));
    st.bind(6, static_cast<int64_t>(e.op));
    st.bind(7, static_cast<int64_t>(e.dur_ns));
    st.bind(8, static_cast<int64_t>(e.gpu_id));
    st.bind_u64(9, e.arg0);
    st.bind_u64(10, e.arg1);
    st.bind(11, static_cast<int64_t>(e.ret));
    st.bind_u64(12, e.stack_id);
    sqlite3_bind_text(raw, 13, node_name.data(), static_cast<int>(node_name.size()), SQLITE_STATIC);
    if (e.rank < 0) st.bind_null(14);
    else st.bind(14, static_cast<int64_t>(e.rank));
    st.bind_u64(15, e.cgroup_id);
    st.bind(16, static_cast<int64_t>(e.prev_state));
    st.bind(17, static_cast<int64_t>(e.flags));
    const int rc = st.step();
    sqlite3_reset(raw);  // no clear_bindings: all 17 parameters are bound for every row
    if (rc != SQLITE_DONE) return fail("insert event: " + std::string(sqlite3_errmsg(impl_->db.get())));
    ++events_written_;
    ++pending_;
    if (options_.commit_every && pending_ >= options_.commit_every && !commit_pending()) return false;
  }
  return true;
}

bool SqliteSink::write_health(const InputHealth& health) {
  sqlite3* db = impl_->db.get();
  std::string why;
  if (!sqlite_detail::exec(db, "DELETE FROM ip_health WHERE kind IN ('skip', 'drop', 'miss', 'loss')", why))
    return fail("write health: " + why);
  Stmt ins(db, "INSERT OR REPLACE INTO ip_health(kind, reason, count) VALUES(?1, ?2, ?3)");
  if (!ins.ok()) return fail("write health: " + ins.error());
  auto put = [&](const char* kind, const std::string& reason, uint64_t n) {
    ins.bind(1, kind);
    ins.bind(2, reason);
    ins.bind_u64(3, n);
    const int rc = ins.step();
    ins.reset();
    return rc == SQLITE_DONE;
  };
  for (const auto& [reason, n] : health.reasons)
    if (!put("skip", reason, n)) return fail("write health: " + std::string(sqlite3_errmsg(db)));
  if (health.dropped_events && !put("drop", "events lost before they reached the pipeline", health.dropped_events))
    return fail("write health: " + std::string(sqlite3_errmsg(db)));
  for (const auto& [reason, n] : health.missed)
    if (!put("miss", reason, n)) return fail("write health: " + std::string(sqlite3_errmsg(db)));
  // Where the drops happened (read back by read_loss_spans; readers that do not know the kind skip it).
  for (const LossSpan& l : health.loss_spans)
    if (!put("loss", loss_span_text(l), l.total())) return fail("write health: " + std::string(sqlite3_errmsg(db)));
  return true;
}

bool SqliteSink::write_meta(const TraceMeta& meta) {
  if (closed_) return fail("sink is closed");
  sqlite3* db = impl_->db.get();
  if (!begin_if_needed()) return false;
  impl_->set_nodes(meta.nodes);
  impl_->meta_written = true;

  Stmt kv(db, "INSERT OR REPLACE INTO ip_meta(key, value) VALUES(?1, ?2)");
  Stmt pn(db, "INSERT OR REPLACE INTO process_names(pid, name, seen_at) VALUES(?1, ?2, 0)");
  Stmt tn(db, "INSERT OR REPLACE INTO ip_thread_names(tid, name) VALUES(?1, ?2)");
  Stmt cap(db,
           "INSERT OR REPLACE INTO ip_process_capture(pid, attached_at, started_at, predates) "
           "VALUES(?1, ?2, ?3, ?4)");
  Stmt stk(db, "INSERT OR REPLACE INTO stack_traces(hash, ips, frames) VALUES(?1, ?2, ?3)");
  Stmt snap(db,
            "INSERT OR REPLACE INTO system_snapshots(timestamp, cpu_pct, mem_pct, mem_avail, "
            "swap_mb, load_avg) VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
  Stmt ses(db,
           "INSERT INTO sessions(started_at, stopped_at, gpu_model, gpu_driver, cpu_model, "
           "cpu_cores, mem_total, kernel, os_release, cuda_ver, python_ver, ingero_ver, "
           "pid_filter, flags) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  for (const Stmt* s : {&kv, &pn, &tn, &cap, &stk, &snap, &ses})
    if (!s->ok()) return fail("write meta: " + s->error());
  auto done = [&](Stmt& s) {
    const int rc = s.step();
    s.reset();
    return rc == SQLITE_DONE;
  };
  auto err = [&] { return fail("write meta: " + std::string(sqlite3_errmsg(db))); };

  const std::pair<const char*, std::string> rows[] = {
      {"nodes", json(impl_->nodes).dump()},
      {"source_path", meta.path},
      {"source_format", meta.format},
      {"first_ts", std::to_string(meta.first_ts)},
      {"last_ts", std::to_string(meta.last_ts)},
      {"rows_read", std::to_string(meta.health.rows_read)},
  };
  for (const auto& [k, v] : rows) {
    kv.bind(1, k);
    kv.bind(2, v);
    if (!done(kv)) return err();
  }
  for (const auto& [pid, name] : meta.process_names) {
    pn.bind(1, static_cast<int64_t>(pid));
    pn.bind(2, name);
    if (!done(pn)) return err();
  }
  for (const auto& [tid, name] : meta.thread_names) {
    tn.bind(1, static_cast<int64_t>(tid));
    tn.bind(2, name);
    if (!done(tn)) return err();
  }
  for (const auto& [pid, c] : meta.captures) {
    cap.bind(1, static_cast<int64_t>(pid));
    cap.bind_u64(2, c.attached_at);
    cap.bind_u64(3, c.started_at);
    cap.bind(4, static_cast<int64_t>(c.predates ? 1 : 0));
    if (!done(cap)) return err();
  }
  for (const auto& [hash, st] : meta.stacks) {
    stk.bind_u64(1, hash);
    stk.bind(2, st.ips);
    stk.bind(3, st.frames);
    if (!done(stk)) return err();
  }
  for (const auto& s : meta.snapshots) {
    snap.bind_u64(1, s.ts_ns);
    snap.bind(2, s.cpu_pct);
    snap.bind(3, s.mem_pct);
    snap.bind_u64(4, s.mem_avail_mb);
    snap.bind_u64(5, s.swap_mb);
    snap.bind(6, s.load_avg);
    if (!done(snap)) return err();
  }
  std::string why;
  if (!sqlite_detail::exec(db, "DELETE FROM sessions", why)) return fail("write meta: " + why);
  for (const auto& s : meta.sessions) {
    ses.bind_u64(1, s.started_at);
    ses.bind_u64(2, s.stopped_at);
    ses.bind(3, s.gpu_model);
    ses.bind(4, s.gpu_driver);
    ses.bind(5, s.cpu_model);
    ses.bind(6, static_cast<int64_t>(s.cpu_cores));
    ses.bind_u64(7, s.mem_total_mb);
    ses.bind(8, s.kernel);
    ses.bind(9, s.os_release);
    ses.bind(10, s.cuda_ver);
    ses.bind(11, s.python_ver);
    ses.bind(12, s.tool_ver);
    ses.bind(13, s.pid_filter);
    ses.bind(14, s.flags);
    if (!done(ses)) return err();
  }
  if (!write_health(meta.health)) return false;
  return commit_pending();
}

bool SqliteSink::write_result(const AnalysisResult& result) {
  if (closed_) return fail("sink is closed");
  if (!impl_->meta_written && !write_meta(result.meta)) return false;
  sqlite3* db = impl_->db.get();
  if (!begin_if_needed()) return false;
  std::string why;
  if (!sqlite_detail::exec(db, "DELETE FROM ip_op_stats", why)) return fail("write result: " + why);
  Stmt ops(db,
           "INSERT OR REPLACE INTO ip_op_stats(source, op, op_name, count, p50_ns, p95_ns, p99_ns, "
           "min_ns, max_ns, total_ns, tail_ratio, exact, rel_error, errors) "
           "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  Stmt ic(db,
          "INSERT OR REPLACE INTO causal_chains(id, detected_at, severity, summary, root_cause, "
          "explanation, recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, "
          "node) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
  Stmt pc(db,
          "INSERT OR REPLACE INTO ip_chains(id, position, rule, rule_hash, severity, category, "
          "source, op, op_name, pid, tid, node, node_index, rank, window_start, window_end, "
          "summary, root_cause, explanation, recommendations, evidence, predicates, slot_values, "
          "exemplars, p50_ns, p99_ns, tail_ratio, dropped_events, threads, stacks, time_split, accounting, "
          "over_time) "
          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
          "?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33)");
  Stmt kv(db, "INSERT OR REPLACE INTO ip_meta(key, value) VALUES(?1, ?2)");
  for (const Stmt* s : {&ops, &ic, &pc, &kv})
    if (!s->ok()) return fail("write result: " + s->error());
  auto done = [&](Stmt& s) {
    const int rc = s.step();
    s.reset();
    return rc == SQLITE_DONE;
  };
  auto err = [&] { return fail("write result: " + std::string(sqlite3_errmsg(db))); };

  for (const auto& o : result.ops) {
    ops.bind(1, static_cast<int64_t>(o.source));
    ops.bind(2, static_cast<int64_t>(o.op));
    ops.bind(3, op_name(o.source, o.op));
    ops.bind_u64(4, o.count);
    ops.bind_u64(5, o.p50_ns);
    ops.bind_u64(6, o.p95_ns);
    ops.bind_u64(7, o.p99_ns);
    ops.bind_u64(8, o.min_ns);
    ops.bind_u64(9, o.max_ns);
    ops.bind_u64(10, o.total_ns);
    ops.bind(11, o.tail_ratio);
    ops.bind(12, static_cast<int64_t>(o.exact));
    ops.bind(13, o.rel_error);
    ops.bind_u64(14, o.errors);
    if (!done(ops)) return err();
  }
  const auto& nodes = impl_->nodes;
  TraceMeta node_names;  // names the nodes of accounting JSON as the events' node column does
  node_names.nodes = nodes;
  int64_t position = 0;
  for (const auto& c : result.chains) {
    const std::string node = c.node < nodes.size() ? nodes[c.node] : "node#" + std::to_string(c.node);
    const std::string cuda_op = c.op ? op_name(c.source, c.op) : "";
    json timeline = json::array();
    for (const auto& ev : c.evidence) {
      std::string op;
      std::string layer = timeline_layer(c, ev, op);
      timeline.push_back({{"layer", layer},
                          {"op", op},
                          {"detail", ev.detail},
                          {"dur_us", ev.unit == "ns" ? static_cast<int64_t>(ev.value / 1000) : 0},
                          {"kind", ev.kind},
                          {"value", ev.value},
                          {"unit", ev.unit},
                          {"event_ids", ev.event_ids}});
    }
    const std::string recs = json(c.recommendations).dump();
    ic.bind(1, c.id);
    ic.bind_u64(2, c.window_end);
    ic.bind(3, severity_name(c.severity));
    ic.bind(4, c.summary);
    ic.bind(5, c.root_cause);
    ic.bind(6, c.explanation);
    ic.bind(7, recs);
    ic.bind(8, cuda_op);
    ic.bind_u64(9, c.p99_ns / 1000);
    ic.bind_u64(10, c.p50_ns / 1000);
    ic.bind(11, c.tail_ratio);
    ic.bind(12, timeline.dump());
    ic.bind(13, node);
    if (!done(ic)) return err();

    json preds = json::array();
    for (const auto& p : c.predicates) preds.push_back(predicate_to_json(p));
    json slots = json::array();
    for (const auto& [name, value] : c.values) slots.push_back({{"name", name}, {"value", value}});
    json exemplars = json::array();
    for (const auto& ev : c.evidence)
      for (uint64_t id : ev.event_ids) exemplars.push_back(id);
    pc.bind(1, c.id);
    pc.bind(2, position++);
    pc.bind(3, c.rule);
    pc.bind(4, c.rule_hash);
    pc.bind(5, severity_name(c.severity));
    pc.bind(6, c.category);
    pc.bind(7, static_cast<int64_t>(c.source));
    pc.bind(8, static_cast<int64_t>(c.op));
    pc.bind(9, cuda_op);
    pc.bind(10, static_cast<int64_t>(c.pid));
    pc.bind(11, static_cast<int64_t>(c.tid));
    pc.bind(12, node);
    pc.bind(13, static_cast<int64_t>(c.node));
    if (c.rank < 0) pc.bind_null(14);
    else pc.bind(14, static_cast<int64_t>(c.rank));
    pc.bind_u64(15, c.window_start);
    pc.bind_u64(16, c.window_end);
    pc.bind(17, c.summary);
    pc.bind(18, c.root_cause);
    pc.bind(19, c.explanation);
    pc.bind(20, recs);
    pc.bind(21, evidence_json(c.evidence).dump());
    pc.bind(22, preds.dump());
    pc.bind(23, slots.dump());
    pc.bind(24, exemplars.dump());
    pc.bind_u64(25, c.p50_ns);
    pc.bind_u64(26, c.p99_ns);
    pc.bind(27, c.tail_ratio);
    pc.bind_u64(28, c.dropped_events);
    // Where in the code: the same shapes as explain --json (model/result_json.h).
    pc.bind(29, threads_json(c.threads).dump());
    json stacks = json::array();
    for (const auto& st : c.stacks) stacks.push_back(chain_stack_json(st));
    pc.bind(30, stacks.dump());
    pc.bind(31, time_split_json(c.time_split).dump());
    // The chain's thread over its window: the same shape as explain --json (model/result_json.h).
    pc.bind(32, (c.accounting ? thread_accounting_json(*c.accounting, node_names) : json(nullptr)).dump());
    pc.bind(33, static_cast<int64_t>(c.over_time ? 1 : 0));
    if (!done(pc)) return err();
  }
  if (!write_accounting(db, result, node_names, why) || !write_steps(db, result, node_names, why) ||
      !write_incidents(db, result, node_names, why))
    return fail("write result: " + why);
  if (!sqlite_detail::exec(db, "DELETE FROM ip_rule_outcomes", why)) return fail("write result: " + why);
  Stmt ro(db,
          "INSERT OR REPLACE INTO ip_rule_outcomes(rule, position, rule_hash, category, windows, "
          "chains, has_miss, miss_stage, miss, miss_key, miss_window_start, miss_window_end, "
          "miss_values, over_time) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  if (!ro.ok()) return fail("write result: " + ro.error());
  position = 0;
  for (const auto& o : result.rules) {
    json slots = json::array();
    for (const auto& [name, value] : o.miss_values) slots.push_back({{"name", name}, {"value", value}});
    const json miss = predicate_to_json(o.miss);
    ro.bind(1, o.rule);
    ro.bind(2, position++);
    ro.bind(3, o.rule_hash);
    ro.bind(4, o.category);
    ro.bind_u64(5, o.windows);
    ro.bind_u64(6, o.chains);
    ro.bind(7, static_cast<int64_t>(o.has_miss));
    ro.bind(8, static_cast<int64_t>(o.miss_stage));
    ro.bind(9, miss.dump());
    ro.bind(10, o.miss_key);
    ro.bind_u64(11, o.miss_window_start);
    ro.bind_u64(12, o.miss_window_end);
    ro.bind(13, slots.dump());
    ro.bind(14, static_cast<int64_t>(o.over_time ? 1 : 0));
    if (!done(ro)) return err();
  }
  const auto& k = result.counters;
  const json counters = {{"events_in", k.events_in},
                         {"batches", k.batches},
                         {"windows_closed", k.windows_closed},
                         {"late_events", k.late_events},
                         {"node_errors", k.node_errors},
                         {"evicted_spans", k.evicted_spans},
                         {"tail_windows_capped", k.tail_windows_capped},
                         {"threads", k.threads}};
  kv.bind(1, "engine_counters");
  kv.bind(2, counters.dump());
  if (!done(kv)) return err();
  // The verdict the reports open with (operators/incidents.h), beside its incidents (ip_incidents).
  kv.bind(1, "verdict");
  kv.bind(2, json({{"text", result.verdict}, {"bound", result.bound}}).dump());
  if (!done(kv)) return err();
  return commit_pending();
}

bool SqliteSink::record_drops(const std::string& reason, uint64_t count) {
  if (closed_) return fail("sink is closed");
  if (!count) return true;
  if (!begin_if_needed()) return false;
  Stmt ins(impl_->db.get(),
           "INSERT INTO ip_health(kind, reason, count) VALUES('drop', ?1, ?2) "
           "ON CONFLICT(kind, reason) DO UPDATE SET count = count + excluded.count");
  if (!ins.ok()) return fail("record drops: " + ins.error());
  ins.bind(1, reason);
  ins.bind_u64(2, count);
  if (ins.step() != SQLITE_DONE) return fail("record drops: " + std::string(sqlite3_errmsg(impl_->db.get())));
  return commit_pending();
}

bool SqliteSink::close(std::string& error) { return close(error, ProgressFn{}); }

bool SqliteSink::close(std::string& error, const ProgressFn& progress) {
  if (closed_) return true;
  bool ok = true;
  if (impl_->db) {
    if (events_rejected_) {
      // Recorded so a reader of this database knows events are missing and why.
      if (begin_if_needed()) {
        Stmt ins(impl_->db.get(),
                 "INSERT OR REPLACE INTO ip_health(kind, reason, count) VALUES('skip', "
                 "'writer: time past year 2262 (not representable as a SQLite integer)', ?1)");
        if (ins.ok()) {
          ins.bind_u64(1, events_rejected_);
          ins.step();
        }
      }
    }
    ok = commit_pending();
    if (!ok) {
      std::string ignored;
      sqlite_detail::exec(impl_->db.get(), "ROLLBACK", ignored);
    }
    // Built in one transaction after every event is committed: a kill during the build leaves
    // the committed data without indexes (readable), never a half-built index.
    if (ok && !impl_->indexes_built) {
      if (progress) progress("indexing " + format_count(static_cast<double>(events_committed_)) + " events");
      std::string why;
      // Out of the write-ahead log: built in WAL mode, the new index pages (about half the data)
      // would sit in the log until the checkpoint at close copies them into the file, so the file
      // would take data + 2 x indexes on disk for a moment. The log is folded in first and the
      // build runs with a rollback journal, which new pages appended to the file do not enter
      // (a kill during the build: the journal rolls it back at the next read-write open,
      // recover_trace_set()). When another connection holds the file (a reader), the mode
      // cannot change and the build stays in the log, as before.
      std::string ignored;
      sqlite_detail::exec(impl_->db.get(), "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;", ignored);
      if (sqlite_detail::exec(impl_->db.get(), "BEGIN IMMEDIATE", why) &&
          sqlite_detail::exec(impl_->db.get(), sqlite_detail::kEventIndexSql, why) &&
          sqlite_detail::exec(impl_->db.get(), "COMMIT", why)) {
        impl_->indexes_built = true;
        // Back to WAL, which the file keeps (readers expect the mode it was written in); the
        // log is empty now and is deleted as the connection closes.
        sqlite_detail::exec(impl_->db.get(), "PRAGMA journal_mode=WAL;", ignored);
      } else {
        std::string ignored;
        sqlite_detail::exec(impl_->db.get(), "ROLLBACK", ignored);
        ok = fail("building the events indexes (the events are stored, unindexed): " + why);
      }
    }
    impl_->insert_event = Stmt();
    impl_->db.reset();  // every statement is finalized by now, so this closes the file
  }
  closed_ = true;
  if (!ok) error = error_;
  return ok;
}

}  // namespace ingero
