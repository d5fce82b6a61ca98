// Replay of Ingero trace databases (0.8, 0.9) and of our own (ingero-pipeline-1) into Batches.
// See sinks/store/sqlite_store.h for the contract and docs/storage.md for the column mapping.
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "sinks/store/rollover.h"
#include "sinks/store/sqlite_store.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {
namespace {

using sqlite_detail::Stmt;

// The events columns we read, in the order of the SELECT. `fallback` replaces a column the table
// lacks (NULL = the column is required). `not_null` mirrors Ingero's schema: a NULL there means
// the row was not written by Ingero's writer and is skipped.
enum Col {
  kId,
  kTs,
  kPid,
  kTid,
  kSource,
  kOp,
  kDur,
  kGpu,
  kArg0,
  kArg1,
  kRet,
  kStack,
  kCgroup,
  kNode,
  kRank,
  kPrevState,
  kFlags,
  kNumCols
};
struct ColSpec {
  const char* name;
  const char* fallback;
  bool not_null;
};
constexpr ColSpec kCols[kNumCols] = {
    {"id", "NULL", false},     {"timestamp", nullptr, true}, {"pid", nullptr, true},      {"tid", nullptr, true},
    {"source", nullptr, true}, {"op", nullptr, true},        {"duration", nullptr, true}, {"gpu_id", "0", true},
    {"arg0", "0", true},       {"arg1", "0", true},          {"ret_code", "0", true},     {"stack_hash", "0", true},
    {"cgroup_id", "0", true},  {"node", "''", true},         {"rank", "NULL", false},     {"prev_state", "0", true},
    {"flags", "0", true},
};

bool has(const std::vector<std::string>& cols, std::string_view name) {
  return std::find(cols.begin(), cols.end(), name) != cols.end();
}

// The capped value of text column `c`; `cut` is set when it was longer than `cap` bytes.
std::string capped_text(const Stmt& s, int c, size_t cap, bool& cut) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), c));
  const int n = sqlite3_column_bytes(s.get(), c);
  if (!p || n <= 0) return {};
  const size_t len = static_cast<size_t>(n);
  if (len > cap) cut = true;
  return std::string(p, std::min(len, cap));
}

