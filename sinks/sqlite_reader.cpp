// Replay of Ingero trace databases (0.8, 0.9) and of our own (ingero-pipeline-1) into Batches.
// See sinks/sqlite_store.h for the contract and docs/storage.md for the column mapping.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "engine/ops.h"
#include "sinks/sqlite_store.h"
#include "sinks/sqlite_util.h"

namespace ingero {
namespace {

using sqlite_detail::Stmt;

// The events columns we read, in the order of the SELECT. `fallback` replaces a column the table
// lacks (NULL = the column is required). `not_null` mirrors Ingero's schema: a NULL there means
// the row was not written by Ingero's writer and is skipped.
enum Col {
  kId, kTs, kPid, kTid, kSource, kOp, kDur, kGpu, kArg0, kArg1, kRet, kStack, kCgroup, kNode,
  kRank, kPrevState, kFlags, kNumCols
};
struct ColSpec {
  const char* name;
  const char* fallback;
  bool not_null;
};
constexpr ColSpec kCols[kNumCols] = {
    {"id", "NULL", false},        {"timestamp", nullptr, true}, {"pid", nullptr, true},
    {"tid", nullptr, true},       {"source", nullptr, true},    {"op", nullptr, true},
    {"duration", nullptr, true},  {"gpu_id", "0", true},        {"arg0", "0", true},
    {"arg1", "0", true},          {"ret_code", "0", true},      {"stack_hash", "0", true},
    {"cgroup_id", "0", true},     {"node", "''", true},         {"rank", "NULL", false},
    {"prev_state", "0", true},    {"flags", "0", true},
};

bool has(const std::vector<std::string>& cols, std::string_view name) {
  return std::find(cols.begin(), cols.end(), name) != cols.end();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A key/value table (schema_info, ip_meta) as a map; empty when absent or unreadable.
std::map<std::string, std::string> read_kv(sqlite3* db, const char* table) {
  std::map<std::string, std::string> kv;
  if (!sqlite_detail::table_exists(db, table)) return kv;
  Stmt s(db, std::string("SELECT key, value FROM ") + table);
  if (!s.ok()) return kv;
  while (s.step() == SQLITE_ROW) kv[s.text(0)] = s.text(1);
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

class Reader {
 public:
  Reader(sqlite3* db, TraceMeta& meta) : db_(db), meta_(meta) {}

  // Fills meta_ and events; returns false with `error` (no path prefix) on a fatal problem.
  bool run(std::vector<Event>& events, std::string& error) {
    const auto tables = table_names();
    if (!has(tables, "events")) {
      error = tables.empty()
                  ? "no `events` table: not an Ingero trace (the database has no tables)"
                  : "no `events` table: not an Ingero trace (tables: " + join(tables) + ")";
      return false;
    }
    columns_ = sqlite_detail::table_columns(db_, "events");
    std::vector<std::string> missing;
    for (const auto& c : kCols)
      if (!c.fallback && !has(columns_, c.name)) missing.push_back(c.name);
    if (!missing.empty()) {
      error = "table `events` lacks required column" + std::string(missing.size() > 1 ? "s " : " ") +
              join(missing) + " (a trace needs timestamp, pid, tid, source, op, duration)";
      return false;
    }
    detect_format();
    read_nodes();
    if (!read_events(events, error)) return false;
    read_process_names();
    read_thread_names();
    read_stacks();
    read_sessions();
    read_snapshots();
    if (ours_) read_recorded_health();
    return true;
  }

 private:
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
    if (auto it = info.find("version"); it != info.end() && !it->second.empty())
      meta_.format = "ingero-" + it->second;
    else
      meta_.format = has(columns_, "node") ? "ingero-0.9" : "ingero-0.8";
  }

  // Ingero databases: node indexes follow the sorted node names, so they do not depend on the
  // order rows were merged in. Our databases carry the original order in ip_meta.nodes.
  void read_nodes() {
    for (size_t i = 0; i < meta_.nodes.size(); ++i)
      node_cache_.emplace(meta_.nodes[i], static_cast<uint16_t>(i));
    if (ours_ || !has(columns_, "node")) return;
    Stmt s(db_, "SELECT DISTINCT node FROM events WHERE node IS NOT NULL ORDER BY node");
    if (!s.ok()) return;
    while (s.step() == SQLITE_ROW) node_for(s.text(0));
  }

  // -1 when there are more names than Event::node can index.
  int node_for(const std::string& name) {
    if (auto it = node_cache_.find(name); it != node_cache_.end()) return it->second;
    if (meta_.nodes.size() > std::numeric_limits<uint16_t>::max()) return -1;
    const uint16_t idx = meta_.node_index(name);
    node_cache_.emplace(name, idx);
    return idx;
  }

  bool read_events(std::vector<Event>& events, std::string& error) {
    std::string sql = "SELECT ";
    for (int c = 0; c < kNumCols; ++c) {
      if (c) sql += ", ";
      sql += has(columns_, kCols[c].name) ? std::string("\"") + kCols[c].name + "\""
                                          : std::string(kCols[c].fallback);
    }
    sql += " FROM events";
    Stmt s(db_, sql);
    if (!s.ok()) {
      error = "cannot read `events`: " + s.error();
      return false;
    }
    const bool node_col = has(columns_, "node");
    uint64_t row = 0;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      ++row;
      Event e;
      if (const char* why = decode(s, row, node_col, e)) {
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
    }
    return true;
  }

  // Returns the reason to skip the row, or null when `e` is filled.
  const char* decode(const Stmt& s, uint64_t row, bool node_col, Event& e) {
    int64_t v[kNumCols] = {};
    for (int c = kTs; c < kNumCols; ++c) {
      if (c == kNode) continue;
      const int t = s.type(c);
      if (t == SQLITE_NULL) {
        if (kCols[c].not_null) return null_reason(c);
        v[c] = (c == kRank) ? -1 : 0;
        continue;
      }
      if (t != SQLITE_INTEGER) return non_integer_reason(c);
      v[c] = s.i64(c);
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
    if (v[kRank] < -1 || v[kRank] > std::numeric_limits<int16_t>::max())
      return "rank out of range -1..32767";
    if (v[kPrevState] < 0 || v[kPrevState] > static_cast<int64_t>(OffCpuState::kOther))
      return "unknown prev_state";
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

    std::string node_name = node_col ? s.text(kNode) : std::string();
    if (node_col && s.is_null(kNode)) return null_reason(kNode);
    uint64_t id = row;
    if (s.type(kId) == SQLITE_INTEGER) {
      id = static_cast<uint64_t>(s.i64(kId));
    } else if (s.type(kId) == SQLITE_TEXT) {
      // 0.9: "{node}:{seq}". Node names may hold colons, the seq never does.
      const std::string text = s.text(kId);
      const size_t colon = text.rfind(':');
      const std::string_view seq =
          colon == std::string::npos ? std::string_view(text) : std::string_view(text).substr(colon + 1);
      uint64_t parsed = 0;
      const auto [end, ec] = std::from_chars(seq.data(), seq.data() + seq.size(), parsed);
      if (ec == std::errc() && end == seq.data() + seq.size() && !seq.empty()) id = parsed;
      if (!node_col && colon != std::string::npos) node_name = text.substr(0, colon);
    }
    const int node = node_for(node_name);
    if (node < 0) return "more than 65535 distinct node names";

    e.ts_ns = ts;
    e.dur_ns = dur;
    e.id = id;
    e.arg0 = static_cast<uint64_t>(v[kArg0]);
    e.arg1 = static_cast<uint64_t>(v[kArg1]);
    e.stack_id = static_cast<uint64_t>(v[kStack]);  // Ingero's FNV-64 is stored signed
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
  const char* intern(std::string s) { return interned_.emplace(s, s).first->second.c_str(); }
  const char* null_reason(int c) {
    return intern(std::string("NULL in events.") + kCols[c].name + " (a NOT NULL column)");
  }
  const char* non_integer_reason(int c) {
    return intern(std::string("non-integer value in events.") + kCols[c].name);
  }
  const char* unknown_op_reason(int64_t source, int64_t op) {
    std::string s = "unknown op id (source " + std::to_string(source);
    if (source >= 0 && source <= 255)
      if (const auto* info = find_source(static_cast<Source>(source)))
        s += " " + std::string(info->name);
    return intern(s + ", op " + std::to_string(op) + ")");
  }

  // Side tables are best-effort: a trace without them still analyses; a broken one is reported.
  void side_table_failed(const char* table, int rc) {
    meta_.health.skip(std::string(table) + " unreadable: " +
                      sqlite_detail::describe_sqlite_error(db_, rc));
  }

  void read_process_names() {
    if (!sqlite_detail::table_exists(db_, "process_names")) return;
    Stmt s(db_, "SELECT pid, name FROM process_names");
    if (!s.ok()) return side_table_failed("process_names", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) < 0 ||
          s.i64(0) > std::numeric_limits<uint32_t>::max())
        continue;
      meta_.process_names[static_cast<uint32_t>(s.i64(0))] = s.text(1);
    }
    if (rc != SQLITE_DONE) side_table_failed("process_names", rc);
  }

  // Ours only (ip_thread_names): Ingero records process names, not thread names.
  void read_thread_names() {
    if (!sqlite_detail::table_exists(db_, "ip_thread_names")) return;
    Stmt s(db_, "SELECT tid, name FROM ip_thread_names");
    if (!s.ok()) return side_table_failed("ip_thread_names", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) < 0 || s.i64(0) > std::numeric_limits<uint32_t>::max())
        continue;
      meta_.thread_names[static_cast<uint32_t>(s.i64(0))] = s.text(1);
    }
    if (rc != SQLITE_DONE) side_table_failed("ip_thread_names", rc);
  }

