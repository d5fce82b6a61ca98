// Internal helpers shared by the SQLite trace reader and writer (not a public API).
//
// Contract:
// - Db / Stmt are RAII owners of sqlite3 handles; nothing here throws (allocation failure aside).
// - probe_sqlite_file() looks at a path BEFORE SQLite does, so a user who passes a text file, a
//   directory, a truncated copy or a zero-filled file gets one clear line instead of SQLite's
//   "file is not a database" (or, worse, a database that silently loses half its rows).
// - open_readonly() never writes next to the file when it can avoid it: a database without a
//   -wal/-journal file is opened `immutable=1` (no -shm is created, read-only media work);
//   one with a WAL is opened read-only the normal way so committed WAL frames are seen.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ingero::sqlite_detail {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;

// A prepared statement. `ok()` is false when preparation failed; `error()` then says why.
class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(Stmt&& o) noexcept : stmt_(o.stmt_), error_(std::move(o.error_)) { o.stmt_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  bool ok() const { return stmt_ != nullptr; }
  const std::string& error() const { return error_; }
  sqlite3_stmt* get() const { return stmt_; }

  int step() { return sqlite3_step(stmt_); }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  // Binds are 1-based, as in SQLite.
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind_u64(int i, uint64_t v) { sqlite3_bind_int64(stmt_, i, static_cast<int64_t>(v)); }
  void bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void bind(int i, std::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void bind_null(int i) { sqlite3_bind_null(stmt_, i); }

  // Columns are 0-based, as in SQLite.
  bool is_null(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  int type(int c) const { return sqlite3_column_type(stmt_, c); }
  int64_t i64(int c) const { return sqlite3_column_int64(stmt_, c); }
  double f64(int c) const { return sqlite3_column_double(stmt_, c); }
  std::string text(int c) const;

 private:
  sqlite3_stmt* stmt_ = nullptr;
  std::string error_;
};

// Runs SQL that returns no rows; on failure fills `error` with SQLite's message.
bool exec(sqlite3* db, const char* sql, std::string& error);

struct ProbeResult {
  std::string problem;       // empty: looks like a SQLite database
  bool has_wal = false;      // a <path>-wal exists (a writer is open, or was killed)
  bool has_journal = false;  // a <path>-journal exists (possibly hot)
};

// Checks existence, kind, the 16-byte magic, the page size and the page count in the header.
// `problem` is a message without the path ("not a SQLite database (file is 12 bytes of text)").
ProbeResult probe_sqlite_file(const std::string& path);

// Opens an existing database read-only (see the contract above). On failure returns null and sets
// `error` to a message without the path.
Db open_readonly(const std::string& path, const ProbeResult& probe, std::string& error);

// `msg` made printable ASCII on one line, at most ~160 characters.
std::string one_line(std::string_view msg);

// Turns SQLite's result code + message into a short phrase for users (one line).
std::string describe_sqlite_error(sqlite3* db, int rc);

bool table_exists(sqlite3* db, std::string_view table);
// Column names of `table` in declaration order; empty when the table does not exist.
std::vector<std::string> table_columns(sqlite3* db, std::string_view table);

// Pages of database `schema` that no table or index reaches and the free list does not hold:
// every page of a sound file is one of a b-tree's (overflow pages included), the free list's,
// a pointer-map page (auto_vacuum) or the lock-byte page. A b-tree page overwritten by a copy of
// another page (a root by one of its own leaves) cuts the pages below it off its tree: they are
// still in the file, reached by nothing. Walks every page (SQLite's dbstat table: 0.3 CPU-s of a
// 380 MB trace), so callers ask only when something else already looks wrong. -1 when it cannot
// tell (no dbstat in this SQLite, or a page no walk can read: damage of another kind).
int64_t unreached_pages(sqlite3* db, std::string_view schema = "main");

}  // namespace ingero::sqlite_detail
