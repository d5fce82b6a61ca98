// ip_annotations: the explicit annotations of `trace --annotate` (write_annotations), and their
// reading back for `explain` (read_annotations, which also reads Ingero's own `annotations`).
#include <algorithm>
#include <string>

#include "sinks/store/rollover.h"
#include "sinks/store/sqlite_schema.h"
#include "sinks/store/sqlite_store.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {
namespace {

using sqlite_detail::Stmt;

void skip(AnnotationReadStats& s, const std::string& why) {
  ++s.skipped;
  ++s.reasons[why];
}

// An INTEGER column >= 0 (NULL reads as 0); false for text, a fraction or a negative number.
bool uint_column(const Stmt& st, int c, uint64_t max, uint64_t& out) {
  if (st.is_null(c)) return out = 0, true;
  if (st.type(c) != SQLITE_INTEGER) return false;
  const int64_t v = st.i64(c);
  if (v < 0 || static_cast<uint64_t>(v) > max) return false;
  out = static_cast<uint64_t>(v);
  return true;
}

}  // namespace

bool write_annotations(const std::string& path, const std::vector<Annotation>& rows,
                       const std::vector<std::string>& nodes, std::string& error) {
  const std::string shown = path.empty() ? "(empty path)" : path;
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    error = shown + ": " + (raw ? sqlite3_errmsg(raw) : "cannot open");
    sqlite3_close(raw);
    return false;
  }
  sqlite_detail::Db db(raw);
  std::string why;
  if (!sqlite_detail::exec(db.get(), "BEGIN", why) ||
      !sqlite_detail::exec(db.get(), sqlite_detail::kAnnotationsSql, why))
    return error = shown + ": creating ip_annotations: " + why, false;
  Stmt st(db.get(),
          "INSERT INTO ip_annotations(ts_ns, ts_given, node, pid, tid, start_time, span_start, span_end, labels, step,"
          " epoch, peer_pid, peer_uid, peer_gid) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14)");
  if (!st.ok()) return error = shown + ": writing ip_annotations: " + st.error(), false;
  for (const Annotation& a : rows) {
    st.bind_u64(1, a.ts_ns);
    st.bind(2, int64_t{a.ts_given ? 1 : 0});
    st.bind(3, a.node < nodes.size() ? std::string_view(nodes[a.node]) : "node#" + std::to_string(a.node));
    st.bind(4, int64_t{a.pid});
    st.bind(5, int64_t{a.tid});
    st.bind_u64(6, a.start_time);
    st.bind_u64(7, a.span_start_ns);
    st.bind_u64(8, a.span_end_ns);
    st.bind(9, labels_json(a));
    const std::string* step = a.label("step");
    const std::string* epoch = a.label("epoch");
    if (step && label_number(*step) >= 0) st.bind(10, label_number(*step));
    else st.bind_null(10);
    if (epoch && label_number(*epoch) >= 0) st.bind(11, label_number(*epoch));
    else st.bind_null(11);
    st.bind(12, int64_t{a.peer_pid});
    st.bind(13, int64_t{a.peer_uid});
    st.bind(14, int64_t{a.peer_gid});
    if (st.step() != SQLITE_DONE)
      return error = shown +
                     ": writing ip_annotations: " + sqlite_detail::describe_sqlite_error(db.get(), SQLITE_ERROR),
             false;
    st.reset();
  }
  if (!sqlite_detail::exec(db.get(), "COMMIT", why)) return error = shown + ": writing ip_annotations: " + why, false;
  return true;
}

