#include "sinks/store/sqlite_util.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace ingero::sqlite_detail {

Stmt::Stmt(sqlite3* db, std::string_view sql) {
  if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr) != SQLITE_OK) {
    error_ = one_line(sqlite3_errmsg(db));
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
  }
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(stmt_);
    stmt_ = o.stmt_;
    error_ = std::move(o.error_);
    o.stmt_ = nullptr;
  }
  return *this;
}

std::string Stmt::text(int c) const {
  const auto* p = sqlite3_column_text(stmt_, c);
  if (!p) return {};
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, c)));
}

bool exec(sqlite3* db, const char* sql, std::string& error) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
    error = one_line(msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return false;
  }
  return true;
}

namespace {

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool file_nonempty(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// What a non-SQLite file looks like, for the error message: users pass JSON exports, CSVs and
// half-copied files by mistake, and "file is not a database" does not tell them which.
std::string describe_content(const unsigned char* buf, size_t n, uint64_t size) {
  bool zeros = true, text = true;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = buf[i];
    if (c != 0 && i < 100) zeros = false;  // 100 bytes: the size of a SQLite header
    if (c == 0 || (c < 0x20 && c != '\n' && c != '\r' && c != '\t')) text = false;
  }
  const std::string bytes = std::to_string(size) + (size == 1 ? " byte" : " bytes");
  if (zeros) return "not a SQLite database (the header is zero-filled; file is " + bytes + ")";
  if (text) {
    std::string snippet;
    for (size_t i = 0; i < n && snippet.size() < 24; ++i) {
      const char c = static_cast<char>(buf[i]);
      if (c == '\n' || c == '\r' || c == '\t') break;
      snippet += (static_cast<unsigned char>(c) < 0x80) ? c : '?';
    }
    return "not a SQLite database (file is " + bytes + " of text, starting \"" + snippet + "\")";
  }
  return "not a SQLite database (file is " + bytes + " of binary data without the SQLite header)";
}

std::string uri_escape(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (c == '%' || c == '?' || c == '#' || c < 0x20 || c >= 0x7f) {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

ProbeResult probe_sqlite_file(const std::string& path) {
  ProbeResult r;
  if (path.empty()) {
    r.problem = "empty path: no trace file given";
    return r;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    r.problem = errno == ENOENT ? "no such file" : std::string("cannot access: ") + std::strerror(errno);
    return r;
  }
  if (S_ISDIR(st.st_mode)) {
    r.problem = "is a directory, not a SQLite trace file";
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.problem = "not a regular file (a SQLite trace must be a plain file)";
    return r;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    r.problem = "empty file (0 bytes), not a SQLite database";
    return r;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    r.problem = std::string("cannot read: ") + std::strerror(errno);
    return r;
  }
  unsigned char buf[512] = {};
  in.read(reinterpret_cast<char*>(buf), sizeof buf);
  const auto n = static_cast<size_t>(in.gcount());
  static constexpr char kMagic[] = "SQLite format 3";  // 15 chars + the NUL = the 16-byte magic
  if (n < 16 || std::memcmp(buf, kMagic, 16) != 0) {
    r.problem = describe_content(buf, n, size);
    return r;
  }
  if (n < 100) {
    r.problem = "truncated (" + std::to_string(size) + " bytes, shorter than the 100-byte SQLite header)";
    return r;
  }
  uint32_t page_size = (uint32_t{buf[16]} << 8) | buf[17];
  if (page_size == 1) page_size = 65536;
  if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)) != 0) {
    r.problem = "corrupt SQLite header (page size " + std::to_string(page_size) +
                " is not a power of two between 512 and 65536)";
    return r;
  }
  r.has_wal = file_exists(path + "-wal");
  const bool wal_has_frames = file_nonempty(path + "-wal");
  r.has_journal = file_exists(path + "-journal");
  // The in-header page count is valid only when the "version-valid-for" number equals the change
  // counter (SQLite file format, offsets 24 and 92). With a WAL present the main file may
  // legitimately lag behind, so a short file is only called truncated without one.
  const uint32_t pages = be32(buf + 28);
  if (pages != 0 && be32(buf + 24) == be32(buf + 92) && !wal_has_frames) {
    const uint64_t expected = uint64_t{pages} * page_size;
    if (size < expected) {
      r.problem = "truncated (the header says " + std::to_string(pages) + " pages of " + std::to_string(page_size) +
                  " bytes = " + std::to_string(expected) + " bytes, the file has " + std::to_string(size) + ")";
      return r;
    }
  }
  return r;
}

