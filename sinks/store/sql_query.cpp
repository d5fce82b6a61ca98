#include "sinks/store/sql_query.h"

#include "sinks/store/rollover.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

namespace ingero {
namespace {

using Clock = std::chrono::steady_clock;

// What the progress handler and the authorizer learn while one statement runs.
struct RunGuard {
  Clock::time_point deadline;
  int64_t memory_base = 0;
  int64_t memory_cap = 0;
  const std::atomic<bool>* cancel = nullptr;
  std::string interrupt_kind;  // "timeout", "memory", "cancelled"
  std::string denied;          // first denial reason, for the error message
};

bool equals_nocase(const char* a, std::string_view b) {
  if (a == nullptr) return false;
  const size_t n = std::strlen(a);
  if (n != b.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

template <size_t N>
bool in_list(const char* name, const std::string_view (&list)[N]) {
  return std::any_of(std::begin(list), std::end(list), [&](std::string_view s) { return equals_nocase(name, s); });
}

// Functions that reach outside the database (files, shared libraries) or change how SQLite
// tokenises. Stock SQLite lacks most of them; they are listed so a build that has them (the
// sqlite3 shell's fileio, zipfile) is still safe.
constexpr std::string_view kDeniedFunctions[] = {"load_extension",
                                                 "readfile",
                                                 "writefile",
                                                 "edit",
                                                 "lsmode",
                                                 "fts3_tokenizer",
                                                 "zipfile",
                                                 "zipfile_cds",
                                                 "sqlar_compress",
                                                 "sqlar_uncompress",
                                                 "shell_add_schema",
                                                 "shell_escape_crnl",
                                                 "shell_module_schema",
                                                 "shell_putsnl",
                                                 "sqlite_dbpage",
                                                 "fsdir"};

// Introspection pragmas that only read and may name a table or index.
constexpr std::string_view kPragmasWithArg[] = {"table_info", "table_xinfo", "index_list",
                                                "index_info", "index_xinfo", "foreign_key_list"};
// Read-only pragmas that are harmless without an argument (with one, most would be a setter).
constexpr std::string_view kPragmasNoArg[] = {"table_list",    "page_count",     "page_size",       "schema_version",
                                              "user_version",  "encoding",       "freelist_count",  "application_id",
                                              "function_list", "collation_list", "module_list",     "pragma_list",
                                              "table_info",    "index_list",     "foreign_key_list"};

const char* action_name(int action) {
  switch (action) {
    case SQLITE_CREATE_INDEX:
    case SQLITE_CREATE_TABLE:
    case SQLITE_CREATE_TEMP_INDEX:
    case SQLITE_CREATE_TEMP_TABLE:
    case SQLITE_CREATE_TEMP_TRIGGER:
    case SQLITE_CREATE_TEMP_VIEW:
    case SQLITE_CREATE_TRIGGER:
    case SQLITE_CREATE_VIEW:
    case SQLITE_CREATE_VTABLE: return "CREATE";
    case SQLITE_DROP_INDEX:
    case SQLITE_DROP_TABLE:
    case SQLITE_DROP_TEMP_INDEX:
    case SQLITE_DROP_TEMP_TABLE:
    case SQLITE_DROP_TEMP_TRIGGER:
    case SQLITE_DROP_TEMP_VIEW:
    case SQLITE_DROP_TRIGGER:
    case SQLITE_DROP_VIEW:
    case SQLITE_DROP_VTABLE: return "DROP";
    case SQLITE_INSERT: return "INSERT";
    case SQLITE_UPDATE: return "UPDATE";
    case SQLITE_DELETE: return "DELETE";
    case SQLITE_TRANSACTION: return "a transaction statement";
    case SQLITE_SAVEPOINT: return "SAVEPOINT";
    case SQLITE_ATTACH: return "ATTACH";
    case SQLITE_DETACH: return "DETACH";
    case SQLITE_ALTER_TABLE: return "ALTER TABLE";
    case SQLITE_REINDEX: return "REINDEX";
    case SQLITE_ANALYZE: return "ANALYZE";
    case SQLITE_COPY: return "COPY";
    default: return "this statement";
  }
}

// Default deny: only the actions a SELECT needs are allowed.
int authorize(void* ctx, int action, const char* a3, const char* a4, const char* /*db*/,
              const char* /*trigger_or_view*/) {
  auto* guard = static_cast<RunGuard*>(ctx);
  auto deny = [&](std::string why) {
    if (guard->denied.empty()) guard->denied = std::move(why);
    return SQLITE_DENY;
  };
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_RECURSIVE: return SQLITE_OK;
    case SQLITE_UPDATE:
      // SQLite itself asks this while it connects an eponymous virtual table (pragma_table_info):
      // it is not a write. A real UPDATE of the schema table is still stopped by the read-only
      // connection, DEFENSIVE mode and the sqlite3_stmt_readonly() check.
      if (equals_nocase(a3, "sqlite_master") || equals_nocase(a3, "sqlite_schema")) return SQLITE_OK;
      return deny("UPDATE is not allowed: the database is read-only");
    case SQLITE_FUNCTION:
      // a3 is unused, a4 is the function name.
      if (a4 == nullptr || in_list(a4, kDeniedFunctions))
        return deny(std::string("function ") + (a4 ? a4 : "?") + "() is not allowed (file or extension access)");
      return SQLITE_OK;
    case SQLITE_PRAGMA:
      if (a4 == nullptr ? in_list(a3, kPragmasNoArg) : in_list(a3, kPragmasWithArg)) return SQLITE_OK;
      return deny(std::string("PRAGMA ") + (a3 ? a3 : "?") + (a4 ? " with an argument" : "") +
                  " is not allowed (only table_info, index_list and similar read-only pragmas)");
    default:
      if ((action == SQLITE_DELETE || action == SQLITE_INSERT) &&
          (equals_nocase(a3, "sqlite_master") || equals_nocase(a3, "sqlite_temp_master")))
        return deny("schema changes (CREATE, DROP, ALTER) are not allowed: the database is read-only");
      return deny(std::string(action_name(action)) + " is not allowed: the database is read-only");
  }
}

int on_progress(void* ctx) {
  auto* guard = static_cast<RunGuard*>(ctx);
  if (guard->cancel != nullptr && guard->cancel->load(std::memory_order_relaxed)) {
    guard->interrupt_kind = "cancelled";
    return 1;
  }
  if (Clock::now() > guard->deadline) {
    guard->interrupt_kind = "timeout";
    return 1;
  }
  if (guard->memory_cap > 0 && sqlite3_memory_used() - guard->memory_base > guard->memory_cap) {
    guard->interrupt_kind = "memory";
    return 1;
  }
  return 0;
}

bool file_nonempty(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && st.st_size > 0;
}

// RFC 3986 percent-encoding for an SQLite URI path.
std::string uri_path(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

size_t rendered_size(const SqlValue& v) {
  switch (v.type) {
    case SqlValue::Type::kNull: return 4;
    case SqlValue::Type::kInteger: return 20;
    case SqlValue::Type::kReal: return 24;
    case SqlValue::Type::kText: return v.bytes.size() + 2;
    case SqlValue::Type::kBlob: return std::min<size_t>(v.bytes.size(), 64) * 2 + 32;
  }
  return 0;
}

std::string kind_for(int rc, const RunGuard& guard, const char* msg) {
  const int prim = rc & 0xff;
  if (prim == SQLITE_AUTH || prim == SQLITE_READONLY || !guard.denied.empty()) return "denied";
  if (prim == SQLITE_INTERRUPT) return guard.interrupt_kind.empty() ? "cancelled" : guard.interrupt_kind;
  if (prim == SQLITE_TOOBIG) return "too_big";
  if (prim == SQLITE_NOMEM) return "memory";
  // The file itself is damaged (a page SQLite cannot read): not the statement's fault.
  if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB || prim == SQLITE_IOERR) return "damaged";
  if (msg != nullptr && std::strstr(msg, "may not be modified") != nullptr) return "denied";
  if (msg != nullptr && std::strstr(msg, "syntax error") != nullptr) return "syntax";
  return "error";
}

// Limit errors name the database file and the limit that stopped the statement, so a user of
// `query` or an agent calling run_sql knows which knob to turn (or to add a LIMIT/WHERE).
std::string message_for(const std::string& kind, const RunGuard& guard, const SqlLimits& limits, const char* msg,
                        const std::string& path) {
  if (kind == "denied" && !guard.denied.empty()) return guard.denied;
  if (kind == "timeout")
    return path + ": the query ran longer than its " + std::to_string(limits.max_ms) +
           " ms budget (time limit) and was stopped";
  if (kind == "memory")
    return path + ": the query used more than its memory limit of " + std::to_string(limits.max_memory_bytes >> 20) +
           " MiB and was stopped";
  if (kind == "cancelled") return "the query was cancelled";
  if (kind == "damaged")
    return path + ": damaged file: " + std::string(msg ? msg : "unreadable page") +
           " (a page the statement needs cannot be read; `PRAGMA integrity_check` lists the damage)";
  if (kind == "too_big")
    return path + ": " + std::string(msg ? msg : "value too big") + " (the value limit is " +
           std::to_string(limits.max_value_bytes) + " bytes per string or blob)";
  return msg ? msg : "unknown SQLite error";
}

// printf('%.*c', 2147483647, 'x') spends ~13 s inside one VM step filling a string it then
// truncates (SQLite 3.40): the progress handler cannot stop it. printf/format are replaced by a
// guard that refuses widths and precisions longer than the value limit and forwards everything
// else to the built-in printf on a private in-memory connection.
struct PrintfGuard {
  sqlite3* aux = nullptr;
  ~PrintfGuard() { sqlite3_close_v2(aux); }
};

// Largest width or precision in a printf format; `args` supplies '*' values.
int64_t largest_printf_field(std::string_view fmt, int argc, sqlite3_value** argv) {
  int64_t largest = 0;
  int next_arg = 1;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') continue;
    ++i;
    if (i < fmt.size() && fmt[i] == '%') continue;
    while (i < fmt.size() && std::strchr("-+ #!,0", fmt[i]) != nullptr) ++i;
    for (int part = 0; part < 2; ++part) {
      if (i < fmt.size() && fmt[i] == '*') {
        const int64_t v = next_arg < argc ? sqlite3_value_int64(argv[next_arg]) : 0;
        ++next_arg;
        largest = std::max(largest, v < 0 ? (v == INT64_MIN ? INT64_MAX : -v) : v);
        ++i;
      } else {
        int64_t v = 0;
        while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
          v = std::min<int64_t>(v * 10 + (fmt[i] - '0'), INT64_MAX / 16);
          ++i;
        }
        largest = std::max(largest, v);
      }
      if (part == 0 && i < fmt.size() && fmt[i] == '.') ++i;
      else break;
    }
    while (i < fmt.size() && fmt[i] == 'l') ++i;
    ++next_arg;  // the conversion's own argument
  }
  return largest;
}

void guarded_printf(sqlite3_context* ctx, int argc, sqlite3_value** argv) {
  if (argc < 1 || sqlite3_value_type(argv[0]) == SQLITE_NULL) {
    sqlite3_result_null(ctx);
    return;
  }
  sqlite3* db = sqlite3_context_db_handle(ctx);
  const auto* fmt = reinterpret_cast<const char*>(sqlite3_value_text(argv[0]));
  const int n = sqlite3_value_bytes(argv[0]);
  const int limit = sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1);
  if (fmt == nullptr) {
    sqlite3_result_null(ctx);
    return;
  }
  if (largest_printf_field(std::string_view(fmt, static_cast<size_t>(n)), argc, argv) > limit) {
    sqlite3_result_error_toobig(ctx);
    return;
  }
  auto* guard = static_cast<PrintfGuard*>(sqlite3_user_data(ctx));
  if (guard->aux == nullptr) {
    if (sqlite3_open_v2(":memory:", &guard->aux, SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY, nullptr) != SQLITE_OK) {
      sqlite3_result_error(ctx, "printf is unavailable", -1);
      return;
    }
  }
  sqlite3_limit(guard->aux, SQLITE_LIMIT_LENGTH, limit);
  std::string sql = "SELECT printf(?1";
  for (int i = 2; i <= argc; ++i) sql += ",?" + std::to_string(i);
  sql += ")";
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(guard->aux, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    sqlite3_result_error(ctx, sqlite3_errmsg(guard->aux), -1);
    return;
  }
  for (int i = 0; i < argc; ++i) sqlite3_bind_value(stmt, i + 1, argv[i]);
  const int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) sqlite3_result_value(ctx, sqlite3_column_value(stmt, 0));
  else if ((rc & 0xff) == SQLITE_TOOBIG) sqlite3_result_error_toobig(ctx);
  else sqlite3_result_error(ctx, sqlite3_errmsg(guard->aux), -1);
  sqlite3_finalize(stmt);
}