bool read_annotations(const std::string& path, const std::vector<std::string>& nodes, std::vector<Annotation>& out,
                      AnnotationReadStats& stats, std::string& error) {
  // A set of rolled files (sinks/store/rollover.h): every file's rows, in time order.
  if (is_trace_set_path(path)) {
    std::vector<std::string> files;
    out.clear();
    stats = AnnotationReadStats{};
    if (!list_trace_set(path, files, error)) return false;
    for (const std::string& f : files) {
      std::vector<Annotation> rows;
      AnnotationReadStats fs;
      if (!read_annotations(f, nodes, rows, fs, error)) return false;
      if (stats.table.empty()) stats.table = fs.table;
      stats.rows += fs.rows;
      stats.skipped += fs.skipped;
      for (const auto& [k, v] : fs.reasons) stats.reasons[k] += v;
      out.insert(out.end(), rows.begin(), rows.end());
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const Annotation& a, const Annotation& b) { return a.ts_ns < b.ts_ns; });
    return true;
  }
  const std::string shown = path.empty() ? "(empty path)" : path;
  out.clear();
  stats = AnnotationReadStats{};
  try {
    const auto probe = sqlite_detail::probe_sqlite_file(path);
    if (!probe.problem.empty()) return error = shown + ": " + probe.problem, false;
    std::string why;
    auto db = sqlite_detail::open_readonly(path, probe, why);
    if (!db) return error = shown + ": " + why, false;
    const bool ours = sqlite_detail::table_exists(db.get(), "ip_annotations");
    std::string sql;
    if (ours) {
      sql =
          "SELECT ts_ns, node, pid, tid, start_time, span_start, span_end, labels, peer_pid, peer_uid, peer_gid,"
          " ts_given FROM ip_annotations ORDER BY ts_ns, rowid";
    } else if (sqlite_detail::table_exists(db.get(), "annotations")) {
      // Ingero's table (agent v0.17+); any other tool's `annotations` is not ours to read.
      const auto cols = sqlite_detail::table_columns(db.get(), "annotations");
      const auto has = [&](const char* c) { return std::find(cols.begin(), cols.end(), c) != cols.end(); };
      if (!has("timestamp") || !has("labels")) return true;
      const auto col = [&](const char* c) { return has(c) ? std::string(c) : std::string("0"); };
      sql = "SELECT timestamp, '', " + col("pid") + ", 0, " + col("start_time") + ", " + col("span_start") + ", " +
            col("span_end") + ", labels, " + col("peer_pid") + ", " + col("peer_uid") + ", " + col("peer_gid") +
            ", 1 FROM annotations ORDER BY timestamp, rowid";
    } else {
      return true;
    }
    Stmt st(db.get(), sql);
    if (!st.ok()) return error = shown + ": reading annotations: " + st.error(), false;
    stats.table = ours ? "ip_annotations" : "annotations";
    constexpr uint64_t kI64 = static_cast<uint64_t>(INT64_MAX);
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) {
      if (stats.rows >= kMaxAnnotationRows) {
        skip(stats, "over the " + std::to_string(kMaxAnnotationRows) + "-row cap");
        continue;
      }
      Annotation a;
      uint64_t ts = 0, pid = 0, tid = 0, v = 0;
      if (!uint_column(st, 0, kI64, ts) || ts == 0) {
        skip(stats, "time not a positive integer");
        continue;
      }
      a.ts_ns = ts;
      const std::string node = st.text(1);
      const auto n = std::find(nodes.begin(), nodes.end(), node);
      if (n == nodes.end()) {
        skip(stats, "node not in the trace");
        continue;
      }
      a.node = static_cast<uint16_t>(n - nodes.begin());
      if (!uint_column(st, 2, UINT32_MAX, pid) || !uint_column(st, 3, UINT32_MAX, tid)) {
        skip(stats, "pid or tid out of range");
        continue;
      }
      a.pid = static_cast<uint32_t>(pid);
      a.tid = static_cast<uint32_t>(tid);
      if (!uint_column(st, 4, UINT64_MAX >> 1, a.start_time) || !uint_column(st, 5, kI64, a.span_start_ns) ||
          !uint_column(st, 6, kI64, a.span_end_ns)) {
        skip(stats, "start_time or span not a non-negative integer");
        continue;
      }
      const std::string labels = st.text(7);
      if (labels.size() > kMaxTextBytes || !parse_labels_json(labels, a.labels) || a.labels.empty()) {
        skip(stats, "labels not a JSON object of strings");
        continue;
      }
      if (uint_column(st, 8, UINT32_MAX, v)) a.peer_pid = static_cast<uint32_t>(v);
      if (uint_column(st, 9, UINT32_MAX, v)) a.peer_uid = static_cast<uint32_t>(v);
      if (uint_column(st, 10, UINT32_MAX, v)) a.peer_gid = static_cast<uint32_t>(v);
      a.ts_given = st.i64(11) != 0;
      out.push_back(std::move(a));
      ++stats.rows;
    }
    if (rc != SQLITE_DONE)
      return error = shown + ": reading " + stats.table + ": " + sqlite_detail::describe_sqlite_error(db.get(), rc),
             false;
    return true;
  } catch (const std::exception& e) {
    error = shown + ": cannot read annotations (" + e.what() + ")";
    return false;
  }
}

}  // namespace ingero