// What sqlite_master says `name` is: "table", "view", "virtual table", or "" when absent.
std::string schema_kind(sqlite3* db, std::string_view name) {
  Stmt s(db,
         "SELECT type, coalesce(sql, '') FROM sqlite_master WHERE name = ?1 COLLATE NOCASE "
         "AND type IN ('table', 'view') LIMIT 1");
  if (!s.ok()) return {};
  s.bind(1, name);
  if (s.step() != SQLITE_ROW) return {};
  std::string type = s.text(0);
  if (type == "table") {
    std::string sql = s.text(1).substr(0, 64);
    std::transform(sql.begin(), sql.end(), sql.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    if (sql.find("VIRTUAL") != std::string::npos) type = "virtual table";
  }
  return type;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A key/value table (schema_info, ip_meta) as a map; empty when absent, not a plain table, or
// unreadable. Keys and values are capped (they name formats and nodes, nothing long).
std::map<std::string, std::string> read_kv(sqlite3* db, const char* table) {
  std::map<std::string, std::string> kv;
  if (schema_kind(db, table) != "table") return kv;
  Stmt s(db, std::string("SELECT key, value FROM ") + table);
  if (!s.ok()) return kv;
  bool cut = false;
  for (int n = 0; n < 10000 && s.step() == SQLITE_ROW; ++n)
    kv[capped_text(s, 0, kMaxTextBytes, cut)] = capped_text(s, 1, size_t{64} * 1024, cut);
  return kv;
}

// SELECT list for an optional-column table: each wanted column or its default.
std::string select_list(const std::vector<std::string>& present,
                        std::initializer_list<std::pair<const char*, const char*>> wanted) {
  std::string s;
  for (const auto& [name, fallback] : wanted) {
    if (!s.empty()) s += ", ";
    s += has(present, name) ? std::string("\"") + name + "\"" : std::string(fallback);
  }
  return s;
}

// One `events` row as SQLite returned it (Reader::step_fetch), before decoding (Reader::decode):
// fetching is most of a replay's cost and may run on other threads, decoding keeps the state
// (node names, counted warnings) and runs on one.
struct RawRow {
  int64_t v[kNumCols] = {};     // integer value of each fetched column, 0 when not an integer
  uint8_t type[kNumCols] = {};  // its SQLite fundamental type (SQLITE_INTEGER, SQLITE_NULL, ...)
  int64_t rowid = 0;
  std::string id_text;  // a TEXT id (0.9: "{node}:{seq}"), cut to kMaxTextBytes
  std::string node;     // the node column, cut to kMaxNameBytes; empty without one
  bool id_cut = false, node_cut = false;
  bool filled = false;  // ingero_row() wrote v, type and rowid for the current step
};

// Where ingero_row() writes: the row being fetched on this thread and the RawRow index of each
// argument but the last (the rowid). SQLite runs a function on the thread that steps the
// statement, so a thread-local target needs no locking, and a step outside Reader::step_fetch
// (target unset: a resume skipping rows it does not need) writes nothing.
struct RowTarget {
  RawRow* row = nullptr;
  const int* cols = nullptr;
  int n = 0;
};
thread_local RowTarget t_row_target;

// ingero_row(c1, ..., cn, rowid): copies the type and integer value of each argument into the
// thread's RowTarget and returns NULL. One function call per row instead of one
// sqlite3_column_value() per column (each an API entry and exit): 2,500 instructions a row
// against 3,150 for a table scan of an Ingero 0.8 trace, 3,070 against 3,720 over its timestamp
// index (callgrind, run500k.db; docs/history/issue-12.md, part 13).
void ingero_row(sqlite3_context* /*ctx*/, int argc, sqlite3_value** argv) {
  const RowTarget t = t_row_target;
  if (!t.row || argc != t.n + 1) return;
  RawRow& r = *t.row;
  for (int i = 0; i < t.n; ++i) {
    const int c = t.cols[i];
    const int type = sqlite3_value_type(argv[i]);
    r.type[c] = static_cast<uint8_t>(type);
    r.v[c] = type == SQLITE_INTEGER ? sqlite3_value_int64(argv[i]) : 0;
  }
  r.rowid = sqlite3_value_int64(argv[t.n]);
  r.filled = true;
}

// Registers ingero_row() on `db` (SQLITE_DIRECTONLY: a trace's schema, its views and triggers,
// cannot call it). Call once per connection, before any statement is stepped; on failure the
// events SELECT fails to prepare, which its callers report.
void register_row_function(sqlite3* db) {
  sqlite3_create_function_v2(db, "ingero_row", -1, SQLITE_UTF8 | SQLITE_DIRECTONLY, nullptr, ingero_row, nullptr,
                             nullptr, nullptr);
}

// Column `c` as text into `out` (reusing its capacity), cut at `cap` bytes (`cut` set then).
void copy_capped(sqlite3_stmt* st, int c, size_t cap, std::string& out, bool& cut) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
  const int n = sqlite3_column_bytes(st, c);
  if (!p || n <= 0) return;
  const size_t len = static_cast<size_t>(n);
  if (len > cap) cut = true;
  out.assign(p, std::min(len, cap));
}

class Reader {
 public:
  Reader(sqlite3* db, TraceMeta& meta) : db_(db), meta_(meta) { register_row_function(db); }

  // Fills meta_ and events; returns false with `error` (no path prefix) on a fatal problem.
  bool run(std::vector<Event>& events, std::string& error) {
    if (!open_schema(error)) return false;
    if (!read_events(events, error)) return false;
    read_side_tables();
    if (const std::string d = stack_refs_damage(); !d.empty()) meta_.health.damaged(d);
    return true;
  }

  // Checks the schema and reads what decoding rows needs (format, nodes). False with `error`
  // on a fatal problem.
  bool open_schema(std::string& error) {
    const auto tables = table_names();
    if (!has(tables, "events")) {
      error = tables.empty() ? "no `events` table: not an Ingero trace (the database has no tables)"
                             : "no `events` table: not an Ingero trace (tables: " + join(tables) + ")";
      return false;
    }
    if (const std::string kind = schema_kind(db_, "events"); kind != "table") {
      error = "`events` is a " + (kind.empty() ? std::string("schema object") : kind) +
              ", not a table: refused (a trace file may be hostile; a view or virtual table can "
              "run an unbounded query)";
      return false;
    }
    columns_ = sqlite_detail::table_columns(db_, "events");
    node_col_ = has(columns_, "node");
    id_rowid_ = id_is_rowid();
    id_col_ = !id_rowid_ && has(columns_, "id");
    int_cols_.clear();
    for (int c = kTs; c < kNumCols; ++c)
      if (c != kNode && has(columns_, kCols[c].name)) int_cols_.push_back(c);
    values_.fill(0);  // decode()'s defaults for the columns absent from this table
    values_[kRank] = -1;
    std::vector<std::string> missing;
    for (const auto& c : kCols)
      if (!c.fallback && !has(columns_, c.name)) missing.emplace_back(c.name);
    if (!missing.empty()) {
      error = "table `events` lacks required column" + std::string(missing.size() > 1 ? "s " : " ") + join(missing) +
              " (a trace needs timestamp, pid, tid, source, op, duration)";
      return false;
    }
    detect_format();
    read_nodes();
    return true;
  }

  void read_side_tables() {
    read_process_names();
    read_thread_names();
    read_captures();
    read_stacks();
    read_sessions();
    read_snapshots();
    if (ours_) read_recorded_health();
    flush_cuts();
  }

  // SELECT of one `events` row for step_fetch(), followed by `tail`: ingero_row() over the
  // integer columns present (int_cols_' order) and the rowid, then the id (NULL when it is the
  // rowid or absent: decode() takes the rowid) and the node (its fallback when absent). The
  // connection must have ingero_row() (register_row_function).
  std::string events_sql(const std::string& tail) const {
    std::string sql = "SELECT ingero_row(";
    for (const int c : int_cols_) sql += std::string("\"") + kCols[c].name + "\", ";
    sql += "rowid), ";
    sql += id_col_ ? std::string("\"id\"") : std::string("NULL");
    sql += ", ";
    sql += node_col_ ? std::string("\"node\"") : std::string(kCols[kNode].fallback);
    return sql + " FROM events" + tail;
  }
  bool node_col() const { return node_col_; }

  // True when events.id is the rowid itself (Ingero 0.8's INTEGER PRIMARY KEY): SQLite compiles
  // reading it to a Rowid opcode, not a Column one. step_fetch() then takes the rowid it reads anyway
  // instead of one more column per row (decode numbers id-less rows by rowid: the same value).
  bool id_is_rowid() {
    if (!has(columns_, "id")) return false;
    Stmt s(db_, "EXPLAIN SELECT \"id\" FROM events NOT INDEXED");
    if (!s.ok()) return false;
    bool rowid = false;
    while (s.step() == SQLITE_ROW) {
      const std::string op = s.text(1);
      if (op == "Column") return false;
      if (op == "Rowid") rowid = true;
    }
    return rowid;
  }

  // Counts a string cut to its bound (reported once per kind, with the count).
  void count_cut(const char* what) { ++cuts_[what]; }
  void flush_cuts() {
    for (const auto& [what, n] : cuts_) meta_.health.skip(what, n);
    cuts_.clear();
  }

  // A side table we read: a plain table, or absent. A view or virtual table in its place is
  // ignored with a warning (it could run an unbounded query).
  bool side_table(const char* table) {
    const std::string kind = schema_kind(db_, table);
    if (kind.empty()) return false;
    if (kind == "table") return true;
    meta_.health.skip(std::string(table) + " is a " + kind + ", not a table: ignored");
    return false;
  }
  std::vector<std::string> table_names() {
    std::vector<std::string> names;
    Stmt s(db_, "SELECT name FROM sqlite_master WHERE type IN ('table','view') ORDER BY name");
    if (!s.ok()) return names;
    while (s.step() == SQLITE_ROW) names.push_back(s.text(0));
    return names;
  }

  void detect_format() {
    const auto ip_meta = read_kv(db_, "ip_meta");
    if (auto it = ip_meta.find("format"); it != ip_meta.end()) {
      ours_ = true;
      meta_.format = it->second;
      if (auto n = ip_meta.find("nodes"); n != ip_meta.end()) {
        auto j = nlohmann::json::parse(n->second, nullptr, false);
        if (j.is_array() && !j.empty()) {
          meta_.nodes.clear();
          for (const auto& x : j) meta_.nodes.push_back(x.is_string() ? x.get<std::string>() : "");
        }
      }
      return;
    }
    const auto info = read_kv(db_, "schema_info");
    if (auto it = info.find("version"); it != info.end() && !it->second.empty()) meta_.format = "ingero-" + it->second;
    else meta_.format = has(columns_, "node") ? "ingero-0.9" : "ingero-0.8";
  }

  // Ingero databases: node indexes follow the sorted node names, so they do not depend on the
  // order rows were merged in. Our databases carry the original order in ip_meta.nodes.
  void read_nodes() {
    for (size_t i = 0; i < meta_.nodes.size(); ++i) node_cache_.emplace(meta_.nodes[i], static_cast<uint16_t>(i));
    if (ours_) return;
    if (node_col_) {
      Stmt s(db_, "SELECT DISTINCT node FROM events NOT INDEXED WHERE node IS NOT NULL ORDER BY node");
      if (!s.ok()) return;
      bool cut = false;
      int rc;
      while ((rc = s.step()) == SQLITE_ROW) {
        cut = false;
        node_for(capped_text(s, 0, kMaxNameBytes, cut));
        if (meta_.nodes.size() > std::numeric_limits<uint16_t>::max()) break;
      }
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) nodes_failed(rc);
      return;
    }
    if (id_col_) read_id_nodes();
  }

  // Without a node column, decode() takes a TEXT id's node from its text before the last colon
  // (of the id as read: cut at kMaxTextBytes). Those names are listed here first, sorted, so
  // that their indexes do not depend on the order rows are read in (found by sqlite_trace_fuzz:
  // the streaming and the load-and-sort replays numbered them differently). One pass over the
  // ids; at most 65,535 names or 16 MiB of them are listed (a file with more is hostile: the
  // rest are numbered as rows come).
  void read_id_nodes() {
    Stmt s(db_, "SELECT id FROM events NOT INDEXED WHERE typeof(id) = 'text'");
    if (!s.ok()) return;
    std::set<std::string> names;
    size_t bytes = 0;
    std::string text;
    bool cut = false;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      text.clear();
      copy_capped(s.get(), 0, kMaxTextBytes, text, cut);
      const size_t colon = text.rfind(':');
      if (colon == std::string::npos || colon == 0) continue;
      if (names.size() >= std::numeric_limits<uint16_t>::max() || bytes > (size_t{16} << 20)) break;
      if (names.insert(text.substr(0, colon)).second) bytes += colon;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) nodes_failed(rc);
    for (const std::string& n : names) node_for(n);
  }

  // The node names are listed by one walk of `events` before its rows are read, so that their
  // numbering does not depend on the read order; a damaged table cuts that list short (the
  // names are then numbered as rows come, which can change the report's node order).
  void nodes_failed(int rc) {
    meta_.health.damaged("table `events`: node names unreadable (" + sqlite_detail::describe_sqlite_error(db_, rc) +
                         ")");
  }

  // -1 when there are more names than Event::node can index.
  int node_for(std::string_view name) {
    // Rows of one node come in runs (most traces have one): the last answer is checked first.
    if (last_node_ >= 0 && name == last_node_name_) return last_node_;
    const std::string key(name);
    int idx;
    if (auto it = node_cache_.find(key); it != node_cache_.end()) {
      idx = it->second;
    } else {
      if (meta_.nodes.size() > std::numeric_limits<uint16_t>::max()) return -1;
      idx = meta_.node_index(key);
      node_cache_.emplace(key, static_cast<uint16_t>(idx));
    }
    last_node_name_ = key;
    last_node_ = idx;
    return idx;
  }

  bool read_events(std::vector<Event>& events, std::string& error) {
    Stmt s(db_, events_sql(""));
    if (!s.ok()) {
      error = "cannot read `events`: " + s.error();
      return false;
    }
    uint64_t row = 0;
    int rc;
    RawRow raw;
    while ((rc = step_fetch(s.get(), raw)) == SQLITE_ROW) {
      ++row;
      Event e;
      if (const char* why = decode(raw, e)) {
        meta_.health.skip(why);
        continue;
      }
      events.push_back(e);
    }
    meta_.health.rows_read = row;
    if (rc != SQLITE_DONE) {
      const std::string what = sqlite_detail::describe_sqlite_error(db_, rc);
      if (row == 0) {
        error = what + " while reading `events`; no row could be read";
        return false;
      }
      // Keep what was read: an analysis of the readable prefix beats none, and the health
      // report tells the user the rest is missing.
      meta_.health.skip("events table unreadable after row " + std::to_string(row) + ": " + what +
                        "; the remaining rows are lost");
      meta_.health.damaged("table `events` unreadable after row " + std::to_string(row) + ": " + what);
    }
    return true;
  }

 public:
  // Steps a statement made from events_sql() and, on SQLITE_ROW, copies the row into `r`;
  // returns sqlite3_step()'s code. Touches no state but what open_schema() set, so fetch threads
  // may call it concurrently (on their own statements and connections); decode() is the stateful
  // half and runs on one thread.
  int step_fetch(sqlite3_stmt* st, RawRow& r) const {
    r.filled = false;
    t_row_target = {&r, int_cols_.data(), static_cast<int>(int_cols_.size())};
    const int rc = sqlite3_step(st);
    t_row_target = {};
    if (rc != SQLITE_ROW) return rc;
    if (!r.filled) [[unlikely]] {  // cannot happen with events_sql(); decode() then refuses the row
      for (const int c : int_cols_) r.type[c] = SQLITE_NULL;
    }
    // The id when it is a column of its own (column 1): its type and integer value, or its text.
    // Otherwise (the rowid, or no id) column 1 is NULL and decode() takes the rowid. Columns the
    // table lacks are constants decode() takes without asking.
    r.id_cut = false;
    r.id_text.clear();
    if (id_col_) {
      sqlite3_value* id_val = sqlite3_column_value(st, 1);
      r.type[kId] = static_cast<uint8_t>(sqlite3_value_type(id_val));
      r.v[kId] = r.type[kId] == SQLITE_INTEGER ? sqlite3_value_int64(id_val) : 0;
      if (r.type[kId] == SQLITE_TEXT) copy_capped(st, 1, kMaxTextBytes, r.id_text, r.id_cut);
    } else {
      r.type[kId] = SQLITE_NULL;
      r.v[kId] = 0;
    }
    r.node_cut = false;
    r.node.clear();
    if (node_col_) {
      r.type[kNode] = static_cast<uint8_t>(sqlite3_column_type(st, 2));
      if (r.type[kNode] != SQLITE_NULL) copy_capped(st, 2, kMaxNameBytes, r.node, r.node_cut);
    }
    return rc;
  }

  // Returns the reason to skip the row, or null when `e` is filled.
  const char* decode(const RawRow& r, Event& e) {
    // The row's values, with the defaults (0; rank -1) of the columns the table lacks. Kept
    // between rows (decode() is the reader's one-thread half): every present column is written
    // below before any is read, the others never, so nothing is cleared per row (a `= {}` array
    // here was a `rep stos`, about half of decode()'s time in perf).
    std::array<int64_t, kNumCols>& v = values_;
    for (const int c : int_cols_) {
      const int t = r.type[c];
      if (t == SQLITE_INTEGER) {
        v[c] = r.v[c];
        continue;
      }
      if (t != SQLITE_NULL) return non_integer_reason(c);
      if (kCols[c].not_null) return null_reason(c);
      v[c] = (c == kRank) ? -1 : 0;
    }
    if (v[kTs] <= 0) return "zero or negative timestamp";
    if (v[kDur] < 0) return "negative duration";
    if (v[kDur] > kMaxPlausibleDurationNs) return "duration over 24 h (corrupt row)";
    if (v[kPid] < 0 || v[kPid] > std::numeric_limits<uint32_t>::max()) return "pid out of range";
    if (v[kTid] < 0 || v[kTid] > std::numeric_limits<uint32_t>::max()) return "tid out of range";
    if (v[kSource] < 0 || v[kSource] > 255 || v[kOp] < 0 || v[kOp] > 255 ||
        !find_op(static_cast<Source>(v[kSource]), static_cast<uint8_t>(v[kOp])))
      return unknown_op_reason(v[kSource], v[kOp]);
    if (v[kGpu] < 0 || v[kGpu] > 255) return "gpu_id out of range 0..255";
    if (v[kRet] < std::numeric_limits<int32_t>::min() || v[kRet] > std::numeric_limits<int32_t>::max())
      return "ret_code out of 32-bit range";
    if (v[kRank] < -1 || v[kRank] > std::numeric_limits<int16_t>::max()) return "rank out of range -1..32767";
    if (v[kPrevState] < 0 || v[kPrevState] > static_cast<int64_t>(OffCpuState::kOther)) return "unknown prev_state";
    if (v[kFlags] < 0 || v[kFlags] > 255) return "flags out of range 0..255";

    const auto source = static_cast<Source>(v[kSource]);
    const auto op = static_cast<uint8_t>(v[kOp]);
    uint64_t ts = static_cast<uint64_t>(v[kTs]);
    const uint64_t dur = static_cast<uint64_t>(v[kDur]);
    if (source == Source::kHost && op == op::kSchedSwitch) {
      // Ingero (and our writer, for compatibility) stores the switch-in time: the span's END.
      if (dur >= ts) return "off-CPU span would start before 1970 (duration >= timestamp)";
      ts -= dur;
    }

    if (node_col_ && r.type[kNode] == SQLITE_NULL) return null_reason(kNode);
    if (r.node_cut) count_cut("events.node longer than 256 bytes: cut");
    // Rows without a usable id are numbered by rowid (their place in the table).
    uint64_t id = static_cast<uint64_t>(r.type[kId] == SQLITE_INTEGER ? r.v[kId] : r.rowid);
    int node;
    if (r.type[kId] == SQLITE_TEXT) {
      // 0.9: "{node}:{seq}". Node names may hold colons, the seq never does.
      if (r.id_cut) count_cut("events.id longer than 4096 bytes: cut");
      const std::string_view text = r.id_text;
      const size_t colon = text.rfind(':');
      const std::string_view seq = colon == std::string::npos ? text : text.substr(colon + 1);
      uint64_t parsed = 0;
      const auto [end, ec] = std::from_chars(seq.data(), seq.data() + seq.size(), parsed);
      if (ec == std::errc() && end == seq.data() + seq.size() && !seq.empty()) id = parsed;
      node = !node_col_ && colon != std::string::npos ? node_for(text.substr(0, colon)) : node_for(r.node);
    } else {
      node = node_for(r.node);
    }
    if (node < 0) return "more than 65535 distinct node names";

    e.ts_ns = ts;
    e.dur_ns = dur;
    e.id = id;
    e.arg0 = static_cast<uint64_t>(v[kArg0]);
    e.arg1 = static_cast<uint64_t>(v[kArg1]);
    e.stack_id = static_cast<uint64_t>(v[kStack]);  // Ingero's FNV-64 is stored signed
    if (e.stack_id != 0) note_stack(e.stack_id);
    e.cgroup_id = static_cast<uint64_t>(v[kCgroup]);
    e.pid = static_cast<uint32_t>(v[kPid]);
    e.tid = static_cast<uint32_t>(v[kTid]);
    e.ret = static_cast<int32_t>(v[kRet]);
    e.node = static_cast<uint16_t>(node);
    e.rank = static_cast<int16_t>(v[kRank]);
    e.source = source;
    e.op = op;
    e.prev_state = static_cast<OffCpuState>(v[kPrevState]);
    e.gpu_id = static_cast<uint8_t>(v[kGpu]);
    e.flags = static_cast<uint8_t>(v[kFlags]);
    return nullptr;
  }

  // Reasons are interned so decode() can hand out stable pointers.
  const char* intern_reason(std::string s) { return intern(std::move(s)); }

  // Events refer to stacks that `stack_traces` lacks, and pages of the file belong to no table or
  // index: a page of the table overwritten by a copy of another (its root by one of its own
  // leaves reads as that leaf alone, a sound but smaller table): damage, not a different answer.
  // Either alone is no damage: a capture may refer to a stack it never stored, and a file may
  // hold stray pages (dangling references cost nothing to find; the page walk, 0.3 CPU-s of a
  // 380 MB trace, runs only after them). Empty when nothing is wrong. Call after the events
  // were read and the side tables too (either order).
  std::string stack_refs_damage() {
    if (stack_refs_cut_ || cuts_stack_budget_) return {};
    uint64_t missing = 0;
    uint64_t example = 0;
    for (const uint64_t id : stack_refs_)
      if (meta_.stacks.find(id) == meta_.stacks.end()) {
        if (missing++ == 0) example = id;
      }
    if (missing == 0) return {};
    const int64_t lost = sqlite_detail::unreached_pages(db_);
    if (lost == 0) return {};
    return "table `stack_traces`: events refer to " + std::to_string(missing) + " stack" + (missing > 1 ? "s" : "") +
           " it lacks (hash " + std::to_string(static_cast<int64_t>(example)) + (missing > 1 ? ", ..." : "") +
           ") and " +
           (lost > 0 ? std::to_string(lost) + " page" + (lost > 1 ? "s" : "") +
                           " of the file belong to no table or index (a page of the table overwritten by a copy "
                           "of another?)"
                     : std::string("the file's pages cannot all be walked")) +
           "; the stacks are not trusted";
  }

 private:
  const char* intern(std::string s) { return interned_.emplace(s, s).first->second.c_str(); }
  const char* null_reason(int c) {
    return intern(std::string("NULL in events.") + kCols[c].name + " (a NOT NULL column)");
  }
  const char* non_integer_reason(int c) { return intern(std::string("non-integer value in events.") + kCols[c].name); }
  const char* unknown_op_reason(int64_t source, int64_t op) {
    std::string s = "unknown op id (source " + std::to_string(source);
    if (source >= 0 && source <= 255)
      if (const auto* info = find_source(static_cast<Source>(source))) s += " " + std::string(info->name);
    return intern(s + ", op " + std::to_string(op) + ")");
  }

  // Process and thread names share a budget of kNameBudget rows (Linux's largest pid_max);
  // further rows are ignored and counted.
  static constexpr size_t kNameBudget = 4'194'304;
  static constexpr size_t kStackBudgetBytes = size_t{128} << 20;
  bool name_budget(const Stmt&, int, const char* table) {
    if (names_ < kNameBudget) {
      ++names_;
      return true;
    }
    count_cut((std::string(table) + " beyond 4194304 names: ignored").c_str());
    return false;
  }

  // Side tables are best-effort: a trace without them still analyses; a broken one is reported.
  // The table is read whole, so an error is damage: the answer lacks what the table held.
  void side_table_failed(const char* table, int rc) {
    const std::string what = sqlite_detail::describe_sqlite_error(db_, rc);
    meta_.health.skip(std::string(table) + " unreadable: " + what);
    meta_.health.damaged("table `" + std::string(table) + "` unreadable: " + what);
  }

  void read_process_names() {
    if (!side_table("process_names")) return;
    Stmt s(db_, "SELECT pid, name FROM process_names NOT INDEXED");
    if (!s.ok()) return side_table_failed("process_names", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) < 0 || s.i64(0) > std::numeric_limits<uint32_t>::max()) continue;
      if (!name_budget(s, 1, "process_names")) continue;
      bool cut = false;
      meta_.process_names[static_cast<uint32_t>(s.i64(0))] = capped_text(s, 1, kMaxNameBytes, cut);
      if (cut) count_cut("process_names.name longer than 256 bytes: cut");
    }
    if (rc != SQLITE_DONE) side_table_failed("process_names", rc);
  }

  // Ours only (ip_thread_names): Ingero records process names, not thread names.
  void read_thread_names() {
    if (!side_table("ip_thread_names")) return;
    Stmt s(db_, "SELECT tid, name FROM ip_thread_names NOT INDEXED");
    if (!s.ok()) return side_table_failed("ip_thread_names", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) < 0 || s.i64(0) > std::numeric_limits<uint32_t>::max()) continue;
      if (!name_budget(s, 1, "ip_thread_names")) continue;
      bool cut = false;
      meta_.thread_names[static_cast<uint32_t>(s.i64(0))] = capped_text(s, 1, kMaxNameBytes, cut);
      if (cut) count_cut("ip_thread_names.name longer than 256 bytes: cut");
    }
    if (rc != SQLITE_DONE) side_table_failed("ip_thread_names", rc);
  }

  // Ours only (ip_process_capture): when live capture of each process's calls began.
  void read_captures() {
    if (!side_table("ip_process_capture")) return;
    Stmt s(db_, "SELECT pid, attached_at, started_at, predates FROM ip_process_capture NOT INDEXED");
    if (!s.ok()) return side_table_failed("ip_process_capture", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) < 0 || s.i64(0) > std::numeric_limits<uint32_t>::max()) continue;
      if (meta_.captures.size() >= 1'000'000) {
        count_cut("ip_process_capture beyond 1000000 rows: ignored");
        continue;
      }
      ProcessCapture c;
      c.attached_at = static_cast<uint64_t>(std::max<int64_t>(0, s.i64(1)));
      c.started_at = static_cast<uint64_t>(std::max<int64_t>(0, s.i64(2)));
      c.predates = s.i64(3) != 0;
      meta_.captures[static_cast<uint32_t>(s.i64(0))] = c;
    }
    if (rc != SQLITE_DONE) side_table_failed("ip_process_capture", rc);
  }

  void read_stacks() {
    if (!side_table("stack_traces")) return;
    const auto cols = sqlite_detail::table_columns(db_, "stack_traces");
    // With the rowid last (a rowid table: Ingero's and ours): a scan returns rowids in increasing
    // order, so one that does not increase is a page of the table overwritten by a copy of another
    // of its pages (no index to cross-check this table against): damage, not a different answer.
    const std::string list = "hash, " + select_list(cols, {{"ips", "''"}, {"frames", "''"}});
    Stmt s(db_, "SELECT " + list + ", rowid FROM stack_traces NOT INDEXED");
    const bool rowids = s.ok();
    if (!rowids) s = Stmt(db_, "SELECT " + list + " FROM stack_traces NOT INDEXED");  // WITHOUT ROWID
    if (!s.ok()) return side_table_failed("stack_traces", sqlite3_errcode(db_));
    int rc;
    int64_t last_rowid = std::numeric_limits<int64_t>::min();
    while ((rc = s.step()) == SQLITE_ROW) {
      if (rowids) {
        const int64_t rowid = s.i64(3);
        if (rowid <= last_rowid) {
          meta_.health.damaged("table `stack_traces`: rows out of key order (rowid " + std::to_string(rowid) +
                               " after " + std::to_string(last_rowid) +
                               "): a page overwritten by a copy of another; its stacks are not trusted");
          meta_.stacks.clear();
          return;
        }
        last_rowid = rowid;
      }
      if (s.type(0) != SQLITE_INTEGER) continue;
      const size_t bytes = static_cast<size_t>(sqlite3_column_bytes(s.get(), 1)) +
                           static_cast<size_t>(sqlite3_column_bytes(s.get(), 2));
      if (stack_bytes_ + bytes > kStackBudgetBytes) {
        count_cut("stack_traces beyond 128 MiB in all: ignored");
        cuts_stack_budget_ = true;
        continue;
      }
      stack_bytes_ += bytes;
      bool cut_ips = false, cut_frames = false;
      StackTrace st{capped_text(s, 1, kMaxStackJsonBytes, cut_ips), capped_text(s, 2, kMaxStackJsonBytes, cut_frames)};
      // A cut JSON array no longer parses: drop the text rather than keep a broken prefix.
      if (cut_ips) {
        st.ips.clear();
        count_cut("stack_traces.ips longer than 256 KiB: dropped");
      }
      if (cut_frames) {
        st.frames.clear();
        count_cut("stack_traces.frames longer than 256 KiB: dropped");
      }
      // Both columns are JSON arrays when written (Ingero's writer and ours). Text that is not JSON
      // is a row whose overflow pages were overwritten (the b-tree still reads): its stack is lost,
      // and the answer is partial, not silently different.
      if ((!st.ips.empty() && !nlohmann::json::accept(st.ips)) ||
          (!st.frames.empty() && !nlohmann::json::accept(st.frames))) {
        if (++bad_stack_rows_ == 1)
          meta_.health.damaged("table `stack_traces`: the stored stack of hash " + std::to_string(s.i64(0)) +
                               " is not JSON (a page of the table overwritten?); such stacks are dropped");
        continue;
      }
      meta_.stacks[static_cast<uint64_t>(s.i64(0))] = std::move(st);
    }
    if (rc != SQLITE_DONE) side_table_failed("stack_traces", rc);
    if (bad_stack_rows_ > 0) meta_.health.skip("stack_traces rows whose text is not JSON: dropped", bad_stack_rows_);
  }

  void read_sessions() {
    if (!side_table("sessions")) return;
    const auto cols = sqlite_detail::table_columns(db_, "sessions");
    Stmt s(db_, "SELECT " +
                    select_list(cols, {{"started_at", "0"},
                                       {"stopped_at", "0"},
                                       {"gpu_model", "''"},
                                       {"gpu_driver", "''"},
                                       {"cpu_model", "''"},
                                       {"cpu_cores", "0"},
                                       {"mem_total", "0"},
                                       {"kernel", "''"},
                                       {"os_release", "''"},
                                       {"cuda_ver", "''"},
                                       {"python_ver", "''"},
                                       {"ingero_ver", "''"},
                                       {"pid_filter", "''"},
                                       {"flags", "''"}}) +
                    " FROM sessions NOT INDEXED ORDER BY " + (has(cols, "id") ? "id" : "rowid"));
    if (!s.ok()) return side_table_failed("sessions", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      SessionInfo si;
      si.started_at = static_cast<uint64_t>(s.i64(0));
      si.stopped_at = static_cast<uint64_t>(s.i64(1));
      bool cut = false;
      si.gpu_model = capped_text(s, 2, kMaxTextBytes, cut);
      si.gpu_driver = capped_text(s, 3, kMaxTextBytes, cut);
      si.cpu_model = capped_text(s, 4, kMaxTextBytes, cut);
      si.cpu_cores = static_cast<uint32_t>(s.i64(5));
      si.mem_total_mb = static_cast<uint64_t>(s.i64(6));
      si.kernel = capped_text(s, 7, kMaxTextBytes, cut);
      si.os_release = capped_text(s, 8, kMaxTextBytes, cut);
      si.cuda_ver = capped_text(s, 9, kMaxTextBytes, cut);
      si.python_ver = capped_text(s, 10, kMaxTextBytes, cut);
      si.tool_ver = capped_text(s, 11, kMaxTextBytes, cut);
      si.pid_filter = capped_text(s, 12, kMaxTextBytes, cut);
      si.flags = capped_text(s, 13, kMaxTextBytes, cut);
      if (cut) count_cut("sessions text longer than 4096 bytes: cut");
      if (meta_.sessions.size() >= 100000) {
        count_cut("sessions beyond 100000: ignored");
        continue;
      }
      meta_.sessions.push_back(std::move(si));
    }
    if (rc != SQLITE_DONE) side_table_failed("sessions", rc);
  }

  void read_snapshots() {
    if (!side_table("system_snapshots")) return;
    const auto cols = sqlite_detail::table_columns(db_, "system_snapshots");
    if (!has(cols, "timestamp")) return;
    Stmt s(db_, "SELECT timestamp, " +
                    select_list(
                        cols,
                        {{"cpu_pct", "0"}, {"mem_pct", "0"}, {"load_avg", "0"}, {"mem_avail", "0"}, {"swap_mb", "0"}}) +
                    " FROM system_snapshots NOT INDEXED ORDER BY timestamp, rowid");
    if (!s.ok()) return side_table_failed("system_snapshots", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) <= 0) continue;
      if (meta_.snapshots.size() >= 1'000'000) {
        count_cut("system_snapshots beyond 1000000: ignored");
        continue;
      }
      SystemSnapshot snap;
      snap.ts_ns = static_cast<uint64_t>(s.i64(0));
      snap.cpu_pct = s.f64(1);
      snap.mem_pct = s.f64(2);
      snap.load_avg = s.f64(3);
      snap.mem_avail_mb = static_cast<uint64_t>(s.i64(4));
      snap.swap_mb = static_cast<uint64_t>(s.i64(5));
      meta_.snapshots.push_back(snap);
    }
    if (rc != SQLITE_DONE) side_table_failed("system_snapshots", rc);
  }

  // What the run that wrote the database skipped or lost: it still qualifies the results.
  void read_recorded_health() {
    if (!side_table("ip_health")) return;
    Stmt s(db_, "SELECT kind, reason, count FROM ip_health ORDER BY rowid");
    if (!s.ok()) return;
    bool cut = false;
    for (int rows = 0; rows < 10000 && s.step() == SQLITE_ROW; ++rows) {
      const std::string kind = capped_text(s, 0, 16, cut);
      const auto n = static_cast<uint64_t>(std::max<int64_t>(0, s.i64(2)));
      if (kind == "drop") meta_.health.dropped_events += n;
      else if (kind == "skip") meta_.health.skip(capped_text(s, 1, kMaxTextBytes, cut), n);
      else if (kind == "miss") meta_.health.missed[capped_text(s, 1, kMaxTextBytes, cut)] += n;
    }
  }

  sqlite3* db_;
  TraceMeta& meta_;
  std::vector<std::string> columns_;
  std::vector<int> int_cols_;  // integer columns present in `events` (decode reads only these)
  // decode()'s scratch row: the defaults of absent columns (set by open_schema()), the last
  // row's present ones.
  std::array<int64_t, kNumCols> values_{};
  bool ours_ = false;
  std::unordered_map<std::string, uint16_t> node_cache_;
  std::string last_node_name_;  // node_for()'s last answer
  int last_node_ = -1;
  bool node_col_ = false;  // `events` has a node column (0.9, ours)
  bool id_rowid_ = false;  // events.id is the rowid (id_is_rowid())
  bool id_col_ = false;    // events.id is a column of its own (read as column 1 of events_sql())
  std::map<std::string, std::string> interned_;
  std::map<std::string, uint64_t> cuts_;
  size_t names_ = 0, stack_bytes_ = 0;
  // The stack ids events refer to, distinct (stack_refs_damage()): a direct-mapped cache of the
  // last ids seen keeps decode() from a set lookup per row of a repeated stack.
  static constexpr size_t kStackSeenSlots = 4096;
  static constexpr size_t kMaxStackRefs = size_t{1} << 20;
  void note_stack(uint64_t id) {
    if (stack_seen_.empty()) stack_seen_.assign(kStackSeenSlots, 0);
    uint64_t& slot = stack_seen_[(id ^ (id >> 29) ^ (id >> 47)) & (kStackSeenSlots - 1)];
    if (slot == id) return;
    slot = id;
    if (stack_refs_.size() < kMaxStackRefs) stack_refs_.insert(id);
    else stack_refs_cut_ = true;
  }
  std::vector<uint64_t> stack_seen_;
  std::unordered_set<uint64_t> stack_refs_;
  bool stack_refs_cut_ = false;
  bool cuts_stack_budget_ = false;  // stack_traces rows dropped past kStackBudgetBytes
  uint64_t bad_stack_rows_ = 0;     // stack_traces rows whose text is not JSON (damage)
};