void install_printf_guard(sqlite3* db) {
  auto* guard = new PrintfGuard();
  sqlite3_create_function_v2(db, "printf", -1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, guard, guarded_printf, nullptr,
                             nullptr, [](void* p) { delete static_cast<PrintfGuard*>(p); });
  // "format" shares the guard; SQLite runs the destructor once per registration, so it gets none.
  sqlite3_create_function_v2(db, "format", -1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, guard, guarded_printf, nullptr,
                             nullptr, nullptr);
}

}  // namespace

namespace {

// A set of rolled files (sinks/store/rollover.h) as one database: each file attached read-only
// (immutable when it has no WAL) as s0, s1, ... in time order, and a TEMP VIEW per table of the
// newest file that UNIONs ALL the files having it, so `SELECT ... FROM events` reads the set.
// Done after configure() (the limits) and before any statement of the user runs. False with `error` when a file does
// not attach or the set has more files than SQLite attaches.
bool attach_trace_set(sqlite3* db, const std::string& path, const std::vector<std::string>& files, std::string& error) {
  // After configure(): changing temp_store later would drop every TEMP view. The attach limit is
  // lifted for the set's files only, and put back to 0 at the end.
  const int max_attached = sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 125);
  if (files.size() > static_cast<size_t>(sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, -1)) || max_attached < 0) {
    error = path + ": the set has " + std::to_string(files.size()) + " files; SQL reads at most " +
            std::to_string(sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, -1)) +
            " at once (give a glob of fewer files, e.g. the last hours' names)";
    return false;
  }
  std::vector<std::vector<std::string>> tables(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const bool imm = !file_nonempty(files[i] + "-wal");
    const std::string uri = "file:" + uri_path(files[i]) + (imm ? "?immutable=1" : "?mode=ro");
    sqlite3_stmt* st = nullptr;
    const std::string sql = "ATTACH ?1 AS s" + std::to_string(i);
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      error = files[i] + ": cannot attach: " + sqlite3_errmsg(db);
      return false;
    }
    sqlite3_bind_text(st, 1, uri.c_str(), -1, SQLITE_TRANSIENT);
    const int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
      error = files[i] + ": cannot attach: " + sqlite3_errmsg(db);
      return false;
    }
    const std::string q = "SELECT name FROM s" + std::to_string(i) +
                          ".sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name";
    if (sqlite3_prepare_v2(db, q.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      error = files[i] + ": not a readable SQLite database: " + sqlite3_errmsg(db);
      return false;
    }
    while (sqlite3_step(st) == SQLITE_ROW)
      tables[i].emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
  }
  const auto sql_name = [](const std::string& n) {
    std::string q = "\"";
    for (char c : n) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const std::string& t : tables.back()) {
    std::string sql = "CREATE TEMP VIEW " + sql_name(t) + " AS ";
    bool first = true;
    for (size_t i = 0; i < files.size(); ++i) {
      if (std::find(tables[i].begin(), tables[i].end(), t) == tables[i].end()) continue;
      sql += (first ? "" : " UNION ALL ") + std::string("SELECT * FROM s") + std::to_string(i) + "." + sql_name(t);
      first = false;
    }
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      // Files of different schema versions: the newest file's table alone.
      sqlite3_free(err);
      err = nullptr;
      const std::string alone = "CREATE TEMP VIEW " + sql_name(t) + " AS SELECT * FROM s" +
                                std::to_string(files.size() - 1) + "." + sql_name(t);
      if (sqlite3_exec(db, alone.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
        error = path;
        error.append(": cannot build the view of table ").append(t).append(": ").append(err ? err : "?");
        sqlite3_free(err);
        return false;
      }
    }
  }
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  return true;
}

}  // namespace

