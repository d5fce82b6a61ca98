// Streaming SQLite replay equals load-and-sort; hostile trace files stay bounded.
//
// The reference is open_sqlite_trace with SqliteReadOptions::stream = false (load every row,
// stable-sort by ts_ns). Streaming must give the same events, batch boundaries, watermarks,
// finals, first/last timestamps and health, on every shared Ingero trace and on generated
// traces: long off-CPU spans, out-of-order rows, ties, with and without a timestamp index (a
// writer killed before close() leaves none). Hostile files: `events` as a view or a virtual
// table is refused; side tables that are views are ignored; strings are cut with a count.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "model/ops.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::TempDir;

struct Replayed {
  test::Drained d;
  TraceMeta meta;
};

// How the streaming reader fetches rows: one walk on the reading thread, or fetch threads taking
// chunks of `chunk_rows` index entries (forced on whatever the table's size).
struct Fetch {
  size_t threads = 0;
  size_t chunk_rows = 16384;
};

Replayed replay(const std::string& path, bool stream, size_t batch, size_t max_reorder = size_t{1} << 20,
                bool reader_thread = true, Fetch fetch = {}) {
  SqliteReadOptions o;
  o.reader_thread = reader_thread;
  o.batch_size = batch;
  o.stream = stream;
  o.max_reorder_events = max_reorder;
  o.fetch_threads = fetch.threads;
  o.fetch_chunk_rows = fetch.chunk_rows;
  o.fetch_min_rows = 0;
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

// Everything a consumer can observe must match, read inline, on the reader thread, and with
// fetch threads over chunks down to a handful of rows (runs of ties longer than a chunk, chunks
// that split a run, many chunks in flight).
void expect_same(const std::string& path, size_t batch) {
  const Replayed a = replay(path, false, batch);
  const Fetch variants[] = {{0, 16384}, {2, 16384}, {2, 5}, {3, 64}};
  for (bool thread : {true, false})
    for (const Fetch& fetch : variants) {
      SCOPED_TRACE(path + " batch " + std::to_string(batch) + (thread ? " reader thread" : " inline") +
                   " fetch threads " + std::to_string(fetch.threads) + " chunk " + std::to_string(fetch.chunk_rows));
      const Replayed b = replay(path, true, batch, size_t{1} << 20, thread, fetch);
      ASSERT_NO_FATAL_FAILURE(test::expect_same_replay(a.d, a.meta, b.d, b.meta, true));
    }
}

TEST(SqliteStream, EqualsLoadAndSortOnEverySharedTrace) {
  const std::string dir = INGERO_SHARED_DATA;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) GTEST_SKIP() << "INGERO_SHARED_DATA not found: " << dir;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".db") continue;
    for (size_t batch : {size_t{1}, size_t{7}, size_t{4096}}) expect_same(entry.path().string(), batch);
    ++n;
  }
  EXPECT_GT(n, 0);
}

TEST(SqliteStream, EqualsLoadAndSortOnTheRepositorySample) {
  const std::string p = std::string(INGERO_SOURCE_DIR) + "/samples/pytorch-dataloader-starvation.db";
  if (!std::filesystem::is_regular_file(p)) GTEST_SKIP() << "no " << p;
  for (size_t batch : {size_t{3}, size_t{4096}}) expect_same(p, batch);
}

constexpr const char* kIngero08 = R"sql(
  CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL,
    tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL,
    gpu_id INTEGER NOT NULL DEFAULT 0, arg0 INTEGER NOT NULL DEFAULT 0,
    arg1 INTEGER NOT NULL DEFAULT 0, ret_code INTEGER NOT NULL DEFAULT 0,
    stack_hash INTEGER NOT NULL DEFAULT 0);
  CREATE TABLE process_names (pid INTEGER PRIMARY KEY, name TEXT NOT NULL);
)sql";

// A random Ingero 0.8 trace: CUDA calls in time order (with ties), sched_switch rows stored at
// their end with spans up to `max_span` ns, and a share of rows inserted out of time order.
std::string make_trace(const std::string& path, uint32_t seed, int rows, uint64_t max_span, double shuffled,
                       bool index) {
  std::mt19937_64 rng(seed);
  std::ostringstream sql;
  sql << kIngero08 << "BEGIN;";
  uint64_t t = 1'700'000'000'000'000'000ull;
  for (int i = 0; i < rows; ++i) {
    t += rng() % 4 == 0 ? 0 : rng() % 5000;  // ties on purpose
    uint64_t ts = t;
    if (std::uniform_real_distribution<double>(0, 1)(rng) < shuffled) ts -= rng() % 200'000;
    const bool sched = rng() % 5 == 0;
    const uint64_t dur = sched ? rng() % (max_span + 1) : rng() % 100'000;
    const int source = sched ? 3 : 1, op = sched ? op::kSchedSwitch : 1 + static_cast<int>(rng() % 3);
    sql << "INSERT INTO events(timestamp,pid,tid,source,op,duration) VALUES(" << ts << "," << 10 + rng() % 3 << ","
        << 100 + rng() % 5 << "," << source << "," << op << "," << dur << ");";
  }
  sql << "INSERT INTO process_names VALUES (10, 'python3');COMMIT;";
  if (index) sql << "CREATE INDEX idx_events_timestamp ON events(timestamp);";
  return test::run_sql(path, sql.str());
}