// A FIFO of at most `capacity` elements in storage allocated once by init(): pushing and
// popping never allocate. Callers check full() before push_back() and empty() before front().
template <class T>
class FixedRing {
 public:
  void init(size_t capacity) {
    buf_.assign(std::max<size_t>(1, capacity), T{});
    head_ = size_ = 0;
  }
  bool empty() const { return size_ == 0; }
  bool full() const { return size_ == buf_.size(); }
  T& front() { return buf_[head_]; }
  void push_back(T v) {
    buf_[(head_ + size_) % buf_.size()] = std::move(v);
    ++size_;
  }
  void pop_front() {
    head_ = (head_ + 1) % buf_.size();
    --size_;
  }
  void clear() { head_ = size_ = 0; }

 private:
  std::vector<T> buf_;
  size_t head_ = 0, size_ = 0;
};

// A FIFO whose storage only grows (doubling, a power of two) and is kept: once it has held its
// largest backlog, pushing and popping never allocate (std::deque allocates and frees a node
// every few elements: a million times for a 5 M-row replay).
template <class T>
class GrowRing {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  const T& front() const { return buf_[head_]; }
  const T& back() const { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
  void push_back(const T& v) {
    *next_slot() = v;
    ++size_;
  }
  // The slot the next push_back() fills, to build an item in place (keeps its previous
  // contents); commit() then makes it the back, or the next push_back() reuses it.
  T* next_slot() {
    if (size_ == buf_.size()) grow();
    return &buf_[(head_ + size_) & (buf_.size() - 1)];
  }
  void commit() { ++size_; }
  void pop_front() {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }

 private:
  void grow() {
    std::vector<T> bigger(buf_.empty() ? 64 : buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = buf_[(head_ + i) & (buf_.size() - 1)];
    buf_.swap(bigger);
    head_ = 0;
  }
  std::vector<T> buf_;  // size 0 or a power of two
  size_t head_ = 0, size_ = 0;
};

// Fetches `events` in the order of one walk of the timestamp index (`timestamp`, then rowid) on
// threads of their own, one read-only connection each. The index is cut into chunks by
// timestamp range, in index order: the rows whose timestamp is NULL, then integer ranges
// [lo, hi) of about `chunk_rows` rows each (the bound is the timestamp `chunk_rows` entries
// further on, found by a walk of the index alone, until a range chunk has been fetched; then the
// first entry at or after lo + the step learnt from the last range fetched, one seek: see
// plan(); a run of equal timestamps is one chunk), then
// everything from the last bound on (the rest of the numbers, then TEXT and BLOB, as the index
// sorts them). Threads take chunks in turn; next() hands out the chunks' rows in chunk order, so
// the sequence is exactly the single walk's. Only for databases opened immutable: every
// connection then sees the same rows.
//
// Memory is bounded and allocated while the feed warms up, never per chunk afterwards: at most
// `threads + 1` chunks are in flight, each in one of as many reused slots whose queue holds at
// most chunk_rows / kBlockRows + 2 blocks of kBlockRows rows (a chunk waits for its turn with
// its rows fetched; a run of equal timestamps longer than that waits for the reader). Blocks
// come from a pool that never holds more than the slots can queue plus one being filled per
// thread and one being read, and go back to it once read.
//
// Failures:
// - An SQLite error ends the sequence where it happened (next() says kSqliteError with the
//   reason), as it would end a single walk there; but SQLITE_NOMEM is an allocation failure,
//   handled as the next point says.
// - An exception in a fetch thread (std::bad_alloc, ...) never leaves it: the thread marks its
//   chunk failed and nothing more is planned. next() still hands out every row fetched before
//   that point, then says kFailed; resume_point() then tells where a single walk of the index
//   continues the exact same sequence.
class ChunkFeed {
 public:
  // Why next() returned null.
  enum class End { kDone, kSqliteError, kFailed };
  // Where a single walk continues a failed feed: from the first index entry with timestamp >= lo
  // (from_lo) or from the first entry, skipping `skip` rows next() already handed out.
  struct ResumePoint {
    bool from_lo = false;
    int64_t lo = 0;
    uint64_t skip = 0;
  };

  // `index` is the timestamp index's name (quoted by the caller's check); `events_sql` makes the
  // SELECT Reader::step_fetch expects from a tail. `fault_hook` (tests only, may be empty) is called
  // by the fetch threads before planning a chunk ("plan") and before taking a block ("block");
  // it may throw to simulate an allocation failure there.
  ChunkFeed(const Reader& reader, std::vector<sqlite_detail::Db> conns, const std::string& index,
            const std::function<std::string(const std::string&)>& events_sql, size_t chunk_rows,
            std::function<void(const char*)> fault_hook)
      : reader_(reader), chunk_rows_(std::max<size_t>(1, chunk_rows)), fault_hook_(std::move(fault_hook)) {
    const std::string by = " INDEXED BY \"" + index + "\" ";
    const std::string order = " ORDER BY \"timestamp\", rowid";
    for (auto& db : conns) {
      auto w = std::make_unique<Worker>();
      w->db = std::move(db);
      sqlite3* raw = w->db.get();
      const auto rows = [&](const char* where) {
        std::string tail = by;
        tail += where;
        tail += order;
        return Stmt(raw, events_sql(tail));
      };
      w->rows[kNulls] = rows("WHERE \"timestamp\" IS NULL");
      w->rows[kAll] = rows("WHERE \"timestamp\" IS NOT NULL");
      w->rows[kBelow] = rows("WHERE \"timestamp\" < ?2");
      w->rows[kRange] = rows("WHERE \"timestamp\" >= ?1 AND \"timestamp\" < ?2");
      w->rows[kFrom] = rows("WHERE \"timestamp\" >= ?1");
      w->first_entry = Stmt(raw, "SELECT \"timestamp\" FROM events" + by + "ORDER BY \"timestamp\" LIMIT 1");
      w->first_bound = Stmt(raw, "SELECT \"timestamp\" FROM events" + by +
                                     "WHERE \"timestamp\" IS NOT NULL ORDER BY \"timestamp\" LIMIT 1 OFFSET ?1");
      w->next_bound = Stmt(raw, "SELECT \"timestamp\" FROM events" + by +
                                    "WHERE \"timestamp\" >= ?1 ORDER BY \"timestamp\" LIMIT 1 OFFSET ?2");
      bool all_ok = w->first_entry.ok() && w->first_bound.ok() && w->next_bound.ok();
      for (const auto& s : w->rows) all_ok = all_ok && s.ok();
      if (!all_ok) {
        if (error_.empty()) error_ = "cannot prepare the chunked read of `events`";
        continue;
      }
      workers_.push_back(std::move(w));
    }
    if (workers_.empty() && error_.empty()) error_ = "no connection";
    slots_.resize(workers_.size() + 1);
    const size_t per_slot = chunk_rows_ / kBlockRows + 2;
    for (auto& s : slots_) s.blocks.init(per_slot);
    max_blocks_ = slots_.size() * per_slot + workers_.size() + 1;
    blocks_.reserve(max_blocks_);
    free_.reserve(max_blocks_);
  }
  ~ChunkFeed() { stop(); }
  ChunkFeed(const ChunkFeed&) = delete;
  ChunkFeed& operator=(const ChunkFeed&) = delete;

  // Empty when the feed could be set up (then start() it); else why not (use a single walk).
  const std::string& error() const { return error_; }
  // Its fetch threads (started or to be).
  unsigned threads() const { return static_cast<unsigned>(workers_.size()); }

  void start() {
    for (auto& w : workers_) {
      Worker* p = w.get();
      p->thread = std::thread([this, p] { work(*p); });
    }
  }

  // Stops and joins the threads (idempotent); next() returns null afterwards.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    data_.notify_all();
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }

  // The next row, valid until the next call; null when the sequence stops, `end` saying why
  // (kSqliteError: `rc` set and `what` describing it).
  const RawRow* next(End& end, int& rc, std::string& what) {
    while (pos_ == cur_n_) {
      std::unique_lock<std::mutex> lock(mu_);
      if (cur_) free_.push_back(cur_);  // capacity reserved for every block: no allocation
      cur_ = nullptr;
      pos_ = cur_n_ = 0;
      data_.wait(lock, [&] {
        if (stop_) return true;
        if (consumed_ == planned_) return planned_all_;
        Slot& head = slot(consumed_);
        return !head.blocks.empty() || head.done;
      });
      end = End::kDone;
      if (stop_) return nullptr;
      if (consumed_ == planned_) {
        if (failed_) end = End::kFailed;  // a chunk was lost while being planned
        return nullptr;
      }
      Slot& head = slot(consumed_);
      if (!head.blocks.empty()) {
        cur_ = head.blocks.front();
        head.blocks.pop_front();
        cur_n_ = cur_->n;
        lock.unlock();
        space_.notify_all();
        continue;
      }
      if (head.failed) {
        end = End::kFailed;
        return nullptr;
      }
      if (head.rc != SQLITE_OK) {
        end = End::kSqliteError;
        rc = head.rc;
        what = head.what;
        return nullptr;
      }
      // The chunk is complete: a single walk would continue at its upper bound.
      if (head.kind == kBelow || head.kind == kRange) resume_ = ResumePoint{true, head.hi, 0};
      ++consumed_;
      lock.unlock();
      space_.notify_all();
    }
    ++resume_.skip;
    return &cur_->rows[pos_++];
  }

  // After next() said kFailed: where a single walk continues the sequence.
  ResumePoint resume_point() const { return resume_; }

 private:
  enum Kind { kNulls, kAll, kBelow, kRange, kFrom, kNumKinds };
  struct Chunk {
    Kind kind = kNulls;
    int64_t lo = 0, hi = 0;
    int rc = SQLITE_OK;  // the bound query failed: the sequence ends here
    std::string what;
  };
  struct Worker {
    sqlite_detail::Db db;
    Stmt rows[kNumKinds];
    Stmt first_entry, first_bound, next_bound;
    std::thread thread;
  };
  // kBlockRows rows, the first n fetched. Blocks are reused: step_fetch() sets every field decode()
  // reads, so rows need no clearing, and their strings keep their capacity.
  struct Block {
    std::vector<RawRow> rows;
    size_t n = 0;
  };
  // One chunk in flight: what it covers and its fetched blocks, in order. Reused (start()).
  struct Slot {
    Kind kind = kNulls;
    int64_t lo = 0, hi = 0;
    FixedRing<Block*> blocks;
    bool done = false, failed = false;
    int rc = SQLITE_OK;
    std::string what;
    void start(const Chunk& c) {
      kind = c.kind;
      lo = c.lo;
      hi = c.hi;
      blocks.clear();
      done = failed = false;
      rc = SQLITE_OK;
      what.clear();
    }
  };
  static constexpr size_t kBlockRows = 256;

  // The slot of chunk number `n` (chunks in flight are consecutive numbers, fewer than slots).
  Slot& slot(uint64_t n) { return slots_[n % slots_.size()]; }

  // The chunk after the last one planned (under plan_mu_). `last` is set for the final chunk.
  Chunk plan(Worker& w, bool& last) {
    Chunk c;
    last = false;
    if (stage_ == kPlanNulls) {
      // NULLs sort first. Their range query scans the whole index (SQLite does not search an
      // index for IS NULL on a NOT NULL column), so it runs only when the first entry is NULL.
      stage_ = kPlanFirst;
      Stmt& f = w.first_entry;
      f.reset();
      const int rc = f.step();
      const bool nulls = rc == SQLITE_ROW && f.type(0) == SQLITE_NULL;
      f.reset();
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return failed_query(w, rc, last);
      if (nulls) {
        c.kind = kNulls;
        return c;
      }
    }
    // The bound: the entry chunk_rows_ further on (a walk of the index), or, once a step has been
    // learnt (learn_step), the first entry at or after lo + step (one seek). The seek's chunk
    // [lo, f) holds exactly the entries of [lo, lo + step): none lies in [lo + step, f), so a
    // gap in time costs no empty chunk. Either way chunks are consecutive ranges of the one
    // index order, so the sequence of rows is the same whatever the bounds.
    const int64_t step = stage_ == kPlanMore ? step_.load(std::memory_order_relaxed) : 0;
    Stmt& s = stage_ == kPlanFirst ? w.first_bound : w.next_bound;
    s.reset();
    if (stage_ == kPlanFirst) {
      s.bind(1, static_cast<int64_t>(chunk_rows_));
    } else if (step > 0) {
      constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
      s.bind(1, next_lo_ > kMax - step ? kMax : next_lo_ + step);
      s.bind(2, int64_t{0});
    } else {
      s.bind(1, next_lo_);
      s.bind(2, static_cast<int64_t>(chunk_rows_));
    }
    const int rc = s.step();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      s.reset();
      return failed_query(w, rc, last);
    }
    const bool bound = rc == SQLITE_ROW && s.type(0) == SQLITE_INTEGER;
    int64_t v = bound ? s.i64(0) : 0;
    s.reset();
    if (stage_ == kPlanFirst) {
      stage_ = kPlanMore;
      if (!bound) {
        last = true;
        c.kind = kAll;
        return c;
      }
      c.kind = kBelow;
      c.hi = next_lo_ = v;
      return c;
    }
    c.lo = next_lo_;
    // The bound is a timestamp at or after lo (after it, by seek); a run of equal timestamps
    // longer than a chunk is a chunk of its own, [lo, lo + 1).
    if (bound && v == next_lo_) {
      if (v == std::numeric_limits<int64_t>::max()) v = 0;
      else ++v;
    }
    if (!bound || v <= next_lo_) {
      last = true;
      c.kind = kFrom;
      return c;
    }
    c.kind = kRange;
    c.hi = next_lo_ = v;
    return c;
  }