namespace {

// A value's contribution to a row's fingerprint (check_index()): type and bytes, mixed.
uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
uint64_t value_hash(sqlite3_stmt* s, int c) {
  const int type = sqlite3_column_type(s, c);
  uint64_t h = static_cast<uint64_t>(type) * 0x9e3779b97f4a7c15ULL;
  if (type == SQLITE_INTEGER) return mix64(h ^ static_cast<uint64_t>(sqlite3_column_int64(s, c)));
  if (type == SQLITE_FLOAT) {
    const double d = sqlite3_column_double(s, c);
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return mix64(h ^ bits);
  }
  if (type == SQLITE_NULL) return mix64(h);
  const auto* p = static_cast<const unsigned char*>(sqlite3_column_blob(s, c));
  const int n = sqlite3_column_bytes(s, c);
  h ^= 0xcbf29ce484222325ULL;
  for (int i = 0; i < n && p != nullptr; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return mix64(h);
}
std::string sql_name(std::string_view name) {
  std::string q = "\"";
  for (const char ch : name) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + "\"";
}
std::string text_of(sqlite3_stmt* s, int c) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, c));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s, c))) : std::string();
}

// The rows a walk lists: count, an order-free sum of row fingerprints, and the first rowid that
// did not increase (a table walk only).
struct WalkSum {
  uint64_t rows = 0, sum = 0;
  bool back = false;
  int64_t back_at = 0;
  int rc = SQLITE_OK;
  std::string what;
};
WalkSum walk_sum(sqlite3* db, const std::string& sql, int ncols, bool rowid_order) {
  WalkSum w;
  sqlite3_stmt* s = nullptr;
  w.rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr);
  if (w.rc != SQLITE_OK) {
    w.what = sqlite3_errmsg(db);
    sqlite3_finalize(s);
    return w;
  }
  int64_t last = 0;
  while ((w.rc = sqlite3_step(s)) == SQLITE_ROW) {
    uint64_t h = 0;
    for (int c = 0; c < ncols; ++c) h = mix64(h + value_hash(s, c) + static_cast<uint64_t>(c));
    const int64_t rowid = sqlite3_column_int64(s, ncols);
    h = mix64(h ^ static_cast<uint64_t>(rowid));
    if (rowid_order && w.rows > 0 && rowid <= last && !w.back) {
      w.back = true;
      w.back_at = rowid;
    }
    last = rowid;
    ++w.rows;
    w.sum += h;
  }
  if (w.rc != SQLITE_DONE) w.what = sqlite3_errmsg(db);
  sqlite3_finalize(s);
  return w;
}