  void read_stacks() {
    if (!sqlite_detail::table_exists(db_, "stack_traces")) return;
    const auto cols = sqlite_detail::table_columns(db_, "stack_traces");
    Stmt s(db_, "SELECT hash, " + select_list(cols, {{"ips", "''"}, {"frames", "''"}}) +
                    " FROM stack_traces");
    if (!s.ok()) return side_table_failed("stack_traces", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER) continue;
      meta_.stacks[static_cast<uint64_t>(s.i64(0))] = StackTrace{s.text(1), s.text(2)};
    }
    if (rc != SQLITE_DONE) side_table_failed("stack_traces", rc);
  }

  void read_sessions() {
    if (!sqlite_detail::table_exists(db_, "sessions")) return;
    const auto cols = sqlite_detail::table_columns(db_, "sessions");
    Stmt s(db_, "SELECT " +
                    select_list(cols, {{"started_at", "0"}, {"stopped_at", "0"},
                                       {"gpu_model", "''"}, {"gpu_driver", "''"},
                                       {"cpu_model", "''"}, {"cpu_cores", "0"}, {"mem_total", "0"},
                                       {"kernel", "''"}, {"os_release", "''"}, {"cuda_ver", "''"},
                                       {"python_ver", "''"}, {"ingero_ver", "''"},
                                       {"pid_filter", "''"}, {"flags", "''"}}) +
                    " FROM sessions ORDER BY " + (has(cols, "id") ? "id" : "rowid"));
    if (!s.ok()) return side_table_failed("sessions", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      SessionInfo si;
      si.started_at = static_cast<uint64_t>(s.i64(0));
      si.stopped_at = static_cast<uint64_t>(s.i64(1));
      si.gpu_model = s.text(2);
      si.gpu_driver = s.text(3);
      si.cpu_model = s.text(4);
      si.cpu_cores = static_cast<uint32_t>(s.i64(5));
      si.mem_total_mb = static_cast<uint64_t>(s.i64(6));
      si.kernel = s.text(7);
      si.os_release = s.text(8);
      si.cuda_ver = s.text(9);
      si.python_ver = s.text(10);
      si.tool_ver = s.text(11);
      si.pid_filter = s.text(12);
      si.flags = s.text(13);
      meta_.sessions.push_back(std::move(si));
    }
    if (rc != SQLITE_DONE) side_table_failed("sessions", rc);
  }