  // After a range chunk [lo, hi) of `rows` rows: the span that holds about chunk_rows_ entries
  // there (doubled after an empty chunk), for plan()'s seek. Bounded to [1, 2^62].
  void learn_step(int64_t lo, int64_t hi, uint64_t rows) {
    const double span = static_cast<double>(hi) - static_cast<double>(lo);
    double step = rows ? span * static_cast<double>(chunk_rows_) / static_cast<double>(rows) : 2 * span;
    step = std::clamp(step, 1.0, 4611686018427387904.0);
    step_.store(static_cast<int64_t>(step), std::memory_order_relaxed);
  }

  // A planning query failed with `rc`: the last chunk, ending the sequence with that error. Out
  // of memory is an allocation failure like any other: thrown, so that the reader falls back to
  // one walk instead of losing the rest.
  static Chunk failed_query(Worker& w, int rc, bool& last) {
    if ((rc & 0xff) == SQLITE_NOMEM) throw std::bad_alloc();
    Chunk c;
    c.rc = rc;
    c.what = sqlite_detail::describe_sqlite_error(w.db.get(), rc);
    last = true;
    return c;
  }

  void work(Worker& w) {
    for (;;) {
      Chunk c;
      Slot* s = nullptr;
      {
        std::lock_guard<std::mutex> plan_lock(plan_mu_);
        {
          std::unique_lock<std::mutex> lock(mu_);
          space_.wait(lock, [&] { return stop_ || planned_all_ || planned_ - consumed_ < slots_.size(); });
          if (stop_ || planned_all_) return;
        }
        try {
          if (fault_hook_) fault_hook_("plan");
          bool last = false;
          c = plan(w, last);
          std::lock_guard<std::mutex> lock(mu_);
          s = &slot(planned_);
          s->start(c);
          ++planned_;
          if (last) planned_all_ = true;
        } catch (...) {
          fail(nullptr);  // still under plan_mu_: no chunk gets planned after the lost one
          return;
        }
      }
      try {
        if (c.rc != SQLITE_OK) {
          finish(*s, c.rc, c.what);
          return;
        }
        if (!fetch_chunk(w, c, *s)) return;
      } catch (...) {
        fail(s);
        return;
      }
    }
  }