// Whether index `index` of `table` (database `schema`) lists exactly the table's rows with the
// table's key values: one walk of the index alone (a covering scan of its keys and rowids)
// against one walk of the table, compared by count and by a sum of row fingerprints. A page of
// either overwritten by a copy of another page of its b-tree reads soundly but lists other
// rows; a table walk whose rowids step back is a table page overwritten the same way. Returns
// what is wrong, "" when they agree or the index cannot be checked this way (an expression
// key is left out of the fingerprint; a WITHOUT ROWID table is not checked).
std::string check_index(sqlite3* db, const std::string& schema, const std::string& table, const std::string& index,
                        const std::string& index_sql) {
  const std::string s = sql_name(schema);
  std::vector<std::string> keys;
  {
    sqlite3_stmt* x = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT cid, name, key FROM pragma_index_xinfo(?1, ?2)", -1, &x, nullptr) != SQLITE_OK) {
      sqlite3_finalize(x);
      return {};
    }
    sqlite3_bind_text(x, 1, index.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(x, 2, schema.c_str(), -1, SQLITE_TRANSIENT);
    while (sqlite3_step(x) == SQLITE_ROW)
      if (sqlite3_column_int(x, 2) == 1 && sqlite3_column_int(x, 0) >= 0) keys.push_back(sql_name(text_of(x, 1)));
    sqlite3_finalize(x);
  }
  // A partial index lists the rows its WHERE clause holds for: the text after the definition's
  // last WHERE (a clause that does not prepare leaves the index unchecked).
  bool partial = false;
  {
    sqlite3_stmt* x = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT partial FROM pragma_index_list(?1, ?2) WHERE name = ?3", -1, &x, nullptr) ==
        SQLITE_OK) {
      sqlite3_bind_text(x, 1, table.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(x, 2, schema.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(x, 3, index.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(x) == SQLITE_ROW) partial = sqlite3_column_int(x, 0) != 0;
    }
    sqlite3_finalize(x);
  }
  std::string where;
  if (partial) {
    std::string lower = index_sql;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const size_t w = lower.rfind("where");
    if (w == std::string::npos) return {};
    where = " WHERE " + index_sql.substr(w + 5);
  }
  std::string cols;
  for (const auto& k : keys) cols += k + ", ";
  const auto n = static_cast<int>(keys.size());
  const std::string from = " FROM " + s + "." + sql_name(table);
  const WalkSum in_index = walk_sum(db, "SELECT " + cols + "rowid" + from + " INDEXED BY " + sql_name(index) + where, n,
                                    false);
  if (in_index.rc != SQLITE_DONE && (in_index.rc & 0xff) != SQLITE_CORRUPT && (in_index.rc & 0xff) != SQLITE_IOERR &&
      (in_index.rc & 0xff) != SQLITE_NOTADB && (in_index.rc & 0xff) != SQLITE_INTERRUPT)
    return {};  // not checkable this way (no rowid, a clause that does not prepare)
  const WalkSum in_table = walk_sum(db, "SELECT " + cols + "rowid" + from + " NOT INDEXED" + where, n, where.empty());
  const std::string name = "index `" + index + "` of table `" + table + "`";
  if ((in_index.rc & 0xff) == SQLITE_INTERRUPT || (in_table.rc & 0xff) == SQLITE_INTERRUPT) return "interrupted";
  if (in_index.rc != SQLITE_DONE) return name + " unreadable: " + in_index.what;
  if (in_table.rc != SQLITE_DONE) return "table `" + table + "` unreadable: " + in_table.what;
  if (in_table.back)
    return "table `" + table + "`: rows out of key order (rowid " + std::to_string(in_table.back_at) +
           " steps back: a page overwritten by a copy of another)";
  if (in_index.rows != in_table.rows || in_index.sum != in_table.sum)
    return name + " and the table list different rows (" + std::to_string(in_index.rows) + " and " +
           std::to_string(in_table.rows) + ": a page of one overwritten by a copy of another)";
  return {};
}

}  // namespace

