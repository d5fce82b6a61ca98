// The hardened read-only SQL runner behind `ingero-pipeline query` and the MCP `run_sql` tool.
//
// Contract:
// - Read-only is enforced by the database engine, never by matching keywords in the SQL text:
//   the file is opened with SQLITE_OPEN_READONLY (and `immutable=1` when no write-ahead log is
//   pending, so not even -shm/-wal side files are created), and an authorizer allows only
//   SELECT, column reads, recursive CTEs, a short list of introspection PRAGMAs and ordinary
//   functions. Every write, ATTACH/DETACH, PRAGMA assignment, transaction, schema change,
//   load_extension and file-touching function (readfile, writefile, edit, ...) is denied.
//   Extension loading is also switched off with sqlite3_db_config, and the schema is untrusted
//   (SQLITE_DBCONFIG_TRUSTED_SCHEMA = 0, DEFENSIVE = 1).
// - Exactly one statement per call; a trailing second statement is an error.
// - Resource caps: value length (sqlite3_limit LENGTH: zeroblob/randomblob/printf cannot build
//   huge values), expression depth, compound selects, and a progress handler that interrupts
//   the statement when it exceeds its time budget, grows SQLite's heap past the memory budget,
//   or when the caller's cancel flag is raised. Rows and rendered reply bytes are capped; the
//   result then carries `truncated` and the reason.
// - Never throws; every failure is a SqlResult with ok = false, a kind and a message.
// - One runner serialises its queries (one connection, a mutex); it is safe to share.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

struct sqlite3;

namespace ingero {

struct SqlLimits {
  size_t max_rows = 10'000;
  uint64_t max_ms = 5'000;                   // wall-clock budget of one statement
  size_t max_reply_bytes = 1u << 20;         // rendered size of all cells
  uint64_t max_memory_bytes = 256ull << 20;  // growth of SQLite's heap during the statement
  int max_value_bytes = 256 * 1024;          // longest string/blob a statement may build
  size_t max_sql_bytes = 100'000;
};

struct SqlValue {
  enum class Type : uint8_t { kNull, kInteger, kReal, kText, kBlob };
  Type type = Type::kNull;
  int64_t integer = 0;
  double real = 0;
  std::string bytes;  // text (as stored) or blob bytes
};

struct SqlResult {
  bool ok = false;
  // On failure: "denied" (authorizer / read-only), "syntax", "timeout", "memory", "cancelled",
  // "too_big" (a value over the length limit), "multiple_statements", "error" (anything else).
  std::string error_kind;
  std::string error;
  std::vector<std::string> columns;
  std::vector<std::vector<SqlValue>> rows;
  bool truncated = false;
  std::string truncated_reason;  // "max_rows" or "max_reply_bytes"
  size_t reply_bytes = 0;
  uint64_t elapsed_us = 0;
};

class SqlQueryRunner {
 public:
  // Opens `path` read-only. Returns null and sets `error` when the file cannot be opened or is
  // not an SQLite database.
  static std::unique_ptr<SqlQueryRunner> open(const std::string& path, std::string& error);
  ~SqlQueryRunner();
  SqlQueryRunner(const SqlQueryRunner&) = delete;
  SqlQueryRunner& operator=(const SqlQueryRunner&) = delete;

  // Runs one read-only statement. `params` are bound positionally (?1, ?2, ...) as JSON scalars
  // (tools use them; agents' SQL has none). `cancel`, when given, is polled by the progress
  // handler.
  SqlResult run(std::string_view sql, const SqlLimits& limits, const std::atomic<bool>* cancel = nullptr,
                const std::vector<nlohmann::json>& params = {});

  const std::string& path() const { return path_; }
  bool immutable() const { return immutable_; }

 private:
  SqlQueryRunner() = default;
  sqlite3* db_ = nullptr;
  bool configure(std::string& error);                    // limits, authorizer guards, pragmas
  std::string check_indexes_read(std::string_view sql);  // "" or what disagrees (sql_query.cpp)
  std::map<std::string, std::string> checked_;           // "schema.index" -> "" or what disagrees
  std::string path_;
  int set_files_ = 0;  // files attached when path_ is a set (sinks/store/rollover.h)
  bool immutable_ = false;
  std::mutex mu_;
};

// A cell as JSON: null, integer, real, text, or for a blob {"blob_bytes": n, "hex": "..."}
// (the first 64 bytes). `wrap_text` is applied to text cells (the MCP server marks trace strings
// as untrusted with it); empty = leave text as it is.
using TextWrapper = std::string (*)(std::string_view);
nlohmann::json sql_value_to_json(const SqlValue& v, TextWrapper wrap_text = nullptr);
// {"columns": [...], "rows": [[...]], "row_count": n, "truncated": b, ["truncated_reason"],
//  "elapsed_ms": x} or {"error": ..., "error_kind": ...}.
nlohmann::json sql_result_to_json(const SqlResult& r, TextWrapper wrap_text = nullptr);
// An aligned text table for terminals (cells longer than `max_width` are cut with "...").
std::string render_sql_table(const SqlResult& r, size_t max_width = 48);

}  // namespace ingero