  // A fetch thread caught an exception: the sequence stops at chunk `s` (or, when the chunk was
  // lost while being planned, after the last chunk planned) and nothing more is planned.
  void fail(Slot* s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = planned_all_ = true;
      if (s) s->failed = s->done = true;
    }
    space_.notify_all();
    data_.notify_all();
  }

  // Fetches one chunk's rows into `slot`; false when stopped or failed (no more chunks then).
  bool fetch_chunk(Worker& w, const Chunk& c, Slot& slot) {
    Stmt& s = w.rows[c.kind];
    s.reset();
    if (c.kind == kRange || c.kind == kFrom) s.bind(1, c.lo);
    if (c.kind == kRange || c.kind == kBelow) s.bind(2, c.hi);
    Block* block = take_block();
    if (!block) return false;
    int rc;
    uint64_t rows = 0;
    for (;;) {
      if (block->n == kBlockRows) {
        if (!push(slot, block)) return false;
        block = take_block();
        if (!block) return false;
      }
      rc = reader_.step_fetch(s.get(), block->rows[block->n]);
      if (rc != SQLITE_ROW) break;
      ++block->n;
      ++rows;
    }
    if (rc == SQLITE_DONE && c.kind == kRange) learn_step(c.lo, c.hi, rows);
    // SQLite ran out of memory: an allocation failure, handled as one (work() falls back).
    if ((rc & 0xff) == SQLITE_NOMEM) throw std::bad_alloc();
    std::string what;
    if (rc != SQLITE_DONE) what = sqlite_detail::describe_sqlite_error(w.db.get(), rc);
    s.reset();
    if (block->n) {
      if (!push(slot, block)) return false;
    } else {
      give_back(block);
    }
    finish(slot, rc == SQLITE_DONE ? SQLITE_OK : rc, what);
    if (rc != SQLITE_DONE) {
      std::lock_guard<std::mutex> lock(mu_);
      planned_all_ = true;  // the sequence ends at this chunk
      return false;
    }
    return true;
  }

  // An empty block from the pool (allocated while the pool is below its bound); null when
  // stopped.
  Block* take_block() {
    if (fault_hook_) fault_hook_("block");
    std::unique_lock<std::mutex> lock(mu_);
    if (free_.empty() && blocks_.size() < max_blocks_) {
      auto b = std::make_unique<Block>();
      b->rows.resize(kBlockRows);
      blocks_.push_back(std::move(b));  // capacity reserved
      return blocks_.back().get();
    }
    // The bound covers every block that can be held at once, so this does not wait; kept so
    // that a wrong bound costs a wait, never memory.
    space_.wait(lock, [&] { return stop_ || !free_.empty(); });
    if (stop_) return nullptr;
    Block* b = free_.back();
    free_.pop_back();
    b->n = 0;
    return b;
  }

  void give_back(Block* block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(block);  // capacity reserved
    }
    space_.notify_all();
  }

  // Queues a full block; waits while the chunk's queue is full (the reader is behind, or a run
  // of equal timestamps is longer than a chunk). False when stopped.
  bool push(Slot& slot, Block* block) {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] { return stop_ || !slot.blocks.full(); });
    if (stop_) return false;
    slot.blocks.push_back(block);
    lock.unlock();
    data_.notify_all();
    return true;
  }

  void finish(Slot& slot, int rc, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot.what = what;  // first: if it throws, the slot is not done yet (fail() marks it)
      slot.rc = rc;
      slot.done = true;
    }
    data_.notify_all();
  }

  const Reader& reader_;
  const size_t chunk_rows_;
  const std::function<void(const char*)> fault_hook_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::string error_;
  // Planner state (plan_mu_): chunks are planned one at a time, in index order.
  std::mutex plan_mu_;
  enum { kPlanNulls, kPlanFirst, kPlanMore } stage_ = kPlanNulls;
  int64_t next_lo_ = 0;
  // The timestamp span a chunk of about chunk_rows_ entries covers, from the last range chunk
  // fetched (0 until one is): while it is known, a chunk's bound is found by one seek of the
  // index (the first entry at or after lo + step) instead of a walk over chunk_rows_ entries,
  // which visited every index entry a second time and held plan_mu_ while it did (about 400
  // instructions a row on run500k.db). Written by the fetch threads, read by the planner: only
  // a chunk's size depends on it, never which rows come in which order.
  std::atomic<int64_t> step_{0};
  // Shared state (mu_): chunks planned_ and consumed_ (those between are in flight, each in
  // slot(number)); the block pool (every block, the free ones).
  std::mutex mu_;
  std::condition_variable space_, data_;
  std::vector<Slot> slots_;
  uint64_t planned_ = 0, consumed_ = 0;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Block*> free_;
  size_t max_blocks_ = 0;
  bool planned_all_ = false, stop_ = false, failed_ = false;
  // The consumer's current block and where a single walk would continue after it.
  Block* cur_ = nullptr;
  size_t pos_ = 0, cur_n_ = 0;
  ResumePoint resume_;
};

// A 64-bit mix of a rowid (splitmix64's finaliser): the sum over a set of rowids identifies the
// set (two different sets of the same size collide with probability about 2^-64).
uint64_t rowid_mix(int64_t rowid) {
  uint64_t z = static_cast<uint64_t>(rowid) + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Walks `events` in rowid order past damaged pages. `head` is "SELECT ... FROM events"; the walk
// appends " NOT INDEXED WHERE rowid >= ?1 ORDER BY rowid" (no index is ever involved). When a step
// fails (a page SQLite cannot read), the walk finds the first readable rowid after the damage by
// seeks on the table alone (each one descent of the B-tree: a seek that lands in a damaged leaf
// fails, one past it succeeds; doubling, then bisecting), counts the rowids in between as
// unreadable, records the range and resumes there. Ingero's writers and ours append rows with
// consecutive rowids, so the gap is the number of rows lost; with deleted rows it is an upper
// bound. A row that fails on its own (its leaf readable, its record not) is one rowid lost.
class RowidWalk {
 public:
  static constexpr size_t kMaxRanges = 64;  // damage ranges recorded by name; more are counted

  RowidWalk(sqlite3* db, const std::string& head)
      : db_(db),
        stmt_(db, head + " NOT INDEXED WHERE rowid >= ?1 ORDER BY rowid"),
        probe_(db, "SELECT rowid FROM events NOT INDEXED WHERE rowid >= ?1 ORDER BY rowid LIMIT 1") {
    if (stmt_.ok()) stmt_.bind(1, from_);
  }
  bool ok() const { return stmt_.ok() && probe_.ok(); }
  std::string error() const { return stmt_.ok() ? probe_.error() : stmt_.error(); }

  // Steps to the next readable row: `fetch(stmt, rowid)` steps the statement and, on SQLITE_ROW,
  // sets `rowid`; it returns sqlite3_step()'s code. Returns SQLITE_ROW, SQLITE_DONE, or the code
  // of a failure the walk cannot pass (out of memory, or damage no seek gets past: the rest of
  // the table is then recorded as lost).
  template <class Fetch>
  int step(Fetch&& fetch) {
    for (;;) {
      int64_t rowid = 0;
      int rc = fetch(stmt_.get(), rowid);
      // A table walk gives rising rowids from the resume point; anything else comes from a
      // damaged page whose bytes happen to parse: damage like an error.
      const bool in_order = rowid >= from_ && (!read_since_resume_ || rowid > last_);
      if (rc == SQLITE_ROW && in_order) {
        last_ = rowid;
        read_since_resume_ = true;
        return rc;
      }
      if (rc == SQLITE_DONE || (rc & 0xff) == SQLITE_NOMEM || (rc & 0xff) == SQLITE_INTERRUPT) return rc;
      const std::string what = rc == SQLITE_ROW ? std::string("rowids out of order (a damaged page)")
                                                : sqlite_detail::describe_sqlite_error(db_, rc);
      if (rc == SQLITE_ROW) rc = SQLITE_CORRUPT;
      // The rows from `lo` on are in question: after the last one read, or the resume point.
      int64_t lo = read_since_resume_ ? last_ : from_;
      if (read_since_resume_) {
        if (lo == std::numeric_limits<int64_t>::max()) return SQLITE_DONE;
        ++lo;
      } else if (resumed_) {
        // Resumed at a rowid the probe could read and failed at once: that row's record is
        // unreadable on its own. It is lost; the walk goes on after it.
        lost(lo, lo, what);
        if (lo == std::numeric_limits<int64_t>::max()) return SQLITE_DONE;
        ++lo;
      }
      int64_t next = 0;
      const int found = first_readable(lo, next);
      if (found == SQLITE_ROW) {
        if (next > lo) lost(lo, next - 1, what);
        resume(next);
        continue;
      }
      // No readable row after `lo`: the rest of the table is lost (its size as max(rowid) says).
      int64_t top = lo - 1;
      Stmt m(db_, "SELECT max(rowid) FROM events NOT INDEXED");
      if (m.ok() && m.step() == SQLITE_ROW && m.type(0) == SQLITE_INTEGER) top = m.i64(0);
      lost(lo, std::max(top, lo), what, top >= lo);
      return found == SQLITE_DONE ? SQLITE_DONE : rc;
    }
  }

  uint64_t unreadable() const { return unreadable_; }
  // One line per damaged range ("rowids 120..184 unreadable: corrupt database (...)").
  const std::vector<std::string>& ranges() const { return ranges_; }

 private:
  // The first rowid >= lo whose seek succeeds: SQLITE_ROW with `out`, SQLITE_DONE when none
  // follows, or an error when even seeks near the end of the rowid space fail.
  int first_readable(int64_t lo, int64_t& out) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    int rc = probe(lo, out);
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
    // Doubling: the first bound past the damage; bisecting: the smallest such bound. Distances
    // are unsigned: lo may be INT64_MIN (a walk that failed on its first row).
    const auto distance = [](int64_t a, int64_t b) { return static_cast<uint64_t>(b) - static_cast<uint64_t>(a); };
    int64_t bad = lo, good = lo;
    const uint64_t room = distance(lo, kMax);
    for (uint64_t d = 1;; d = d > room / 2 ? room : d * 2) {
      good = d >= room ? kMax : static_cast<int64_t>(static_cast<uint64_t>(lo) + d);
      rc = probe(good, out);
      if (rc == SQLITE_ROW || rc == SQLITE_DONE) break;
      bad = good;
      if (good == kMax) return rc;
    }
    while (distance(bad, good) > 1) {
      const int64_t mid = static_cast<int64_t>(static_cast<uint64_t>(bad) + distance(bad, good) / 2);
      int64_t at = 0;
      const int m = probe(mid, at);
      if (m == SQLITE_ROW || m == SQLITE_DONE) good = mid;
      else bad = mid;
    }
    return probe(good, out);
  }

  int probe(int64_t bound, int64_t& out) {
    probe_.reset();
    probe_.bind(1, bound);
    int rc = probe_.step();
    if (rc == SQLITE_ROW) {
      out = probe_.i64(0);
      if (out < bound) rc = SQLITE_CORRUPT;  // a seek never goes back: a damaged page's bytes
    }
    probe_.reset();
    return rc;
  }

  void resume(int64_t at) {
    stmt_.reset();
    stmt_.bind(1, at);
    from_ = at;
    resumed_ = true;
    read_since_resume_ = false;
  }

  // Records rowids first..last as lost. How many rows they held: an index of `events` that can
  // still be read lists them (a full walk of it, per damaged range); without one, the gap
  // (exact for consecutive rowids), or unknown when the range starts at the smallest rowid.
  void lost(int64_t first, int64_t last, const std::string& what, bool known = true) {
    uint64_t n = 0;
    const bool counted = count_by_index(first, last, n);
    const bool open_start = first == std::numeric_limits<int64_t>::min();
    if (!counted && known && !open_start) n = static_cast<uint64_t>(last) - static_cast<uint64_t>(first) + 1;
    unreadable_ += n;
    const std::string rows = counted || (known && !open_start) ? std::to_string(n) + (counted ? "" : " at most")
                                                               : std::string("an unknown number of");
    const std::string range = open_start ? "rowids up to " + std::to_string(last)
                              : known    ? "rowids " + std::to_string(first) + ".." + std::to_string(last)
                                         : "rowids from " + std::to_string(first) + " on";
    if (ranges_.size() < kMaxRanges) ranges_.push_back(range + " unreadable (" + rows + " rows): " + what);
    else if (ranges_.size() == kMaxRanges) ranges_.emplace_back("more damaged ranges not listed");
  }

  bool count_by_index(int64_t first, int64_t last, uint64_t& n) {
    std::vector<std::string> names;
    {
      Stmt l(db_, "SELECT name FROM pragma_index_list('events') WHERE partial = 0 ORDER BY name");
      while (l.ok() && l.step() == SQLITE_ROW) names.push_back(l.text(0));
    }
    for (const auto& name : names) {
      if (name.find('"') != std::string::npos) continue;
      Stmt c(db_, "SELECT count(*) FROM events INDEXED BY \"" + name + "\" WHERE rowid BETWEEN ?1 AND ?2");
      if (!c.ok()) continue;
      c.bind(1, first);
      c.bind(2, last);
      if (c.step() != SQLITE_ROW) continue;
      n = static_cast<uint64_t>(c.i64(0));
      return true;
    }
    return false;
  }

  sqlite3* db_;
  Stmt stmt_, probe_;
  int64_t from_ = std::numeric_limits<int64_t>::min(), last_ = 0;
  bool read_since_resume_ = false, resumed_ = false;
  uint64_t unreadable_ = 0;
  std::vector<std::string> ranges_;
};