// The indexes `sql` reads (the OpenRead opcodes of its plan, by root page), each checked once
// per runner against its table (check_index()). "" when all agree; "interrupted" when the
// progress handler stopped a walk; otherwise what disagrees.
std::string SqlQueryRunner::check_indexes_read(std::string_view sql) {
  std::vector<std::pair<int, int64_t>> roots;  // (database index, root page)
  {
    sqlite3_stmt* e = nullptr;
    const std::string text = "EXPLAIN " + std::string(sql);
    if (sqlite3_prepare_v2(db_, text.c_str(), static_cast<int>(text.size()), &e, nullptr) != SQLITE_OK) {
      sqlite3_finalize(e);
      return {};
    }
    while (sqlite3_step(e) == SQLITE_ROW) {
      const std::string op = text_of(e, 1);
      if (op == "OpenRead" || op == "ReopenIdx")
        roots.emplace_back(sqlite3_column_int(e, 4), sqlite3_column_int64(e, 3));
    }
    sqlite3_finalize(e);
  }
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  for (const auto& [dbi, root] : roots) {
    const char* schema_name = sqlite3_db_name(db_, dbi);
    if (schema_name == nullptr || dbi == 1) continue;  // temp: the statement's own
    const std::string schema = schema_name;
    sqlite3_stmt* q = nullptr;
    const std::string look = "SELECT name, tbl_name, coalesce(sql, '') FROM " + sql_name(schema) +
                             ".sqlite_schema WHERE type = 'index' AND rootpage = ?1";
    if (sqlite3_prepare_v2(db_, look.c_str(), -1, &q, nullptr) != SQLITE_OK) {
      sqlite3_finalize(q);
      continue;
    }
    sqlite3_bind_int64(q, 1, root);
    std::string index, table, index_sql;
    if (sqlite3_step(q) == SQLITE_ROW) {
      index = text_of(q, 0);
      table = text_of(q, 1);
      index_sql = text_of(q, 2);
    }
    sqlite3_finalize(q);
    if (index.empty()) continue;
    std::string key = schema;
    key += '.';
    key += index;
    auto it = checked_.find(key);
    if (it == checked_.end()) {
      std::string problem = check_index(db_, schema, table, index, index_sql);
      if (problem == "interrupted") return problem;
      it = checked_.emplace(key, std::move(problem)).first;
    }
    if (!it->second.empty()) return it->second;
  }
  return {};
}

