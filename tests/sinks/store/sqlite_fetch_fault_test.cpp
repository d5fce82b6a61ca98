// An exception inside a fetch thread of the SQLite replay (std::bad_alloc, ...) must not abort
// the process, nor lose, duplicate or reorder a row: the reader stops the fetch threads and
// continues with one walk of the timestamp index from where the fetched rows end. Faults are
// injected through SqliteReadOptions::fetch_fault_hook (test-only), at every place a fetch thread
// calls it: before planning a chunk ("plan") and before taking a block of rows ("block"), early,
// mid-stream and late, with chunks down to a handful of rows. The reference is the
// load-and-sort path (stream = false). A failure of that single walk as well ("resume") ends the
// replay cleanly with a prefix of the rows and a health line saying the rest is lost.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>

#include "model/ops.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::TempDir;

// Throws std::bad_alloc at the `at`-th call with where == `where` (counted across threads), and
// at every "resume" call when `resume_too`.
struct Fault {
  std::string where;
  int at = 0;
  bool resume_too = false;
  std::atomic<int> calls{0}, thrown{0};
};

struct Replayed {
  test::Drained d;
  TraceMeta meta;
};

Replayed replay(const std::string& path, bool stream, size_t batch, bool reader_thread, size_t threads,
                size_t chunk_rows, const std::shared_ptr<Fault>& fault) {
  SqliteReadOptions o;
  o.batch_size = batch;
  o.stream = stream;
  o.reader_thread = reader_thread;
  o.fetch_threads = threads;
  o.fetch_chunk_rows = chunk_rows;
  o.fetch_min_rows = 0;
  if (fault)
    o.fetch_fault_hook = [fault](const char* where) {
      const std::string w = where;
      if (w == "resume" && fault->resume_too) {
        ++fault->thrown;
        throw std::bad_alloc();
      }
      if (w == fault->where && ++fault->calls == fault->at) {
        ++fault->thrown;
        throw std::bad_alloc();
      }
    };
  std::string error;
  auto src = open_sqlite_trace(path, error, o);
  Replayed r;
  if (!src) {
    ADD_FAILURE() << path << ": " << error;
    return r;
  }
  r.d = test::drain(*src);
  r.meta = src->meta();
  return r;
}

void expect_equal(const Replayed& a, const Replayed& b) { test::expect_same_replay(a.d, a.meta, b.d, b.meta, false); }

// Ingero 0.8 rows in time order with ties, 20 % of them inserted out of order, sched_switch
// spans up to 3 ms (they move back from where the index puts them), a timestamp index.
std::string make_trace(const std::string& path, uint32_t seed, int rows) {
  std::mt19937_64 rng(seed);
  std::ostringstream sql;
  sql << "CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL,"
         " tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL);"
         "BEGIN;";
  uint64_t t = 1'700'000'000'000'000'000ull;
  for (int i = 0; i < rows; ++i) {
    t += rng() % 4 == 0 ? 0 : rng() % 5000;
    uint64_t ts = t;
    if (rng() % 5 == 0) ts -= rng() % 200'000;
    const bool sched = rng() % 5 == 0;
    sql << "INSERT INTO events(timestamp,pid,tid,source,op,duration) VALUES(" << ts << ",10," << 100 + rng() % 5 << ","
        << (sched ? 3 : 1) << "," << (sched ? static_cast<int>(op::kSchedSwitch) : 1) << ","
        << (sched ? rng() % 3'000'000 : rng() % 100'000) << ");";
  }
  sql << "COMMIT; CREATE INDEX idx_events_timestamp ON events(timestamp);";
  return test::run_sql(path, sql.str());
}

// NULL, negative, REAL, TEXT and BLOB timestamps among the integers, a run of ties longer than
// any chunk: the single walk that takes over must continue exactly where the index puts them.
std::string make_odd_trace(const std::string& path) {
  std::ostringstream sql;
  sql << "CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp, pid INTEGER, tid INTEGER, source INTEGER,"
         " op INTEGER, duration INTEGER); BEGIN;";
  std::mt19937_64 rng(7);
  const char* odd[] = {"NULL", "-5", "0", "1.5e18", "'1700000000000000000'", "x'00'", "9223372036854775807", "2.5"};
  uint64_t t = 1'700'000'000'000'000'000ull;
  for (int i = 0; i < 2000; ++i) {
    if (rng() % 3) t += rng() % 1000;
    if (i >= 500 && i < 600) t = 1'700'000'000'000'300'000ull;
    const bool sched = rng() % 5 == 0;
    const std::string ts = rng() % 30 == 0 ? odd[rng() % 8] : std::to_string(t);
    sql << "INSERT INTO events(timestamp,pid,tid,source,op,duration) VALUES(" << ts << ",10,100," << (sched ? 3 : 1)
        << "," << (sched ? static_cast<int>(op::kSchedSwitch) : 1) << "," << rng() % 3'000'000 << ");";
  }
  sql << "COMMIT; CREATE INDEX idx_events_timestamp ON events(timestamp);";
  return test::run_sql(path, sql.str());
}

struct Config {
  size_t threads, chunk_rows;
};

void expect_exact_after_faults(const std::string& path) {
  // Fetch threads need a file opened immutable: nothing beside it.
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));
  ASSERT_FALSE(std::filesystem::exists(path + "-journal"));
  const Replayed ref = replay(path, false, 64, false, 0, 0, nullptr);
  ASSERT_GT(ref.d.events.size(), 1000u);
  const Config configs[] = {{2, 5}, {3, 64}, {2, 700}};
  const std::pair<const char*, int> faults[] = {{"plan", 1},  {"plan", 2},  {"plan", 9},   {"plan", 60},  {"block", 1},
                                                {"block", 2}, {"block", 5}, {"block", 40}, {"block", 150}};
  for (const Config& cfg : configs)
    for (const auto& [where, at] : faults)
      for (bool reader_thread : {true, false}) {
        SCOPED_TRACE(path + ": " + std::to_string(cfg.threads) + " threads, chunk " + std::to_string(cfg.chunk_rows) +
                     ", throw at " + where + " call " + std::to_string(at) +
                     (reader_thread ? ", reader thread" : ", inline"));
        auto fault = std::make_shared<Fault>();
        fault->where = where;
        fault->at = at;
        const Replayed r = replay(path, true, 64, reader_thread, cfg.threads, cfg.chunk_rows, fault);
        // The fault must have happened where a fetch thread can reach it (chunks this large
        // have fewer plans than 60: then nothing was thrown and the run is a plain control).
        if (fault->calls.load() >= at) {
          EXPECT_EQ(fault->thrown.load(), 1);
        }
        expect_equal(ref, r);
      }
}

