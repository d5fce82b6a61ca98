// Test helpers for tests that write traces into a scratch directory and check them with SQL.
//
// Contract:
// - ScratchDir: a fresh directory under $TMPDIR (or /tmp) named after `prefix`, the pid and the
//   object, removed with its contents on destruction; dir("x.db") is the path of a file in it.
// - query_int(path, sql): the first column of the first row of `sql` on the SQLite file `path`,
//   opened read-only and immutable (never leaves -wal/-shm files, safe on ../shared); -1 when the
//   file cannot be opened, the query fails or returns no row.
// Header-only.
#pragma once

#include <sqlite3.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

namespace ingero::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  std::string operator()(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

inline int64_t query_int(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  int64_t v = -1;
  const std::string uri = "file:" + path + "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return v;
}

}  // namespace ingero::test