  void read_snapshots() {
    if (!sqlite_detail::table_exists(db_, "system_snapshots")) return;
    const auto cols = sqlite_detail::table_columns(db_, "system_snapshots");
    if (!has(cols, "timestamp")) return;
    Stmt s(db_, "SELECT timestamp, " +
                    select_list(cols, {{"cpu_pct", "0"}, {"mem_pct", "0"}, {"load_avg", "0"},
                                       {"mem_avail", "0"}, {"swap_mb", "0"}}) +
                    " FROM system_snapshots ORDER BY timestamp");
    if (!s.ok()) return side_table_failed("system_snapshots", sqlite3_errcode(db_));
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      if (s.type(0) != SQLITE_INTEGER || s.i64(0) <= 0) continue;
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
    if (!sqlite_detail::table_exists(db_, "ip_health")) return;
    Stmt s(db_, "SELECT kind, reason, count FROM ip_health ORDER BY rowid");
    if (!s.ok()) return;
    while (s.step() == SQLITE_ROW) {
      const std::string kind = s.text(0);
      const auto n = static_cast<uint64_t>(std::max<int64_t>(0, s.i64(2)));
      if (kind == "drop")
        meta_.health.dropped_events += n;
      else if (kind == "skip")
        meta_.health.skip(s.text(1), n);
    }
  }

  sqlite3* db_;
  TraceMeta& meta_;
  std::vector<std::string> columns_;
  bool ours_ = false;
  std::unordered_map<std::string, uint16_t> node_cache_;
  std::map<std::string, std::string> interned_;
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

std::unique_ptr<EventSource> open_sqlite_trace(const std::string& path, std::string& error,
                                               size_t batch_size) {
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
    TraceMeta meta;
    meta.path = path;
    std::vector<Event> events;
    Reader reader(db.get(), meta);
    if (!reader.run(events, why)) {
      error = shown + ": " + why;
      return nullptr;
    }
    db.reset();
    const uint64_t rows_read = meta.health.rows_read;
    auto source = std::make_unique<VectorSource>(std::move(events), batch_size, std::move(meta));
    source->meta().health.rows_read = rows_read;
    return source;
  } catch (const std::exception& e) {  // allocation failure on a huge trace, JSON oddities
    error = shown + ": cannot load trace (" + e.what() + ")";
    return nullptr;
  }
}

}  // namespace ingero