TEST(SqliteStream, EqualsLoadAndSortOnGeneratedEdgeCases) {
  TempDir dir;
  int k = 0;
  for (bool index : {true, false})
    for (uint64_t span : {uint64_t{0}, uint64_t{3'000'000}, uint64_t{2'000'000'000}})
      for (double shuffled : {0.0, 0.2}) {
        const std::string p = dir.file("gen" + std::to_string(k) + ".db");
        ASSERT_EQ(make_trace(p, 1000 + k, 3000, span, shuffled, index), "");
        ++k;
        for (size_t batch : {size_t{1}, size_t{64}, size_t{4096}}) expect_same(p, batch);
      }
}

// Without a node column, a TEXT id names its node before the last colon. The nodes are
// numbered in sorted order before any row is read, so the streaming replay (timestamp order) and
// the load-and-sort replay (rowid order) give every event the same node index (found by
// sinks/store/fuzz/sqlite_trace_fuzz: they numbered nodes by first appearance). Ids cut at 4096 bytes
// name the node of what is left.
TEST(SqliteStream, NodesFromTextIdsAreNumberedInSortedOrder) {
  TempDir dir;
  const std::string p = dir.file("textids.db");
  ASSERT_EQ(test::run_sql(p, R"sql(
    CREATE TABLE events (id TEXT PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL,
      tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL);
    CREATE INDEX idx_events_timestamp ON events(timestamp);
    INSERT INTO events VALUES ('zeta:1', 3000, 1, 1, 1, 3, 10);
    INSERT INTO events VALUES ('alpha:1', 2000, 2, 2, 1, 3, 10);
    INSERT INTO events VALUES ('mid:dle:7', 1000, 3, 3, 1, 3, 10);
    INSERT INTO events VALUES ('9', 500, 4, 4, 1, 3, 10);
    INSERT INTO events VALUES (printf('%.*c', 5000, 'l') || ':5', 400, 5, 5, 1, 3, 10);
    INSERT INTO events VALUES (printf('%.*c', 4000, 'k') || ':' || printf('%.*c', 500, 'x') || ':6', 300, 6, 6, 1, 3, 10);
  )sql"),
            "");
  const Replayed loaded = replay(p, false, 4096);
  const Replayed streamed = replay(p, true, 4096);
  ASSERT_NO_FATAL_FAILURE(test::expect_same_replay(loaded.d, loaded.meta, streamed.d, streamed.meta, true));
  const std::vector<std::string> want = {"", "alpha", std::string(4000, 'k'), "mid:dle", "zeta"};
  EXPECT_EQ(streamed.meta.nodes, want);
  ASSERT_EQ(streamed.d.events.size(), 6u);
  for (const Event& e : streamed.d.events) {
    const std::string& node = streamed.meta.nodes.at(e.node);
    switch (e.pid) {
      case 1: EXPECT_EQ(node, "zeta"); break;
      case 2: EXPECT_EQ(node, "alpha"); break;
      case 3:
        EXPECT_EQ(node, "mid:dle");
        EXPECT_EQ(e.id, 7u);
        break;
      case 4:
        EXPECT_EQ(node, "");
        EXPECT_EQ(e.id, 9u);
        break;
      case 5: EXPECT_EQ(node, ""); break;  // cut before its colon: no node
      case 6: EXPECT_EQ(node, std::string(4000, 'k')); break;
      default: ADD_FAILURE() << "pid " << e.pid;
    }
  }
}

// With fetch threads the slack (the longest sched_switch span) is searched in the table's two
// rowid halves at once, on two connections: one span far longer than every other, in the lower
// or the upper half (or at the boundary rows), must still set it, so that no row is late.
TEST(SqliteStream, SlackSearchedInTwoHalvesFindsTheLongestSpanInEither) {
  TempDir dir;
  const int rows = 3001;
  for (const int at : {5, rows / 2, rows / 2 + 1, rows - 5}) {
    const std::string p = dir.file("slack" + std::to_string(at) + ".db");
    std::ostringstream sql;
    sql << kIngero08 << "BEGIN;";
    uint64_t t = 1'700'000'000'000'000'000ull;
    for (int i = 1; i <= rows; ++i) {
      t += 1000;
      const bool sched = i % 4 == 0 || i == at;
      // 40 ms back from its end: past ~40,000 later-starting rows' worth of time, far beyond
      // the other spans (1 us).
      const uint64_t dur = i == at ? 40'000'000 : sched ? 1000 : 500;
      sql << "INSERT INTO events(id,timestamp,pid,tid,source,op,duration) VALUES(" << i << "," << t << ",10,100,"
          << (sched ? 3 : 1) << "," << (sched ? static_cast<int>(op::kSchedSwitch) : 1) << "," << dur << ");";
    }
    sql << "COMMIT; CREATE INDEX idx_events_timestamp ON events(timestamp);"
           "CREATE INDEX idx_events_source_op_stack ON events(source, op, stack_hash);";
    ASSERT_EQ(test::run_sql(p, sql.str()), "");
    SCOPED_TRACE("long span at row " + std::to_string(at));
    const Replayed ref = replay(p, false, 64);
    const Replayed got = replay(p, true, 64, size_t{1} << 20, true, {2, 64});
    ASSERT_NO_FATAL_FAILURE(test::expect_same_replay(ref.d, ref.meta, got.d, got.meta, true));
    for (const auto& [why, n] : got.meta.health.reasons) EXPECT_NE(why.rfind("delivered late", 0), 0u) << why;
  }
}

// Fetch threads cut the timestamp index into ranges; the rows a range query could miss or
// misplace must come out exactly where one walk of the index puts them: NULL timestamps first,
// negative and REAL ones among the integers, TEXT and BLOB ones last, runs of equal timestamps
// longer than a chunk, the largest int64.
TEST(SqliteStream, FetchThreadsKeepIndexOrderForOddTimestamps) {
  TempDir dir;
  const std::string p = dir.file("odd.db");
  std::ostringstream sql;
  sql << "CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp, pid INTEGER, tid INTEGER, source INTEGER,"
         " op INTEGER, duration INTEGER); BEGIN;";
  std::mt19937_64 rng(42);
  const char* odd[] = {"NULL", "-5", "0", "1.5e18", "'1700000000000000000'", "x'00'", "9223372036854775807", "2.5"};
  uint64_t t = 1'700'000'000'000'000'000ull;
  for (int i = 0; i < 4000; ++i) {
    if (rng() % 3) t += rng() % 1000;                             // runs of ties
    if (i >= 1000 && i < 1100) t = 1'700'000'000'000'500'000ull;  // a run longer than any chunk
    const bool sched = rng() % 5 == 0;
    const std::string ts = rng() % 40 == 0 ? odd[rng() % 8] : std::to_string(t);
    sql << "INSERT INTO events(timestamp,pid,tid,source,op,duration) VALUES(" << ts << ",10,100," << (sched ? 3 : 1)
        << "," << (sched ? static_cast<int>(op::kSchedSwitch) : 1) << "," << rng() % 3'000'000 << ");";
  }
  sql << "COMMIT; CREATE INDEX idx_events_timestamp ON events(timestamp);";
  ASSERT_EQ(test::run_sql(p, sql.str()), "");
  // Fetch threads need a file opened immutable: nothing beside it.
  ASSERT_FALSE(std::filesystem::exists(p + "-wal"));
  ASSERT_FALSE(std::filesystem::exists(p + "-journal"));
  for (size_t batch : {size_t{1}, size_t{100}, size_t{4096}}) expect_same(p, batch);
}

TEST(SqliteStream, AKilledWritersTraceWithoutIndexesStreams) {
  TempDir dir;
  const std::string p = dir.file("killed.db");
  {
    std::string error;
    auto sink = SqliteSink::create(p, error);
    ASSERT_NE(sink, nullptr) << error;
    std::vector<Event> ev;
    for (int i = 0; i < 5000; ++i) {
      Event e;
      e.ts_ns = 1'000'000'000ull + static_cast<uint64_t>((i * 7919) % 5000) * 1000;
      e.dur_ns = i % 3 == 0 ? 4'000'000 : 500;
      e.source = i % 3 == 0 ? Source::kHost : Source::kCuda;
      e.op = i % 3 == 0 ? op::kSchedSwitch : 1;
      e.pid = 7;
      e.tid = 8;
      ev.push_back(e);
    }
    ASSERT_TRUE(sink->write_events(ev));
    ASSERT_TRUE(sink->commit());
    // No close(): the deferred indexes are never built, as when the writer is killed.
    ASSERT_EQ(test::query_int(p,
                              "SELECT count(*) FROM sqlite_master WHERE type='index' AND "
                              "tbl_name='events'"),
              0);
    for (size_t batch : {size_t{5}, size_t{4096}}) expect_same(p, batch);
    std::string error2;
    sink->close(error2);
  }
}

// The reader thread's hint (EventSource::upcoming): once it has a batch queued, the hint is that
// batch's events, which the next next() hands over. Polled with a deadline: how far ahead the
// reader is depends on the scheduler, not on the code.
TEST(SqliteStream, ReaderThreadHintsAtTheBatchItHandsOverNext) {
  TempDir dir;
  const std::string p = dir.file("hint.db");
  ASSERT_EQ(make_trace(p, 77, 3000, 3'000'000, 0.0, true), "");
  SqliteReadOptions o;
  o.batch_size = 100;
  std::string error;
  auto src = open_sqlite_trace(p, error, o);
  ASSERT_NE(src, nullptr) << error;
  Batch b;
  ASSERT_TRUE(src->next(b));  // starts the reader thread
  int compared = 0;
  while (!b.final) {
    PrefetchHint h = src->upcoming();
    for (int waited = 0; !h.bytes && waited < 2000; waited += 5) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      h = src->upcoming();
    }
    ASSERT_GT(h.bytes, 0u) << "no batch queued after 2 s";
    std::vector<char> hinted(static_cast<const char*>(h.data), static_cast<const char*>(h.data) + h.bytes);
    ASSERT_TRUE(src->next(b));
    ASSERT_EQ(hinted.size(), b.view().size() * sizeof(Event));
    EXPECT_EQ(std::memcmp(hinted.data(), b.view().data(), hinted.size()), 0) << "batch " << compared;
    ++compared;
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(src->upcoming().bytes, 0u) << "a hint after the final batch";
}

TEST(SqliteStream, TooSmallReorderBufferFlagsSpansLateAndCountsThem) {
  TempDir dir;
  const std::string p = dir.file("late.db");
  ASSERT_EQ(make_trace(p, 7, 2000, 50'000'000, 0.0, true), "");
  const Replayed r = replay(p, true, 64, /*max_reorder=*/8);
  uint64_t late = 0;
  for (const auto& b : r.d.batches) {
    bool in_front = true;
    uint64_t prev = 0;
    for (const auto& e : b.events) {
      const bool is_late = e.flags & event_flags::kLate;
      if (is_late) {
        ++late;
        EXPECT_TRUE(in_front) << "late events come first in their batch";
        EXPECT_EQ(e.source, Source::kHost);
      } else {
        in_front = false;
      }
      EXPECT_GE(e.ts_ns, prev) << "batch stays sorted";
      prev = e.ts_ns;
    }
  }
  EXPECT_GT(late, 0u);
  uint64_t counted = 0;
  for (const auto& [why, n] : r.meta.health.reasons)
    if (why.rfind("delivered late", 0) == 0) counted += n;
  EXPECT_EQ(counted, late);
  // Nothing is lost: late or skipped, every row is accounted for.
  const Replayed ref = replay(p, false, 64);
  EXPECT_EQ(r.d.events.size() + r.meta.health.rows_skipped - counted,
            ref.d.events.size() + ref.meta.health.rows_skipped);
}

// ------------------------------------------------------------------ hostile files

TEST(SqliteHostile, EventsAsAnEndlessRecursiveViewIsRefused) {
  TempDir dir;
  const std::string p = dir.file("view.db");
  ASSERT_EQ(test::run_sql(p, R"sql(
    CREATE VIEW events AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
      SELECT i AS id, i AS timestamp, 1 AS pid, 1 AS tid, 1 AS source, 1 AS op, 1 AS duration
      FROM n;
  )sql"),
            "");
  for (bool stream : {true, false}) {
    SqliteReadOptions o;
    o.stream = stream;
    std::string error;
    auto src = open_sqlite_trace(p, error, o);
    EXPECT_EQ(src, nullptr);
    EXPECT_NE(error.find(p + ": `events` is a view, not a table: refused"), std::string::npos) << error;
  }
}

TEST(SqliteHostile, EventsAsAVirtualTableIsRefused) {
  TempDir dir;
  const std::string p = dir.file("vtab.db");
  const std::string made = test::run_sql(p, "CREATE VIRTUAL TABLE events USING rtree(id, timestamp, pid);");
  if (!made.empty()) GTEST_SKIP() << "this SQLite has no rtree module: " << made;
  std::string error;
  auto src = open_sqlite_trace(p, error);
  EXPECT_EQ(src, nullptr);
  EXPECT_NE(error.find("`events` is a virtual table, not a table: refused"), std::string::npos) << error;
}

TEST(SqliteHostile, SideTableViewsAreIgnoredWithAWarning) {
  TempDir dir;
  const std::string p = dir.file("sideview.db");
  ASSERT_EQ(make_trace(p, 3, 50, 1000, 0, true), "");
  ASSERT_EQ(test::run_sql(p,
                          "DROP TABLE process_names; CREATE VIEW process_names AS "
                          "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                          "SELECT i AS pid, 'x' AS name FROM n;"),
            "");
  const Replayed r = replay(p, true, 4096);
  EXPECT_TRUE(r.meta.process_names.empty());
  EXPECT_EQ(r.meta.health.reasons.count("process_names is a view, not a table: ignored"), 1u);
  EXPECT_EQ(r.d.events.size(), 50u);
}

TEST(SqliteHostile, OversizedStringsAreCutAndCounted) {
  TempDir dir;
  const std::string p = dir.file("long.db");
  ASSERT_EQ(make_trace(p, 4, 20, 1000, 0, true), "");
  ASSERT_EQ(test::run_sql(p, R"sql(
    INSERT INTO process_names VALUES (11, printf('%.*c', 100000, 'a'));
    CREATE TABLE stack_traces (hash INTEGER PRIMARY KEY, ips TEXT NOT NULL, frames TEXT NOT NULL);
    INSERT INTO stack_traces VALUES (5, '[' || printf('%.*c', 1000000, '1') || ']', '[]');
    INSERT INTO stack_traces VALUES (6, '["0x1"]', '[]');
  )sql"),
            "");
  for (bool stream : {true, false}) {
    SqliteReadOptions o;
    o.stream = stream;
    std::string error;
    auto src = open_sqlite_trace(p, error, o);
    ASSERT_NE(src, nullptr) << error;
    test::drain(*src);
    const auto& m = src->meta();
    EXPECT_EQ(m.process_names.at(10), "python3");
    EXPECT_EQ(m.process_names.at(11).size(), kMaxNameBytes);
    EXPECT_EQ(m.health.reasons.at("process_names.name longer than 256 bytes: cut"), 1u);
    EXPECT_TRUE(m.stacks.at(5).ips.empty());
    EXPECT_EQ(m.stacks.at(6).ips, "[\"0x1\"]");
    EXPECT_EQ(m.health.reasons.at("stack_traces.ips longer than 256 KiB: dropped"), 1u);
  }
}

TEST(SqliteHostile, ValuesOverTheLoadLimitAreNeverLoaded) {
  TempDir dir;
  const std::string p = dir.file("huge.db");
  ASSERT_EQ(make_trace(p, 5, 20, 1000, 0, true), "");
  // 20 MB > kSqliteMaxValueBytes: SQLite refuses to load it instead of allocating it.
  ASSERT_EQ(test::run_sql(p,
                          "INSERT INTO process_names VALUES (12, zeroblob(20000000));"
                          "UPDATE process_names SET name = CAST(name AS TEXT) WHERE pid = 12;"),
            "");
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  EXPECT_EQ(d.events.size(), 20u);
  bool reported = false;
  for (const auto& [why, n] : src->meta().health.reasons)
    if (why.rfind("process_names unreadable", 0) == 0) reported = true;
  EXPECT_TRUE(reported);
  for (const auto& [pid, name] : src->meta().process_names) EXPECT_LE(name.size(), kMaxNameBytes);
}

TEST(SqliteHostile, OversizedNodeNamesAreCut) {
  TempDir dir;
  const std::string p = dir.file("node.db");
  ASSERT_EQ(make_trace(p, 6, 10, 1000, 0, true), "");
  ASSERT_EQ(test::run_sql(p,
                          "ALTER TABLE events ADD COLUMN node TEXT NOT NULL DEFAULT '';"
                          "UPDATE events SET node = printf('%.*c', 5000, 'n') WHERE id = 1;"),
            "");
  for (bool stream : {true, false}) {
    SqliteReadOptions o;
    o.stream = stream;
    std::string error;
    auto src = open_sqlite_trace(p, error, o);
    ASSERT_NE(src, nullptr) << error;
    test::drain(*src);
    for (const auto& n : src->meta().nodes) EXPECT_LE(n.size(), kMaxNameBytes);
  }
}

}  // namespace
}  // namespace ingero