// Streaming replay (contract: SqliteReadOptions in sinks/store/sqlite_store.h). Rows are decoded by the
// same Reader::decode as the load path and merged through a min-heap keyed by (ts_ns, rowid),
// which is exactly the order a stable sort by ts_ns of the table (in rowid order) gives.
class StreamSource final : public EventSource {
 public:
  StreamSource(sqlite_detail::Db db, TraceMeta meta, const SqliteReadOptions& options,
               const sqlite_detail::ProbeResult& probe)
      : db_(std::move(db)),
        meta_(std::move(meta)),
        options_(options),
        reader_(db_.get(), meta_),
        probe_(probe),
        immutable_(!probe.has_wal && !probe.has_journal) {
    if (!options_.batch_size) options_.batch_size = 4096;
    if (!options_.max_reorder_events) options_.max_reorder_events = 1;
  }

  // Checks the schema, picks the read order and the slack, reads the side tables and the first
  // rows. False with `error` (no path prefix) on a fatal problem.
  bool open(std::string& error) {
    // Every read here is a walk (side tables, the slack's index range, `events`): see
    // small_page_cache(). Set first, so no query fills SQLite's default 2,000 KiB.
    small_page_cache(db_.get());
    if (!reader_.open_schema(error)) return false;
    reader_.read_side_tables();
    std::string index = timestamp_index();
    // The index is walked only when it lists exactly the table's rows in order; otherwise the
    // table itself is read, in rowid order (index_problem_ says why; finish() reports it).
    if (!index.empty() && !index_agrees(index)) index.clear();
    if (!index.empty()) {
      indexed_ = true;
      index_ = index;
      start_feed(index);
      bool slack_ok = true;
      slack_ = max_sched_switch_duration(slack_ok);
      if (!slack_ok) {
        // The slack's query failed (it may use another index of `events`): without an exact
        // slack the index walk could misorder rows, so the table is read instead.
        index_problem_ = "the largest sched_switch duration could not be read through the indexes of `events`";
        feed_.reset();
        indexed_ = false;
        index_.clear();
      }
    }
    if (!indexed_) {
      slack_ = rowid_order_disorder();
      walk_ = std::make_unique<RowidWalk>(db_.get(), reader_.events_sql(""));
      if (!walk_->ok()) {
        error = "cannot read `events`: " + walk_->error();
        return false;
      }
    }
    // With fetch threads the reader's connection is idle from here on (unless they fail): it
    // gives back the pages the side tables and the slack query cached.
    if (feed_) {
      sqlite3_db_release_memory(db_.get());
    } else if (indexed_) {
      stmt_ = Stmt(db_.get(), reader_.events_sql(" INDEXED BY \"" + index + "\" ORDER BY \"timestamp\", rowid"));
      if (!stmt_.ok()) {
        error = "cannot read `events`: " + stmt_.error();
        return false;
      }
    }
    if (options_.progress && ::isatty(STDERR_FILENO)) {
      rows_total_ = static_cast<uint64_t>(std::max<int64_t>(0, max_rowid()));
      progress_start_ = std::chrono::steady_clock::now();
      progress_next_ = progress_start_ + std::chrono::seconds(1);
      show_progress_ = rows_total_ > 0;
    }
    fill();
    if (failed_rc_ != SQLITE_OK && row_ == 0) {
      error = failed_what_ + " while reading `events`; no row could be read";
      return false;
    }
    return true;
  }

  // Never throws: an exception while reading (std::bad_alloc past what the fetch threads absorb)
  // ends the replay with what was read, reported in meta().health like an unreadable table.
  bool next(Batch& out) override {
    if (finished_) return false;
    try {
      return next_batch(out);
    } catch (const std::exception& e) {
      return stop_on_exception(out, e.what());
    } catch (...) {
      return stop_on_exception(out, "unknown exception");
    }
  }

  TraceMeta& meta() override { return meta_; }
  unsigned busy_threads() const override { return feed_ ? feed_->threads() : 0U; }

  // What streaming learnt (health, first/last ts) goes into meta() here, on the consumer's
  // thread: by next() itself at the final batch, or by ReaderThreadSource when it hands the
  // final batch over, so meta() is never written while the consumer may read it.
  void publish_on_final(bool v) { publish_on_final_ = v; }
  void publish_meta() {
    meta_.health.rows_read = health_.rows_read;
    for (const auto& [why, n] : health_.reasons) meta_.health.skip(why, n);
    for (const auto& d : health_.damage) meta_.health.damaged(d);
    meta_.health.rows_unreadable += health_.rows_unreadable;
    for (const auto& r : health_.recovered) meta_.health.recovered.push_back(r);
    reader_.flush_cuts();
    meta_.first_ts = first_ts_;
    meta_.last_ts = last_ts_;
  }
  uint64_t slack_ns() const { return slack_; }
  bool indexed() const { return indexed_; }

  // The replay cannot go on (`what` threw): `out` becomes the final batch with the events it
  // already holds (sorted, released in order), the rows still held or unread are reported lost.
  bool stop_on_exception(Batch& out, const char* what) {
    threw_ = true;
    try {
      failed_what_ = what;
    } catch (...) {
      failed_what_.clear();  // no memory even for the message: finish() reports the row count
    }
    out.seq = seq_++;
    out.final = true;
    out.watermark = std::numeric_limits<uint64_t>::max();
    try {
      finish();
      if (publish_on_final_) publish_meta();
    } catch (...) {
      finished_ = true;  // the health line could not be written; the stream still ends
    }
    return true;
  }

 private:
  bool next_batch(Batch& out) {
    out.events.clear();
    // Rows that arrived behind the released watermark (only past max_reorder_events) go first.
    if (!late_.empty()) {
      std::sort(late_.begin(), late_.end(), Earlier{});
      for (auto& h : late_) out.events.push_back(h.e);
      late_.clear();
    }
    while (out.events.size() < options_.batch_size) {
      fill();
      if (!held()) break;
      pop_into(out.events);
    }
    fill();  // look ahead: is there anything after this batch?
    out.seq = seq_++;
    out.final = !held() && late_.empty();
    for (const auto& e : out.events) {
      if (!seen_any_) {
        first_ts_ = e.ts_ns;
        seen_any_ = true;
      }
      last_ts_ = std::max(last_ts_, e.end_ns());
    }
    if (out.final) {
      out.watermark = std::numeric_limits<uint64_t>::max();
      finish();
      if (publish_on_final_) publish_meta();
    } else {
      out.watermark = out.events.empty() ? released_ : out.events.back().ts_ns;
    }
    return true;
  }

  struct Held {
    Event e;
    int64_t rowid;
  };
  struct Earlier {
    bool operator()(const Held& a, const Held& b) const {
      return a.e.ts_ns != b.e.ts_ns ? a.e.ts_ns < b.e.ts_ns : a.rowid < b.rowid;
    }
  };
  struct Later {
    bool operator()(const Held& a, const Held& b) const { return Earlier{}(b, a); }
  };

  // True when the timestamp index lists exactly the table's rows, in (timestamp, rowid) order:
  // one walk of the index alone (its timestamps, the values the read uses, and rowids) against
  // one walk of the table's rowids, compared by count and by a sum of mixed rowids. A damaged
  // page on either walk is an SQLite error; an index page overwritten by another's is a
  // different row set or a step back. Otherwise index_problem_ says what is wrong (a damaged
  // table is left to RowidWalk, which records the ranges it cannot read). The two walks run
  // at once on two connections where the file is immutable (both see the same rows): 0.10 s of
  // a 5 M-row trace's replay (docs/storage.md, "Damaged files").
  bool index_agrees(const std::string& index) {
    struct Walk {
      uint64_t rows = 0, sum = 0;
      int rc = SQLITE_OK;
      std::string what;
      int64_t behind = 0;  // a rowid whose entry steps back, when `disorder`
      bool disorder = false;
    };
    const auto table_walk = [](sqlite3* db, Walk& w) noexcept {
      try {
        Stmt t(db, "SELECT rowid FROM events NOT INDEXED");
        if (!t.ok()) {
          w.rc = SQLITE_ERROR;
          w.what = t.error();
          return;
        }
        while ((w.rc = t.step()) == SQLITE_ROW) {
          ++w.rows;
          w.sum += rowid_mix(t.i64(0));
        }
        if (w.rc != SQLITE_DONE) w.what = sqlite_detail::describe_sqlite_error(db, w.rc);
      } catch (...) {
        w.rc = SQLITE_NOMEM;
        w.what = "out of memory";
      }
    };
    Walk table, entries;
    sqlite_detail::Db other;
    std::thread thread;
    try {
      if (immutable_ && max_rowid() >= static_cast<int64_t>(options_.fetch_min_rows) &&
          std::thread::hardware_concurrency() > 1)
        other = another_connection();
      if (other) thread = std::thread([&] { table_walk(other.get(), table); });
    } catch (const std::exception&) {
      // No second thread: the table is walked after the index, on this connection.
    }
    {
      Stmt x(db_.get(),
             "SELECT \"timestamp\", rowid FROM events INDEXED BY \"" + index + "\" ORDER BY \"timestamp\", rowid");
      if (!x.ok()) {
        entries.rc = SQLITE_ERROR;
        entries.what = x.error();
      } else {
        int prev_rank = -1;
        int64_t prev_i = 0, prev_rowid = 0;
        double prev_f = 0;
        bool prev_int = false;
        while ((entries.rc = x.step()) == SQLITE_ROW) {
          const int type = x.type(0);
          const int64_t rowid = x.i64(1);
          ++entries.rows;
          entries.sum += rowid_mix(rowid);
          // SQLite's order: NULL, numbers, text, blob; numbers by value, then rowid. Text and
          // blobs (never in a trace) are checked by kind only.
          const int rank = type == SQLITE_NULL ? 0 : type == SQLITE_TEXT ? 2 : type == SQLITE_BLOB ? 3 : 1;
          bool back = rank < prev_rank;
          if (rank == prev_rank && rank != 2 && rank != 3) {
            int cmp = 0;
            if (rank == 1) {
              if (type == SQLITE_INTEGER && prev_int) {
                const int64_t v = x.i64(0);
                cmp = v < prev_i ? -1 : v > prev_i ? 1 : 0;
              } else {
                const double v = x.f64(0);
                cmp = v < prev_f ? -1 : v > prev_f ? 1 : 0;
              }
            }
            back = cmp < 0 || (cmp == 0 && rowid <= prev_rowid);
          }
          if (back && !entries.disorder) {
            entries.disorder = true;
            entries.behind = rowid;
          }
          prev_rank = rank;
          prev_int = type == SQLITE_INTEGER;
          prev_i = prev_int ? x.i64(0) : 0;
          prev_f = type == SQLITE_INTEGER ? static_cast<double>(prev_i) : x.f64(0);
          prev_rowid = rowid;
        }
        if (entries.rc != SQLITE_DONE) entries.what = sqlite_detail::describe_sqlite_error(db_.get(), entries.rc);
      }
    }
    if (thread.joinable()) thread.join();
    else table_walk(db_.get(), table);
    other.reset();
    if (table.rc != SQLITE_DONE) return false;  // the table is damaged: RowidWalk reports where
    const std::string name = "index `" + index + "`";
    if (entries.rc != SQLITE_DONE) index_problem_ = name + " unreadable: " + entries.what;
    else if (entries.disorder)
      index_problem_ = name + " out of order (its entry for rowid " + std::to_string(entries.behind) + " steps back)";
    else if (entries.rows != table.rows || entries.sum != table.sum)
      // Both walks read cleanly yet list different rows: either side may be the damaged one
      // (a table page overwritten by another of its pages reads as a smaller, sound table), so
      // the table is read but the answer is not claimed exact.
      index_ambiguous_ = name + " and table `events` list different rows (" + std::to_string(entries.rows) + " and " +
                         std::to_string(table.rows) + ")";
    if (!index_problem_.empty() || !index_ambiguous_.empty()) return false;
    expected_rows_ = table.rows;
    return true;
  }