std::unique_ptr<SqlQueryRunner> SqlQueryRunner::open(const std::string& path, std::string& error) {
  if (is_trace_set_path(path)) {
    std::vector<std::string> files;
    if (!list_trace_set(path, files, error)) return nullptr;
    std::unique_ptr<SqlQueryRunner> r(new SqlQueryRunner());
    r->path_ = path;
    r->immutable_ = false;
    // Not SQLITE_OPEN_MEMORY: ATTACH inherits the flags, and the files would open empty in memory.
    const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(":memory:", &r->db_, flags, nullptr) != SQLITE_OK) {
      error = path + ": cannot open an in-memory database for the set";
      return nullptr;
    }
    r->set_files_ = static_cast<int>(files.size());
    if (!r->configure(error)) return nullptr;
    if (!attach_trace_set(r->db_, path, files, error)) return nullptr;
    return r;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    error = path + ": " + std::strerror(errno);
    return nullptr;
  }
  if (!S_ISREG(st.st_mode)) {
    error = path + ": not a regular file";
    return nullptr;
  }
  std::unique_ptr<SqlQueryRunner> r(new SqlQueryRunner());
  r->path_ = path;
  // A pending write-ahead log means a writer may still be active: read it through the normal
  // read-only path (SQLite may then create the -shm index). Otherwise the file is finished, and
  // `immutable=1` reads it without locks or side files.
  r->immutable_ = !file_nonempty(path + "-wal");
  std::string uri = "file:" + uri_path(path) + (r->immutable_ ? "?immutable=1" : "?mode=ro");
  const int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(uri.c_str(), &r->db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    error = path + ": cannot open: " + (r->db_ ? sqlite3_errmsg(r->db_) : sqlite3_errstr(rc));
    return nullptr;
  }
  if (!r->configure(error)) return nullptr;
  return r;
}

bool SqlQueryRunner::configure(std::string& error) {
  sqlite3* db = db_;
  sqlite3_extended_result_codes(db, 1);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, nullptr);
  sqlite3_enable_load_extension(db, 0);
  sqlite3_busy_timeout(db, 1000);
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_limit(db, SQLITE_LIMIT_EXPR_DEPTH, 200);
  sqlite3_limit(db, SQLITE_LIMIT_COMPOUND_SELECT, 64 + set_files_);  // a set's views UNION its files
  sqlite3_limit(db, SQLITE_LIMIT_TRIGGER_DEPTH, 1);
  sqlite3_limit(db, SQLITE_LIMIT_WORKER_THREADS, 0);
  sqlite3_limit(db, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200);
  install_printf_guard(db);
  sqlite3_limit(db, SQLITE_LIMIT_VARIABLE_NUMBER, 32);
  // Sorts and temporary b-trees stay in memory (bounded by the memory budget), never in files.
  char* err = nullptr;
  const int rc = sqlite3_exec(db,
                              "PRAGMA temp_store = MEMORY; PRAGMA cache_size = -16384; "
                              "SELECT count(*) FROM sqlite_schema;",
                              nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    error = path_ + ": not a readable SQLite database: " + (err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    return false;
  }
  return true;
}

SqlQueryRunner::~SqlQueryRunner() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