std::string one_line(std::string_view msg) {
  // SQLite quotes schema text in some messages; a damaged file puts arbitrary bytes there.
  constexpr size_t kMax = 160;
  std::string out;
  for (unsigned char c : msg) {
    if (out.size() >= kMax) {
      out += "...";
      break;
    }
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : (c == '\n' || c == '\t') ? ' ' : '?';
  }
  return out;
}

std::string describe_sqlite_error(sqlite3* db, int rc) {
  const int primary = rc & 0xff;
  std::string msg = one_line(db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (primary) {
    case SQLITE_CORRUPT: return "corrupt database (" + msg + ")";
    case SQLITE_NOTADB: return "not a SQLite database (" + msg + ")";
    case SQLITE_IOERR: return "I/O error while reading (" + msg + ")";
    case SQLITE_CANTOPEN: return "cannot open (" + msg + ")";
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return "database is locked by another process (" + msg + ")";
    default: return msg;
  }
}

Db open_readonly(const std::string& path, const ProbeResult& probe, std::string& error) {
  const bool immutable = !probe.has_wal && !probe.has_journal;
  const std::string uri = "file:" + uri_escape(path) + (immutable ? "?mode=ro&immutable=1" : "?mode=ro");
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(uri.c_str(), &raw,
                                 // NOMUTEX: each connection is used by one thread at a time; the
                                 // per-call mutex of a serialized connection cost 16 % of a replay.
                                 SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) {
    error = describe_sqlite_error(raw, rc);
    return nullptr;
  }
  sqlite3_extended_result_codes(raw, 1);
  // A writer may hold the database briefly between transactions (live capture + replay).
  sqlite3_busy_timeout(raw, 2000);
  // Touch the schema now, so "not a database" and a corrupt first page fail at open.
  Stmt probe_stmt(raw, "SELECT count(*) FROM sqlite_master");
  if (!probe_stmt.ok()) {
    error = describe_sqlite_error(raw, sqlite3_errcode(raw));
    return nullptr;
  }
  const int step = probe_stmt.step();
  if (step != SQLITE_ROW) {
    error = describe_sqlite_error(raw, step);
    return nullptr;
  }
  return db;
}

bool table_exists(sqlite3* db, std::string_view table) {
  Stmt s(db, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?1");
  if (!s.ok()) return false;
  s.bind(1, table);
  return s.step() == SQLITE_ROW;
}

std::vector<std::string> table_columns(sqlite3* db, std::string_view table) {
  std::vector<std::string> cols;
  Stmt s(db, "SELECT name FROM pragma_table_info(?1)");
  if (!s.ok()) return cols;
  s.bind(1, table);
  while (s.step() == SQLITE_ROW) cols.push_back(s.text(0));
  return cols;
}

int64_t unreached_pages(sqlite3* db, std::string_view schema) {
  const std::string q = "\"" + std::string(schema) + "\"";
  const auto one = [db](const std::string& sql) -> int64_t {
    Stmt s(db, sql);
    if (!s.ok() || s.step() != SQLITE_ROW || s.type(0) != SQLITE_INTEGER) return -1;
    return s.i64(0);
  };
  if (schema.find('"') != std::string_view::npos) return -1;
  const int64_t pages = one("PRAGMA " + q + ".page_count");
  const int64_t page_size = one("PRAGMA " + q + ".page_size");
  const int64_t free_pages = one("PRAGMA " + q + ".freelist_count");
  const int64_t vacuum = one("PRAGMA " + q + ".auto_vacuum");
  if (pages < 0 || page_size <= 0 || free_pages < 0 || vacuum < 0) return -1;
  if (schema.find('\'') != std::string_view::npos) return -1;
  const int64_t reached = one("SELECT count(*) FROM dbstat('" + std::string(schema) + "')");
  if (reached < 0) return -1;
  int64_t other = 0;
  // The lock-byte page (the one holding file offset 1 GiB) belongs to nothing.
  const int64_t lock_page = (int64_t{1} << 30) / page_size + 1;
  if (pages >= lock_page) ++other;
  if (vacuum != 0 && pages >= 2) {
    // Pointer-map pages: page 2, then one every usable/5 + 1 pages (SQLite's file format).
    int reserved = -1;  // negative: only read the file's reserved bytes per page, set nothing
    if (sqlite3_file_control(db, std::string(schema).c_str(), SQLITE_FCNTL_RESERVE_BYTES, &reserved) != SQLITE_OK ||
        reserved < 0 || reserved > 255)
      reserved = 0;
    const int64_t per_map = (page_size - reserved) / 5 + 1;
    other += (pages - 2) / per_map + 1;
  }
  return std::max<int64_t>(0, pages - free_pages - reached - other);
}

}  // namespace ingero::sqlite_detail