  // Name of an ascending, complete index whose first column is `timestamp`, or "".
  std::string timestamp_index() {
    Stmt s(db_.get(),
           "SELECT il.name FROM pragma_index_list('events') AS il "
           "WHERE il.partial = 0 AND (SELECT name = 'timestamp' AND desc = 0 "
           "FROM pragma_index_xinfo(il.name) WHERE seqno = 0) ORDER BY il.name LIMIT 1");
    if (!s.ok() || s.step() != SQLITE_ROW) return {};
    bool cut = false;
    std::string name = capped_text(s, 0, kMaxTextBytes, cut);
    if (cut || name.find('"') != std::string::npos) return {};
    return name;
  }

  // The largest duration a decodable sched_switch row can have: how far such a row can move
  // back from where the index puts it. No row can be decoded before it is known, and the fetch
  // threads stop after their first chunks, so on a large file it is the replay's first, serial
  // step: 0.34-0.40 s of big5m.db's 5 M rows (one table seek per sched_switch row, through
  // Ingero's (source, op, stack_hash) index; a scan of the table without it). With fetch threads
  // (an immutable file, every connection sees the same rows) the table's two rowid halves are
  // searched at once, the upper on a connection and thread of its own: 0.21-0.24 s. Best-effort: when
  // the second connection or thread cannot be had, one query does it all.
  // `ok` is cleared when a query failed (a damaged page on its path): the slack is then unknown.
  uint64_t max_sched_switch_duration(bool& ok) {
    ok = true;
    const int64_t mid = feed_ ? max_rowid() / 2 : 0;
    if (mid > 0) {
      try {
        auto other = another_connection();
        if (other) {
          int64_t upper = -1;
          std::thread t([&other, &upper, mid] { upper = max_switch_duration_in(other.get(), mid + 1, INT64_MAX); });
          const int64_t lower = max_switch_duration_in(db_.get(), INT64_MIN, mid);
          t.join();
          ok = lower != kSlackFailed && upper != kSlackFailed;
          return static_cast<uint64_t>(std::max<int64_t>({0, lower, upper}));
        }
      } catch (const std::exception&) {
        // No second connection or thread (std::system_error, std::bad_alloc): one query below.
      }
    }
    const int64_t all = max_switch_duration_in(db_.get(), INT64_MIN, INT64_MAX);
    ok = all != kSlackFailed;
    return static_cast<uint64_t>(std::max<int64_t>(0, all));
  }
  // max_sched_switch_duration() over the rows with rowid in [first, last]; -1 when none,
  // kSlackFailed on an error or an exception (std::bad_alloc): it never throws, so the thread
  // that runs it always ends and is joined.
  static constexpr int64_t kSlackFailed = -2;
  static int64_t max_switch_duration_in(sqlite3* db, int64_t first, int64_t last) noexcept {
    try {
      Stmt s(db,
             "SELECT max(duration) FROM events WHERE source = ?1 AND op = ?2 AND "
             "typeof(duration) = 'integer' AND duration BETWEEN 0 AND ?3 AND rowid BETWEEN ?4 AND ?5");
      if (!s.ok()) return kSlackFailed;
      s.bind(1, static_cast<int64_t>(Source::kHost));
      s.bind(2, static_cast<int64_t>(op::kSchedSwitch));
      s.bind(3, kMaxPlausibleDurationNs);
      s.bind(4, first);
      s.bind(5, last);
      if (s.step() != SQLITE_ROW) return kSlackFailed;
      if (s.type(0) != SQLITE_INTEGER) return -1;
      return s.i64(0);
    } catch (...) {
      return kSlackFailed;
    }
  }

  // Rowid order without an index: the largest amount by which a row's start precedes the
  // latest start before it. Holding rows that long makes the heap's output fully sorted.
  // Walks past damaged pages as the read itself will (RowidWalk: the same rows are skipped).
  uint64_t rowid_order_disorder() {
    RowidWalk walk(db_.get(), "SELECT \"timestamp\", duration, source, op, rowid FROM events");
    if (!walk.ok()) return 0;
    sqlite3_stmt* st = nullptr;
    const auto fetch = [&st](sqlite3_stmt* stmt, int64_t& rowid) {
      st = stmt;
      const int rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) rowid = sqlite3_column_int64(stmt, 4);
      return rc;
    };
    uint64_t front = 0, worst = 0;
    while (walk.step(fetch) == SQLITE_ROW) {
      if (sqlite3_column_type(st, 0) != SQLITE_INTEGER || sqlite3_column_type(st, 1) != SQLITE_INTEGER) continue;
      const int64_t ts = sqlite3_column_int64(st, 0), dur = sqlite3_column_int64(st, 1);
      if (ts <= 0 || dur < 0 || dur > kMaxPlausibleDurationNs) continue;
      uint64_t start = static_cast<uint64_t>(ts);
      if (sqlite3_column_int64(st, 2) == static_cast<int64_t>(Source::kHost) &&
          sqlite3_column_int64(st, 3) == op::kSchedSwitch) {
        if (static_cast<uint64_t>(dur) >= start) continue;
        start -= static_cast<uint64_t>(dur);
      }
      if (start < front) worst = std::max(worst, front - start);
      front = std::max(front, start);
    }
    return worst;
  }

  // The held row that goes out next (the smaller of the in-order queue's front and the heap's
  // top), or null when nothing is held.
  const Held* smallest() const {
    const Held* q = in_order_.empty() ? nullptr : &in_order_.front();
    const Held* h = heap_.empty() ? nullptr : &heap_.front();
    if (!q) return h;
    if (!h) return q;
    return Earlier{}(*h, *q) ? h : q;
  }
  size_t held() const { return in_order_.size() + heap_.size(); }

  // Reads rows until the smallest held row may be released, or the table is done.
  void fill() {
    for (;;) {
      const Held* top = smallest();
      if (done_ || (top && top->e.ts_ns < limit())) break;
      if (held() >= options_.max_reorder_events) {
        // Bound reached: let the smallest go early; later rows behind it are flagged late.
        forced_ = overflowed_ = true;
        return;
      }
      read_row();
    }
    forced_ = false;
  }

  // Rows with ts below this cannot be preceded by a row still unread.
  uint64_t limit() const { return front_ > slack_ ? front_ - slack_ : 0; }

  // Fetch threads (ChunkFeed) when the options ask for them, the index is a plain ascending
  // one, the file is immutable (all connections see the same rows) and the table is large
  // enough to pay for them; otherwise feed_ stays null and stmt_ walks the index. Setting the
  // feed up is best-effort: any failure (an exception included) leaves the single walk.
  void start_feed(const std::string& index) {
    if (options_.fetch_threads < 2 || !immutable_) return;
    try {
      Stmt coll(db_.get(), "SELECT coll FROM pragma_index_xinfo(?1) WHERE seqno = 0");
      if (!coll.ok()) return;
      coll.bind(1, index);
      if (coll.step() != SQLITE_ROW || coll.text(0) != "BINARY") return;
      if (max_rowid() < static_cast<int64_t>(options_.fetch_min_rows)) return;
      std::vector<sqlite_detail::Db> conns;
      for (size_t i = 0; i < options_.fetch_threads; ++i) {
        auto db = another_connection();
        if (!db) return;
        conns.push_back(std::move(db));
      }
      const Reader& reader = reader_;
      auto feed = std::make_unique<ChunkFeed>(
          reader, std::move(conns), index, [&reader](const std::string& tail) { return reader.events_sql(tail); },
          options_.fetch_chunk_rows, options_.fetch_fault_hook);
      if (!feed->error().empty()) return;
      feed->start();  // a thread that cannot start: `feed` stops and joins the others on the way out
      feed_ = std::move(feed);
    } catch (const std::exception&) {
      feed_.reset();
    }
  }

  // The table's largest rowid (its row count when rows were only appended), 0 when empty or
  // unreadable.
  int64_t max_rowid() {
    Stmt s(db_.get(), "SELECT max(rowid) FROM events");
    return s.ok() && s.step() == SQLITE_ROW && s.type(0) == SQLITE_INTEGER ? s.i64(0) : 0;
  }

  // One more connection to the file, opened as the reader's is and with its limits (fetch
  // threads, the slack's second half); null when it cannot be opened.
  sqlite_detail::Db another_connection() const {
    std::string why;
    auto db = sqlite_detail::open_readonly(meta_.path, probe_, why);
    if (!db) return db;
    sqlite3_limit(db.get(), SQLITE_LIMIT_LENGTH, kSqliteMaxValueBytes);
    small_page_cache(db.get());
    register_row_function(db.get());
    return db;
  }

  // Each connection's page cache defaults to 2,000 KiB, filled to the brim by a long walk of
  // `events` (about 2.3 MB with SQLite's per-page headers, on each of up to three connections).
  // The walk is sequential: index leaves in order, table leaves in about the same order (rows
  // are written in time order), so 64 pages hold every page it comes back to (the B-tree paths,
  // a few interleaved writers). Best-effort: a failure keeps the default.
  static void small_page_cache(sqlite3* db) {
    std::string ignored;
    sqlite_detail::exec(db, "PRAGMA cache_size = 64", ignored);  // pages
  }

  // The next row in read order (valid until the next call); null at the end of the table, or
  // on an error (failed_rc_ and failed_what_ set).
  const RawRow* next_raw() {
    if (feed_) {
      ChunkFeed::End end = ChunkFeed::End::kDone;
      if (const RawRow* r = feed_->next(end, failed_rc_, failed_what_)) return r;
      if (end != ChunkFeed::End::kFailed) return nullptr;
      if (!resume_single_walk()) return nullptr;
    }
    if (walk_) {
      const int rc = walk_->step([this](sqlite3_stmt* st, int64_t& rowid) {
        const int step = reader_.step_fetch(st, raw_);
        if (step == SQLITE_ROW) rowid = raw_.rowid;
        return step;
      });
      if (rc == SQLITE_ROW) return &raw_;
      if (rc != SQLITE_DONE) {
        failed_rc_ = rc;
        failed_what_ = sqlite_detail::describe_sqlite_error(db_.get(), rc);
      }
      return nullptr;
    }
    const int rc = reader_.step_fetch(stmt_.get(), raw_);
    if (rc == SQLITE_ROW) return &raw_;
    if (rc != SQLITE_DONE) {
      failed_rc_ = rc;
      failed_what_ = sqlite_detail::describe_sqlite_error(db_.get(), rc);
    }
    return nullptr;
  }

  // A fetch thread failed (an exception, e.g. std::bad_alloc): stop the feed and continue with
  // one walk of the index on the reader's own connection, exactly where the feed's rows end
  // (the feed's sequence is the walk's). False with failed_rc_/failed_what_ set when the walk
  // cannot continue (then the rest is reported lost, as for an SQLite error).
  bool resume_single_walk() {
    const ChunkFeed::ResumePoint at = feed_->resume_point();
    feed_.reset();  // joins the threads, frees the blocks and connections
    if (options_.fetch_fault_hook) options_.fetch_fault_hook("resume");
    std::string tail = " INDEXED BY \"" + index_ + "\" ";
    if (at.from_lo) tail += "WHERE \"timestamp\" >= ?1 ";
    tail += "ORDER BY \"timestamp\", rowid";
    stmt_ = Stmt(db_.get(), reader_.events_sql(tail));
    if (!stmt_.ok()) {
      failed_rc_ = SQLITE_ERROR;
      failed_what_ = "fetch threads failed and the single walk cannot start (" + stmt_.error() + ")";
      return false;
    }
    if (at.from_lo) stmt_.bind(1, at.lo);
    for (uint64_t i = 0; i < at.skip; ++i) {
      const int rc = stmt_.step();
      if (rc == SQLITE_ROW) continue;
      failed_rc_ = rc == SQLITE_DONE ? SQLITE_CORRUPT : rc;
      failed_what_ = rc == SQLITE_DONE ? std::string("fewer rows than the fetch threads read (file changed?)")
                                       : sqlite_detail::describe_sqlite_error(db_.get(), rc);
      return false;
    }
    return true;
  }

  void read_row() {
    const RawRow* raw = next_raw();
    if (!raw) {
      done_ = true;
      return;
    }
    ++row_;
    if (show_progress_ && (row_ & 0xFFFF) == 0) report_progress();
    // Decoded in place, in the in-order queue's next slot (most rows stay there: no copy);
    // decode() writes every field a row gives, and an unused slot is simply reused.
    Held& h = *in_order_.next_slot();
    if (const char* why = reader_.decode(*raw, h.e)) {
      health_.skip(why);
      return;
    }
    h.rowid = raw->rowid;
    // The position the read order guarantees: stored timestamp (index) or derived start.
    const uint64_t stored = h.e.source == Source::kHost && h.e.op == op::kSchedSwitch ? h.e.ts_ns + h.e.dur_ns
                                                                                      : h.e.ts_ns;
    if (indexed_ && stored < front_) {
      // The index walk went backwards: the index is damaged. Never hand out unsorted events.
      health_.skip("row out of timestamp-index order (damaged index?)");
      index_disagrees();
      return;
    }
    front_ = std::max(front_, indexed_ ? stored : h.e.ts_ns);
    if (released_any_ && h.e.ts_ns < released_) {
      // Only past max_reorder_events. A context interval may go out late (Batch contract); a
      // call may not, it is skipped and counted.
      if (!overflowed_) {
        // Cannot happen on a sound file (the slack is exact); a damaged index can cause it.
        health_.skip("row arrived after its place in time order (damaged index?)");
        if (indexed_) index_disagrees();
        else health_.damaged("table `events`: a row arrived after its place in time order");
        return;
      }
      if (h.e.source != Source::kHost) {
        health_.skip("row behind the reorder buffer (max_reorder_events too small): skipped");
        return;
      }
      h.e.flags |= event_flags::kLate;
      ++late_count_;
      late_.push_back(h);
      return;
    }
    // Over the index, every row but sched_switch arrives in (ts, rowid) order already: a FIFO
    // holds those, only the rows that move pay for the heap.
    if (indexed_ && stored == h.e.ts_ns && (in_order_.empty() || Earlier{}(in_order_.back(), h))) {
      in_order_.commit();
      return;
    }
    heap_.push_back(h);
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }

  // Moves the smallest held row (there is one) to the end of `out`.
  void pop_into(std::vector<Event>& out) {
    const Held* top = smallest();
    out.push_back(top->e);
    if (!in_order_.empty() && top == &in_order_.front()) {
      in_order_.pop_front();
    } else {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      heap_.pop_back();
    }
    released_ = out.back().ts_ns;
    released_any_ = true;
  }

  // Found while reading, after earlier rows went out: the answer may differ from the undamaged
  // file's, so it is partial (index_agrees() found nothing wrong: the index's damage keeps its
  // row set and order, e.g. wrong timestamps, or another index gave a wrong slack).
  void index_disagrees() {
    health_.damaged("index `" + index_ + "` disagrees with table `events`: rows out of time order while reading");
  }

  void report_progress() {
    const auto now = std::chrono::steady_clock::now();
    if (now < progress_next_) return;
    progress_next_ = now + std::chrono::milliseconds(500);
    const double s = std::chrono::duration<double>(now - progress_start_).count();
    const double rate = s > 0 ? static_cast<double>(row_) / s : 0;
    const uint64_t total = std::max(rows_total_, row_);
    const double left = rate > 0 ? static_cast<double>(total - row_) / rate : 0;
    std::fprintf(stderr, "\r\033[Kreading %s: %llu of %llu rows (%.0f%%), %.2f M rows/s, ~%.0f s left",
                 sqlite_detail::one_line(meta_.path).c_str(), static_cast<unsigned long long>(row_),
                 static_cast<unsigned long long>(total), 100.0 * static_cast<double>(row_) / static_cast<double>(total),
                 rate / 1e6, left);
    std::fflush(stderr);
    progress_shown_ = true;
  }

  void finish() {
    finished_ = true;
    if (progress_shown_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
    health_.rows_read = row_;
    if (threw_)
      health_.skip("replay stopped after row " + std::to_string(row_) + ": " + failed_what_ +
                   "; the rows not yet delivered are lost");
    else if (failed_rc_ != SQLITE_OK)
      health_.skip("events table unreadable after row " + std::to_string(row_) + ": " + failed_what_ +
                   "; the remaining rows are lost");
    report_damage();
    if (late_count_)
      health_.skip("delivered late: the reorder buffer (" + std::to_string(options_.max_reorder_events) +
                       " rows) was too small for this trace's disorder",
                   late_count_);
    feed_.reset();
    stmt_ = Stmt();
    walk_.reset();
    if (db_ && !threw_) {
      if (const std::string d = reader_.stack_refs_damage(); !d.empty()) health_.damaged(d);
    }
    db_.reset();
  }

  // What damage the read met (into health_, published with it): rows the walk could not read,
  // an index it did not trust (worked around exactly unless the table read lost or reordered
  // rows), a read that stopped early, a row count other than the table's.
  void report_damage() {
    bool exact = !threw_ && failed_rc_ == SQLITE_OK;
    if (failed_rc_ != SQLITE_OK)
      health_.damaged(std::string(indexed_ ? "index `" + index_ + "` or table `events`" : "table `events`") +
                      " unreadable after row " + std::to_string(row_) + ": " + failed_what_);
    if (walk_) {
      for (const auto& r : walk_->ranges()) health_.damaged("table `events`: " + r);
      health_.rows_unreadable += walk_->unreadable();
      exact = exact && walk_->ranges().empty();
    }
    if (!index_problem_.empty()) {
      if (exact && !overflowed_)
        health_.recovered.push_back(
            index_problem_ + ": read table `events` in rowid order instead (the results are the undamaged file's)");
      else health_.damaged(index_problem_);
      if (overflowed_)
        health_.damaged("the rowid-order read's reorder buffer (" + std::to_string(options_.max_reorder_events) +
                        " rows) was too small for this trace's disorder: rows went out late or were skipped");
    }
    if (!index_ambiguous_.empty()) health_.damaged(index_ambiguous_);
    if (indexed_ && exact && expected_rows_ != kUnknownRows && row_ != expected_rows_)
      health_.damaged("index `" + index_ + "` gave " + std::to_string(row_) + " rows, table `events` holds " +
                      std::to_string(expected_rows_));
  }

  static constexpr uint64_t kUnknownRows = std::numeric_limits<uint64_t>::max();
  sqlite_detail::Db db_;
  TraceMeta meta_;
  SqliteReadOptions options_;
  Reader reader_;
  Stmt stmt_;
  std::unique_ptr<RowidWalk> walk_;        // the rowid-order read (no index, or one not trusted)
  std::string index_problem_;              // why the timestamp index was not walked (empty: it was, or none)
  std::string index_ambiguous_;            // the index and the table list different rows: damage either side
  uint64_t expected_rows_ = kUnknownRows;  // the table's rows, when index_agrees() counted them
  RawRow raw_;                             // read_row()'s row being decoded (kept: its strings keep their capacity)
  bool indexed_ = false, done_ = false, finished_ = false, forced_ = false;
  bool released_any_ = false, seen_any_ = false, overflowed_ = false;
  int failed_rc_ = SQLITE_OK;
  std::string failed_what_;  // failed_rc_ described
  uint64_t slack_ = 0, front_ = 0, released_ = 0, row_ = 0, seq_ = 0, late_count_ = 0;
  std::vector<Held> heap_, late_;
  GrowRing<Held> in_order_;
  InputHealth health_;  // published into meta_ by publish_meta()
  uint64_t first_ts_ = 0, last_ts_ = 0;
  bool publish_on_final_ = true;
  bool show_progress_ = false, progress_shown_ = false;
  uint64_t rows_total_ = 0;
  std::chrono::steady_clock::time_point progress_start_, progress_next_;
  sqlite_detail::ProbeResult probe_;  // how the file was opened: fetch threads open it the same way
  bool immutable_ = false;
  bool threw_ = false;               // next() caught an exception (stop_on_exception)
  std::string index_;                // the timestamp index walked (empty: rowid order)
  std::unique_ptr<ChunkFeed> feed_;  // last: its threads stop before the reader they use goes
};

