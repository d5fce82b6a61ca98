#include "tests/sinks/store/sqlite_test_util.h"

#include <gtest/gtest.h>

#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ingero::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ip-sqlite-test-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string shared_sample(const std::string& name) {
  const std::string p = std::string(INGERO_SHARED_DATA) + "/" + name;
  return std::filesystem::is_regular_file(p) ? p : std::string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string e = sqlite3_errmsg(db);
    sqlite3_close(db);
    return e;
  }
  char* msg = nullptr;
  std::string err;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) err = msg ? msg : "error";
  sqlite3_free(msg);
  sqlite3_close(db);
  return err;
}

namespace {
template <typename F>
void query_first(const std::string& path, const std::string& sql, F&& f) {
  // Without a WAL the file is complete: open it immutable so nothing (-shm) is created beside
  // the shared, read-only samples.
  const bool wal = std::filesystem::exists(path + "-wal");
  const std::string uri = "file:" + path + (wal ? "?mode=ro" : "?mode=ro&immutable=1");
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) f(st);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
}
}  // namespace

int64_t query_int(const std::string& path, const std::string& sql) {
  int64_t v = -1;
  query_first(path, sql, [&](sqlite3_stmt* st) { v = sqlite3_column_int64(st, 0); });
  return v;
}

std::string query_text(const std::string& path, const std::string& sql) {
  std::string v;
  query_first(path, sql, [&](sqlite3_stmt* st) {
    if (const auto* p = sqlite3_column_text(st, 0)) v = reinterpret_cast<const char*>(p);
  });
  return v;
}

Drained drain(EventSource& source) {
  Drained d;
  Batch b;
  // A source that never ends would hang the test; no trace here has a million batches.
  for (int guard = 0; guard < 1'000'000 && source.next(b); ++guard) {
    d.events.insert(d.events.end(), b.events.begin(), b.events.end());
    d.batches.push_back(b);
    if (b.final) break;
  }
  return d;
}

bool same_event(const Event& a, const Event& b) { return std::memcmp(&a, &b, sizeof(Event)) == 0; }

std::string describe(const Event& e) {
  std::ostringstream s;
  s << "{ts=" << e.ts_ns << " dur=" << e.dur_ns << " id=" << e.id << " arg0=" << e.arg0 << " arg1=" << e.arg1
    << " stack=" << e.stack_id << " cg=" << e.cgroup_id << " pid=" << e.pid << " tid=" << e.tid << " ret=" << e.ret
    << " node=" << e.node << " rank=" << e.rank << " src=" << int(e.source) << " op=" << int(e.op)
    << " state=" << int(e.prev_state) << " gpu=" << int(e.gpu_id) << " flags=" << int(e.flags) << "}";
  return s.str();
}

void expect_same_replay(const Drained& a, const TraceMeta& ma, const Drained& b, const TraceMeta& mb, bool everything) {
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i)
    ASSERT_TRUE(same_event(a.events[i], b.events[i]))
        << "event " << i << ": " << describe(a.events[i]) << " vs " << describe(b.events[i]);
  ASSERT_EQ(a.batches.size(), b.batches.size());
  for (size_t i = 0; i < a.batches.size(); ++i) {
    EXPECT_EQ(a.batches[i].events.size(), b.batches[i].events.size()) << "batch " << i;
    EXPECT_EQ(a.batches[i].watermark, b.batches[i].watermark) << "batch " << i;
    EXPECT_EQ(a.batches[i].final, b.batches[i].final) << "batch " << i;
    if (everything) {
      EXPECT_EQ(a.batches[i].seq, b.batches[i].seq) << "batch " << i;
    }
  }
  EXPECT_EQ(ma.first_ts, mb.first_ts);
  EXPECT_EQ(ma.last_ts, mb.last_ts);
  EXPECT_EQ(ma.health.rows_read, mb.health.rows_read);
  EXPECT_EQ(ma.health.rows_skipped, mb.health.rows_skipped);
  EXPECT_EQ(ma.health.reasons, mb.health.reasons);
  if (!everything) return;
  EXPECT_EQ(ma.health.dropped_events, mb.health.dropped_events);
  EXPECT_EQ(ma.format, mb.format);
  EXPECT_EQ(ma.nodes, mb.nodes);
  EXPECT_EQ(ma.process_names, mb.process_names);
  EXPECT_EQ(ma.stacks.size(), mb.stacks.size());
}

}  // namespace ingero::test