TEST(SqliteFetchFault, AFetchThreadExceptionFallsBackToOneWalkWithTheSameRows) {
  TempDir dir;
  const std::string p = dir.file("gen.db");
  ASSERT_EQ(make_trace(p, 11, 3000), "");
  expect_exact_after_faults(p);
}

TEST(SqliteFetchFault, FallbackKeepsIndexOrderForOddTimestamps) {
  TempDir dir;
  const std::string p = dir.file("odd.db");
  ASSERT_EQ(make_odd_trace(p), "");
  expect_exact_after_faults(p);
}

// Every fetch-thread call throws: the feed fails before it hands out a row; the single walk
// reads everything.
TEST(SqliteFetchFault, FetchThreadsThatAlwaysThrowLeaveTheWholeReadToOneWalk) {
  TempDir dir;
  const std::string p = dir.file("gen.db");
  ASSERT_EQ(make_trace(p, 12, 2000), "");
  const Replayed ref = replay(p, false, 100, false, 0, 0, nullptr);
  for (const char* where : {"plan", "block"}) {
    SCOPED_TRACE(where);
    auto fault = std::make_shared<Fault>();
    fault->where = where;
    fault->at = 1;
    const Replayed r = replay(p, true, 100, true, 2, 16, fault);
    EXPECT_EQ(fault->thrown.load(), 1);
    expect_equal(ref, r);
  }
}

// The single walk that takes over fails too: the replay still ends (no abort, no hang) with a
// final batch, a prefix of the rows in order, and a health line naming the failure.
TEST(SqliteFetchFault, AFailingFallbackEndsTheReplayWithAPrefixAndAReason) {
  TempDir dir;
  const std::string p = dir.file("gen.db");
  ASSERT_EQ(make_trace(p, 13, 3000), "");
  const Replayed ref = replay(p, false, 50, false, 0, 0, nullptr);
  for (bool reader_thread : {true, false}) {
    SCOPED_TRACE(reader_thread ? "reader thread" : "inline");
    auto fault = std::make_shared<Fault>();
    fault->where = "block";
    fault->at = 30;
    fault->resume_too = true;
    const Replayed r = replay(p, true, 50, reader_thread, 2, 40, fault);
    EXPECT_EQ(fault->thrown.load(), 2);
    ASSERT_FALSE(r.d.batches.empty());
    EXPECT_TRUE(r.d.batches.back().final);
    ASSERT_LT(r.d.events.size(), ref.d.events.size());
    EXPECT_GT(r.d.events.size(), 0u);
    for (size_t i = 0; i < r.d.events.size(); ++i)
      ASSERT_TRUE(test::same_event(ref.d.events[i], r.d.events[i])) << "event " << i;
    bool reported = false;
    for (const auto& [why, n] : r.meta.health.reasons)
      if (why.rfind("replay stopped after row ", 0) == 0 && why.find("std::bad_alloc") != std::string::npos &&
          why.find("rows not yet delivered are lost") != std::string::npos)
        reported = true;
    EXPECT_TRUE(reported);
  }
}

}  // namespace
}  // namespace ingero