// Runs a source's next() on its own thread, `depth` batches ahead, so reading and decoding
// SQLite rows overlaps the engine. Batches are handed over whole (swapped, never copied). The
// wrapped source's meta() is read by the consumer only after open (names, stacks: not written
// again) and after the final batch (health, first/last ts: published on the consumer's thread
// by publish_meta()). Node names first met mid-stream (text ids "{node}:{seq}" without a node
// column) are still appended to meta().nodes by the reader: read nodes after the final batch.
class ReaderThreadSource final : public EventSource {
 public:
  // The thread starts at the first next(): until then the consumer owns meta() alone. The
  // hand-over queues are sized here, so passing batches never allocates (and never throws).
  ReaderThreadSource(std::unique_ptr<StreamSource> inner, size_t depth)
      : inner_(std::move(inner)), depth_(depth ? depth : 1) {
    inner_->publish_on_final(false);
    ready_.init(depth_);
    out_spare_.reserve(depth_);
  }
  ~ReaderThreadSource() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  bool next(Batch& out) override {
    if (inline_) {
      const bool got = inner_->next(out);
      if (got && out.final) inner_->publish_meta();
      return got;
    }
    if (!started_) {
      started_ = true;
      try {
        worker_ = std::thread([this] { produce(); });
      } catch (const std::exception&) {
        inline_ = true;  // no thread to be had: read on the consumer's thread instead
        return next(out);
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty() || done_; });
    if (ready_.empty()) return false;
    std::swap(out, ready_.front());
    // The consumer's previous batch goes back to the reader for reuse (keeps its capacity).
    if (out_spare_.size() < depth_) out_spare_.push_back(std::move(ready_.front()));
    ready_.pop_front();
    lock.unlock();
    cv_.notify_all();
    // The reader is done with meta() once it produced the final batch (ordered by the mutex).
    if (out.final) inner_->publish_meta();
    return true;
  }

  TraceMeta& meta() override { return inner_->meta(); }
  // The reader thread (unless it reads inline) and the fetch threads.
  unsigned busy_threads() const override { return (inline_ ? 0U : 1U) + inner_->busy_threads(); }
  // The oldest queued batch, when the reader is ahead: it stays where it is until next() swaps
  // it out (later batches go into other slots of the ring).
  PrefetchHint upcoming() override {
    if (inline_ || !started_) return {};
    std::lock_guard<std::mutex> lock(mu_);
    if (ready_.empty()) return {};
    const std::vector<Event>& next = ready_.front().events;
    return {next.data(), next.size() * sizeof(Event)};
  }

 private:
  // StreamSource::next() never throws and the queues never allocate: nothing here can throw.
  void produce() {
    for (;;) {
      Batch b;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !ready_.full() || stop_; });
        if (stop_) break;
        if (!out_spare_.empty()) {
          b = std::move(out_spare_.back());
          out_spare_.pop_back();
        }
      }
      const bool got = inner_->next(b);
      std::lock_guard<std::mutex> lock(mu_);
      if (!got) break;
      const bool last = b.final;
      ready_.push_back(std::move(b));
      cv_.notify_all();
      if (last) break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  std::unique_ptr<StreamSource> inner_;
  size_t depth_;
  bool started_ = false, inline_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  FixedRing<Batch> ready_;        // at most depth_ batches
  std::vector<Batch> out_spare_;  // capacity depth_
  bool stop_ = false, done_ = false;
  std::thread worker_;
};

}  // namespace

bool is_sqlite_file(const std::string& path) {
  if (path.empty()) return false;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[16] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 16 && std::memcmp(magic, "SQLite format 3", 16) == 0;
}

std::unique_ptr<EventSource> open_sqlite_trace(const std::string& path, std::string& error, size_t batch_size) {
  SqliteReadOptions options;
  options.batch_size = batch_size;
  // For A/B benchmarks and checks (docs/performance.md): INGERO_SQLITE_STREAM=0 selects the old
  // load-and-sort path, INGERO_SQLITE_READER_THREAD=0 streams without the reader thread.
  if (const char* v = std::getenv("INGERO_SQLITE_STREAM"); v && std::string_view(v) == "0") options.stream = false;
  if (const char* v = std::getenv("INGERO_SQLITE_READER_THREAD"); v && std::string_view(v) == "0")
    options.reader_thread = false;
  if (const char* v = std::getenv("INGERO_SQLITE_FETCH_THREADS"); v && *v)
    options.fetch_threads = static_cast<size_t>(std::strtoul(v, nullptr, 10));
  // Parallel fetching pays only where there is a second core to run it.
  if (std::thread::hardware_concurrency() == 1) options.fetch_threads = 0;
  options.progress = std::getenv("INGERO_QUIET") == nullptr;
  return open_sqlite_trace(path, error, options);
}

std::unique_ptr<EventSource> open_sqlite_trace(const std::string& path, std::string& error,
                                               const SqliteReadOptions& options) {
  // A directory or glob of rolled files (sinks/store/rollover.h) replays as one trace.
  if (is_trace_set_path(path)) return open_trace_set(path, error, options);
  const std::string shown = path.empty() ? "(empty path)" : path;
  try {
    const auto probe = sqlite_detail::probe_sqlite_file(path);
    if (!probe.problem.empty()) {
      error = shown + ": " + probe.problem;
      return nullptr;
    }
    std::string why;
    auto db = sqlite_detail::open_readonly(path, probe, why);
    if (!db) {
      error = shown + ": " + why;
      return nullptr;
    }
    // A hostile file's 200 MB string is refused by SQLite before it is loaded.
    sqlite3_limit(db.get(), SQLITE_LIMIT_LENGTH, kSqliteMaxValueBytes);
    TraceMeta meta;
    meta.path = path;
    if (options.stream) {
      auto source = std::make_unique<StreamSource>(std::move(db), std::move(meta), options, probe);
      if (!source->open(why)) {
        error = shown + ": " + why;
        return nullptr;
      }
      if (options.reader_thread) return std::make_unique<ReaderThreadSource>(std::move(source), 4);
      return source;
    }
    std::vector<Event> events;
    Reader reader(db.get(), meta);
    if (!reader.run(events, why)) {
      error = shown + ": " + why;
      return nullptr;
    }
    db.reset();
    const uint64_t rows_read = meta.health.rows_read;
    auto source = std::make_unique<VectorSource>(std::move(events), options.batch_size ? options.batch_size : 4096,
                                                 std::move(meta));
    source->meta().health.rows_read = rows_read;
    return source;
  } catch (const std::exception& e) {  // allocation failure on a huge trace, JSON oddities
    error = shown + ": cannot load trace (" + e.what() + ")";
    return nullptr;
  }
}

}  // namespace ingero