SqlResult SqlQueryRunner::run(std::string_view sql, const SqlLimits& limits, const std::atomic<bool>* cancel,
                              const std::vector<nlohmann::json>& params) {
  std::lock_guard<std::mutex> lock(mu_);
  SqlResult out;
  const auto start = Clock::now();
  auto finish = [&](SqlResult& r) -> SqlResult {
    r.elapsed_us = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
    return std::move(r);
  };
  if (sql.size() > limits.max_sql_bytes) {
    out.error_kind = "too_big";
    out.error = "the SQL text is " + std::to_string(sql.size()) + " bytes; the limit is " +
                std::to_string(limits.max_sql_bytes);
    return finish(out);
  }
  if (sql.find('\0') != std::string_view::npos) {
    out.error_kind = "syntax";
    out.error = "the SQL text contains a NUL byte";
    return finish(out);
  }

  RunGuard guard;
  guard.deadline = start + std::chrono::milliseconds(limits.max_ms);
  guard.memory_base = sqlite3_memory_used();
  guard.memory_cap = static_cast<int64_t>(limits.max_memory_bytes);
  guard.cancel = cancel;
  sqlite3_limit(db_, SQLITE_LIMIT_LENGTH, limits.max_value_bytes);
  sqlite3_limit(db_, SQLITE_LIMIT_SQL_LENGTH, static_cast<int>(limits.max_sql_bytes) + 1);
  sqlite3_set_authorizer(db_, authorize, &guard);
  sqlite3_progress_handler(db_, 1000, on_progress, &guard);
  struct Reset {
    sqlite3* db;
    ~Reset() {
      sqlite3_set_authorizer(db, nullptr, nullptr);
      sqlite3_progress_handler(db, 0, nullptr, nullptr);
    }
  } reset{db_};

  auto fail = [&](int rc) {
    out.ok = false;
    const char* msg = sqlite3_errmsg(db_);
    out.error_kind = kind_for(rc, guard, msg);
    out.error = message_for(out.error_kind, guard, limits, msg, path_);
    out.columns.clear();
    out.rows.clear();
    out.truncated = false;
    out.truncated_reason.clear();
    return finish(out);
  };

  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), 0, &stmt, &tail);
  if (rc != SQLITE_OK) return fail(rc);
  struct Finalize {
    sqlite3_stmt*& s;
    ~Finalize() { sqlite3_finalize(s); }
  } fin{stmt};
  if (stmt == nullptr) {
    out.error_kind = "syntax";
    out.error = "the SQL text holds no statement";
    return finish(out);
  }
  // A second statement after the first is refused, whatever it is: one call, one statement.
  if (tail != nullptr && tail < sql.data() + sql.size()) {
    sqlite3_stmt* rest = nullptr;
    const int rc2 = sqlite3_prepare_v3(db_, tail, static_cast<int>(sql.data() + sql.size() - tail), 0, &rest, nullptr);
    const bool more = rc2 != SQLITE_OK || rest != nullptr;
    sqlite3_finalize(rest);
    if (more) {
      out.error_kind = "multiple_statements";
      out.error = "only one SQL statement per call is allowed";
      return finish(out);
    }
  }
  // Defence in depth behind the authorizer and the read-only connection.
  if (!sqlite3_stmt_readonly(stmt)) {
    out.error_kind = "denied";
    out.error = "only read-only statements are allowed";
    return finish(out);
  }
  // An index page overwritten by a copy of another page of its b-tree reads soundly but lists
  // other rows: each index the statement reads is checked against its table first (once per
  // runner), so such damage is an error, never a different answer. The check has a budget of
  // its own (ten times the statement's, at least 30 s); the statement then gets its full one.
  guard.deadline = Clock::now() +
                   std::max(std::chrono::milliseconds(limits.max_ms) * 10, std::chrono::milliseconds(30'000));
  const std::string disagree = check_indexes_read(sql);
  if (disagree == "interrupted") return fail(SQLITE_INTERRUPT);
  if (!disagree.empty()) {
    out.error_kind = "damaged";
    out.error = path_ + ": damaged file: " + disagree + " (`PRAGMA integrity_check` lists the damage)";
    return finish(out);
  }
  guard.deadline = Clock::now() + std::chrono::milliseconds(limits.max_ms);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const int idx = static_cast<int>(i) + 1;
    if (p.is_number_integer()) sqlite3_bind_int64(stmt, idx, p.get<int64_t>());
    else if (p.is_number()) sqlite3_bind_double(stmt, idx, p.get<double>());
    else if (p.is_string()) {
      const auto& s = p.get_ref<const std::string&>();
      sqlite3_bind_text(stmt, idx, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    } else if (p.is_boolean()) sqlite3_bind_int(stmt, idx, p.get<bool>() ? 1 : 0);
    else sqlite3_bind_null(stmt, idx);
  }

  const int ncol = sqlite3_column_count(stmt);
  for (int c = 0; c < ncol; ++c) {
    const char* name = sqlite3_column_name(stmt, c);
    out.columns.emplace_back(name ? name : "");
  }
  while (true) {
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) return fail(rc);
    if (out.rows.size() >= limits.max_rows) {
      out.truncated = true;
      out.truncated_reason = "max_rows";
      break;
    }
    std::vector<SqlValue> row(static_cast<size_t>(ncol));
    size_t row_bytes = 0;
    for (int c = 0; c < ncol; ++c) {
      SqlValue& v = row[static_cast<size_t>(c)];
      switch (sqlite3_column_type(stmt, c)) {
        case SQLITE_INTEGER:
          v.type = SqlValue::Type::kInteger;
          v.integer = sqlite3_column_int64(stmt, c);
          break;
        case SQLITE_FLOAT:
          v.type = SqlValue::Type::kReal;
          v.real = sqlite3_column_double(stmt, c);
          break;
        case SQLITE_TEXT: {
          v.type = SqlValue::Type::kText;
          const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt, c));
          v.bytes.assign(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(stmt, c)));
          break;
        }
        case SQLITE_BLOB: {
          v.type = SqlValue::Type::kBlob;
          const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt, c));
          const auto n = static_cast<size_t>(sqlite3_column_bytes(stmt, c));
          if (p != nullptr) v.bytes.assign(p, n);
          break;
        }
        default: break;
      }
      row_bytes += rendered_size(v) + 1;
    }
    if (out.reply_bytes + row_bytes > limits.max_reply_bytes) {
      out.truncated = true;
      out.truncated_reason = "max_reply_bytes";
      break;
    }
    out.reply_bytes += row_bytes;
    out.rows.push_back(std::move(row));
  }
  out.ok = true;
  return finish(out);
}

nlohmann::json sql_value_to_json(const SqlValue& v, TextWrapper wrap_text) {
  switch (v.type) {
    case SqlValue::Type::kNull: return nullptr;
    case SqlValue::Type::kInteger: return v.integer;
    case SqlValue::Type::kReal: return v.real;
    case SqlValue::Type::kText: return wrap_text ? wrap_text(v.bytes) : v.bytes;
    case SqlValue::Type::kBlob: {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string hex;
      const size_t n = std::min<size_t>(v.bytes.size(), 64);
      for (size_t i = 0; i < n; ++i) {
        const auto b = static_cast<unsigned char>(v.bytes[i]);
        hex += kHex[b >> 4];
        hex += kHex[b & 15];
      }
      return {{"blob_bytes", v.bytes.size()}, {"hex", hex}};
    }
  }
  return nullptr;
}

nlohmann::json sql_result_to_json(const SqlResult& r, TextWrapper wrap_text) {
  if (!r.ok) return {{"error", r.error}, {"error_kind", r.error_kind}};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& v : row) jr.push_back(sql_value_to_json(v, wrap_text));
    rows.push_back(std::move(jr));
  }
  nlohmann::json j = {{"columns", r.columns},
                      {"rows", std::move(rows)},
                      {"row_count", r.rows.size()},
                      {"truncated", r.truncated},
                      {"elapsed_ms", static_cast<double>(r.elapsed_us) / 1000.0}};
  if (r.truncated) j["truncated_reason"] = r.truncated_reason;
  return j;
}

std::string render_sql_table(const SqlResult& r, size_t max_width) {
  if (!r.ok) return "error (" + r.error_kind + "): " + r.error + "\n";
  auto cell = [&](const SqlValue& v) -> std::string {
    std::string s;
    switch (v.type) {
      case SqlValue::Type::kNull: s = "NULL"; break;
      case SqlValue::Type::kInteger: s = std::to_string(v.integer); break;
      case SqlValue::Type::kReal: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6g", v.real);
        s = buf;
        break;
      }
      case SqlValue::Type::kText:
        for (char c : v.bytes) s += (c == '\n' || c == '\t' || c == '\r') ? ' ' : c;
        break;
      case SqlValue::Type::kBlob: s = "<blob " + std::to_string(v.bytes.size()) + " bytes>"; break;
    }
    if (s.size() > max_width && max_width > 3) s = s.substr(0, max_width - 3) + "...";
    return s;
  };
  // Width in code points, so UTF-8 text (µs) lines up.
  auto width = [](const std::string& s) {
    size_t w = 0;
    for (unsigned char c : s) w += (c & 0xC0) != 0x80;
    return w;
  };
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> widths(r.columns.size(), 0);
  for (size_t c = 0; c < r.columns.size(); ++c) widths[c] = width(r.columns[c]);
  for (const auto& row : r.rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < row.size(); ++c) {
      line.push_back(cell(row[c]));
      widths[c] = std::max(widths[c], width(line.back()));
    }
    cells.push_back(std::move(line));
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& line) {
    for (size_t c = 0; c < line.size(); ++c) {
      out += line[c];
      if (c + 1 < line.size()) out += std::string(widths[c] - width(line[c]) + 2, ' ');
    }
    out += '\n';
  };
  emit(r.columns);
  std::vector<std::string> rule;
  rule.reserve(widths.size());
  for (size_t w : widths) rule.emplace_back(w, '-');
  emit(rule);
  for (const auto& line : cells) emit(line);
  out += "(" + std::to_string(r.rows.size()) + (r.rows.size() == 1 ? " row" : " rows");
  if (r.truncated) out += ", truncated at " + r.truncated_reason;
  out += ")\n";
  return out;
}

}  // namespace ingero
