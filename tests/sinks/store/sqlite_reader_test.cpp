// Replay of Ingero SQLite traces: bad inputs, odd rows, exact facts of the shared samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>

#include "model/ops.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::TempDir;

#define REQUIRE_SAMPLE(var, name)                    \
  const std::string var = test::shared_sample(name); \
  if (var.empty())                                   \
  GTEST_SKIP() << "Ingero sample " << name << " not found under INGERO_SHARED_DATA (" << INGERO_SHARED_DATA << ")"

// Opens `path` expecting failure; returns the error.
std::string open_error(const std::string& path) {
  std::string error;
  auto src = open_sqlite_trace(path, error);
  EXPECT_EQ(src, nullptr) << "expected " << path << " to be rejected";
  EXPECT_EQ(error.find('\n'), std::string::npos) << "error must be one line: " << error;
  return error;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// ---------------------------------------------------------------- bad inputs

TEST(SqliteReaderBadInput, EmptyPath) {
  const std::string e = open_error("");
  EXPECT_NE(e.find("empty path"), std::string::npos) << e;
}

TEST(SqliteReaderBadInput, MissingPath) {
  TempDir dir;
  const std::string p = dir.file("nope.db");
  EXPECT_EQ(open_error(p), p + ": no such file");
}

TEST(SqliteReaderBadInput, Directory) {
  TempDir dir;
  EXPECT_EQ(open_error(dir.path()),
            dir.path() +
                ": is a directory with no trace files in it; a directory of rolled *.db files reads as one trace");
}

TEST(SqliteReaderBadInput, TextFile) {
  TempDir dir;
  const std::string p = dir.file("trace.db");
  test::write_file(p, "hello world\n");
  EXPECT_EQ(open_error(p), p + ": not a SQLite database (file is 12 bytes of text, starting \"hello world\")");
}

TEST(SqliteReaderBadInput, IsSqliteFileLooksAtContent) {
  TempDir dir;
  const std::string text = dir.file("a.db"), db = dir.file("b.txt");
  test::write_file(text, "SQLite format 2 but not really");
  ASSERT_EQ(test::run_sql(db, "CREATE TABLE t(x)"), "");
  EXPECT_FALSE(is_sqlite_file(text));
  EXPECT_TRUE(is_sqlite_file(db));
  EXPECT_FALSE(is_sqlite_file(dir.path()));
  EXPECT_FALSE(is_sqlite_file(dir.file("missing")));
  EXPECT_FALSE(is_sqlite_file(""));
}

TEST(SqliteReaderBadInput, EmptyFile) {
  TempDir dir;
  const std::string p = dir.file("empty.db");
  test::write_file(p, "");
  EXPECT_EQ(open_error(p), p + ": empty file (0 bytes), not a SQLite database");
}

TEST(SqliteReaderBadInput, BinaryFile) {
  TempDir dir;
  const std::string p = dir.file("blob.db");
  test::write_file(p, std::string("\x7f"
                                  "ELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0",
                                  18));
  const std::string e = open_error(p);
  EXPECT_TRUE(starts_with(e, p + ": not a SQLite database (file is 18 bytes of binary data")) << e;
}

TEST(SqliteReaderBadInput, ZeroFilledHeader) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  TempDir dir;
  std::string bytes = test::read_file(sample);
  std::fill(bytes.begin(), bytes.begin() + 100, '\0');
  const std::string p = dir.file("zeroed.db");
  test::write_file(p, bytes);
  EXPECT_EQ(open_error(p), p + ": not a SQLite database (the header is zero-filled; file is 782336 bytes)");
}

TEST(SqliteReaderBadInput, TruncatedCopy) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  TempDir dir;
  const std::string bytes = test::read_file(sample);
  ASSERT_EQ(bytes.size(), 782336u);
  const std::string p = dir.file("half.db");
  test::write_file(p, bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(open_error(p), p + ": truncated (the header says 191 pages of 4096 bytes = 782336 "
                               "bytes, the file has 391168)");
}

TEST(SqliteReaderBadInput, TruncatedInsideHeader) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  TempDir dir;
  const std::string p = dir.file("tiny.db");
  test::write_file(p, test::read_file(sample).substr(0, 50));
  EXPECT_EQ(open_error(p), p + ": truncated (50 bytes, shorter than the 100-byte SQLite header)");
}

TEST(SqliteReaderBadInput, CorruptSchemaPage) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  TempDir dir;
  std::string bytes = test::read_file(sample);
  // Page 1 after the 100-byte file header holds the schema b-tree: garble it.
  for (size_t i = 100; i < 4096; ++i) bytes[i] = static_cast<char>(0xA5 ^ (i * 7));
  const std::string p = dir.file("garbled.db");
  test::write_file(p, bytes);
  const std::string e = open_error(p);
  EXPECT_TRUE(starts_with(e, p + ": ")) << e;
  EXPECT_TRUE(e.find("corrupt") != std::string::npos || e.find("malformed") != std::string::npos) << e;
}

TEST(SqliteReaderBadInput, NoEventsTable) {
  TempDir dir;
  const std::string p = dir.file("other.db");
  ASSERT_EQ(test::run_sql(p, "CREATE TABLE users(id INTEGER); CREATE TABLE orders(x);"), "");
  EXPECT_EQ(open_error(p), p + ": no `events` table: not an Ingero trace (tables: orders, users)");
}

TEST(SqliteReaderBadInput, NoTablesAtAll) {
  TempDir dir;
  const std::string p = dir.file("blank.db");
  ASSERT_EQ(test::run_sql(p, "PRAGMA user_version = 3;"), "");
  EXPECT_EQ(open_error(p), p + ": no `events` table: not an Ingero trace (the database has no tables)");
}

TEST(SqliteReaderBadInput, EventsMissingColumns) {
  TempDir dir;
  const std::string p = dir.file("cols.db");
  ASSERT_EQ(test::run_sql(p,
                          "CREATE TABLE events(id INTEGER PRIMARY KEY, timestamp INTEGER, "
                          "pid INTEGER, tid INTEGER, source INTEGER, op INTEGER)"),
            "");
  EXPECT_EQ(open_error(p), p + ": table `events` lacks required column duration (a trace needs "
                               "timestamp, pid, tid, source, op, duration)");
  const std::string q = dir.file("cols2.db");
  ASSERT_EQ(test::run_sql(q,
                          "CREATE TABLE events(id INTEGER PRIMARY KEY, timestamp INTEGER, "
                          "pid INTEGER, op INTEGER)"),
            "");
  EXPECT_EQ(open_error(q), q + ": table `events` lacks required columns tid, source, duration (a "
                               "trace needs timestamp, pid, tid, source, op, duration)");
}

// ---------------------------------------------------------------- odd rows

TEST(SqliteReaderOddRows, SkippedAndCountedWithReasons) {
  TempDir dir;
  const std::string p = dir.file("odd.db");
  // Loose column types so the bad values can be stored at all (Ingero's NOT NULL would refuse).
  ASSERT_EQ(test::run_sql(p, R"sql(
    CREATE TABLE events(id INTEGER PRIMARY KEY, timestamp INTEGER, pid INTEGER, tid INTEGER,
                        source INTEGER, op INTEGER, duration INTEGER, gpu_id INTEGER DEFAULT 0,
                        arg0 INTEGER DEFAULT 0, arg1 INTEGER DEFAULT 0, ret_code INTEGER DEFAULT 0,
                        stack_hash INTEGER DEFAULT 0, cgroup_id INTEGER DEFAULT 0);
    INSERT INTO events(id, timestamp, pid, tid, source, op, duration) VALUES
      (1, 1000000000, 10, 11, 1, 3, 500),           -- good cudaLaunchKernel
      (2, 2000000000, 10, 11, 3, 1, 300),           -- good sched_switch (ends at 2 s)
      (3, 1500000000, 10, 12, 4, 1, 700),           -- good cuLaunchKernel
      (4, 1600000000, 10, 11, 1, 42, 10),           -- unknown op
      (5, 1600000001, 10, 11, 1, 42, 10),           -- unknown op again
      (6, 1600000002, 10, 11, 2, 1, 10),            -- source 2 (NVIDIA, reserved) unknown
      (7, 1600000003, 10, 11, 1, 3, -5),            -- negative duration
      (8, 1600000004, 10, 11, 1, 3, 90000000000000),-- 25 h
      (9, 0, 10, 11, 1, 3, 5),                      -- zero timestamp
      (10, -7, 10, 11, 1, 3, 5),                    -- negative timestamp
      (11, 1600000005, NULL, 11, 1, 3, 5),          -- NULL pid
      (12, 'abc', 10, 11, 1, 3, 5),                 -- text timestamp
      (13, 100, 10, 11, 3, 1, 100),                 -- off-CPU span starting at 0
      (14, 1600000006, 10, 11, 1, 3, 5);            -- good
    UPDATE events SET gpu_id = 300 WHERE id = 14;   -- ... made bad: gpu_id out of range
    INSERT INTO events(id, timestamp, pid, tid, source, op, duration, gpu_id)
      VALUES (15, 1700000000, 10, 11, 1, 1, 86400000000000, 1); -- exactly 24 h: kept
  )sql"),
            "");
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);  // a streaming source's health is final at the end
  const auto& h = src->meta().health;
  EXPECT_EQ(h.rows_read, 15u);
  EXPECT_EQ(h.rows_skipped, 11u);
  const std::map<std::string, uint64_t> expected{
      {"unknown op id (source 1 CUDA, op 42)", 2},
      {"unknown op id (source 2, op 1)", 1},
      {"negative duration", 1},
      {"duration over 24 h (corrupt row)", 1},
      {"zero or negative timestamp", 2},
      {"NULL in events.pid (a NOT NULL column)", 1},
      {"non-integer value in events.timestamp", 1},
      {"off-CPU span would start before 1970 (duration >= timestamp)", 1},
      {"gpu_id out of range 0..255", 1},
  };
  EXPECT_EQ(h.reasons, expected);
  ASSERT_EQ(d.events.size(), 4u);
  // Sorted by start: id 1 (1.0 s), 3 (1.5 s), 15 (1.7 s), 2 (2 s - 300 ns).
  EXPECT_EQ(d.events[0].id, 1u);
  EXPECT_EQ(d.events[1].id, 3u);
  EXPECT_EQ(d.events[2].id, 15u);
  EXPECT_EQ(d.events[3].id, 2u);
  EXPECT_EQ(d.events[3].ts_ns, 2000000000u - 300u);
  EXPECT_EQ(d.events[3].dur_ns, 300u);
  EXPECT_EQ(src->meta().format, "ingero-0.8");
}

TEST(SqliteReaderOddRows, CorruptionMidTableKeepsPrefixAndReports) {
  TempDir dir;
  const std::string p = dir.file("mid.db");
  // 20k rows of ~60 bytes in a table without indexes: its leaves are pages 3.. in insertion
  // order, so garbling a page near 60% of the file hits a leaf in the middle of the scan.
  ASSERT_EQ(test::run_sql(p, R"sql(
    PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE;
    CREATE TABLE events(id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL,
                        tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL,
                        duration INTEGER NOT NULL, arg0 INTEGER NOT NULL DEFAULT 0);
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
    INSERT INTO events SELECT i, 1700000000000000000 + i * 1000, 100, 101, 1, 3, 5000,
                              1234567890123 FROM n;
  )sql"),
            "");
  std::string bytes = test::read_file(p);
  const size_t pages = bytes.size() / 4096;
  ASSERT_GT(pages, 100u);
  const size_t bad = pages * 6 / 10;
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(bad * 4096),
            bytes.begin() + static_cast<std::ptrdiff_t>((bad + 1) * 4096), '\xff');
  test::write_file(p, bytes);

  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  EXPECT_GT(d.events.size(), 5000u);
  EXPECT_LT(d.events.size(), 20000u);
  // The read goes past the damaged leaf (issue 43): ids rise, one gap of the leaf's rows, and
  // every id is there but those.
  size_t gaps = 0;
  for (size_t i = 1; i < d.events.size(); ++i) {
    ASSERT_GT(d.events[i].id, d.events[i - 1].id);
    if (d.events[i].id != d.events[i - 1].id + 1) ++gaps;
  }
  EXPECT_EQ(gaps, 1u);
  EXPECT_EQ(d.events.front().id, 1u);
  EXPECT_EQ(d.events.back().id, 20000u);
  const auto& h = src->meta().health;
  // No index lists the lost rows: their count is the rowid gap (consecutive rowids: exact).
  EXPECT_EQ(h.rows_unreadable + d.events.size(), 20000u);
  ASSERT_EQ(h.damage.size(), 1u);
  EXPECT_TRUE(starts_with(h.damage[0], "table `events`: rowids ")) << h.damage[0];
  EXPECT_NE(h.damage[0].find("corrupt database"), std::string::npos) << h.damage[0];
  EXPECT_TRUE(h.reasons.empty());
}

TEST(SqliteReaderOddRows, RandomlyDamagedCopiesNeverCrash) {
  REQUIRE_SAMPLE(sample, "sample-cluster.db");
  const std::string original = test::read_file(sample);
  TempDir dir;
  const std::string p = dir.file("damaged.db");
  int rejected = 0, partial = 0;
  // Deterministic damage (a fixed LCG): bursts of garbage in pages past the header, the kind a
  // bad disk or an interrupted copy leaves. Each copy must open cleanly or fail with one line.
  uint64_t state = 0x2545F4914F6CDD1Dull;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
  for (int round = 0; round < 40; ++round) {
    std::string bytes = original;
    for (int burst = 0; burst < 1 + round % 4; ++burst) {
      const size_t at = 100 + next() % (bytes.size() - 200);
      const size_t len = 1 + next() % 64;
      for (size_t i = at; i < std::min(bytes.size(), at + len); ++i) bytes[i] = static_cast<char>(next() >> 56);
    }
    test::write_file(p, bytes);
    std::string error;
    auto src = open_sqlite_trace(p, error, 128);
    if (!src) {
      ++rejected;
      EXPECT_TRUE(starts_with(error, p + ": ")) << error;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
      continue;
    }
    const auto d = test::drain(*src);
    EXPECT_LE(d.events.size(), 600u);
    EXPECT_TRUE(std::is_sorted(d.events.begin(), d.events.end(),
                               [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; }));
    if (d.events.size() < 600u) ++partial;
  }
  // Not a tautology: some damage must have been noticed one way or the other.
  EXPECT_GT(rejected + partial, 0);
}

// ---------------------------------------------------------------- shared samples

TEST(SqliteReaderSample, PytorchDataloaderFacts) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  std::string error;
  auto src = open_sqlite_trace(sample, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  const TraceMeta& m = src->meta();
  EXPECT_EQ(m.format, "ingero-0.8");
  EXPECT_EQ(m.path, sample);
  ASSERT_EQ(d.events.size(), 3807u);
  EXPECT_EQ(m.health.rows_read, 3807u);
  EXPECT_EQ(m.health.rows_skipped, 0u);
  auto count = [&](Source s, uint8_t op) {
    return std::count_if(d.events.begin(), d.events.end(), [&](const Event& e) { return e.source == s && e.op == op; });
  };
  EXPECT_EQ(count(Source::kHost, op::kSchedSwitch), 3676);
  EXPECT_EQ(count(Source::kCuda, op::kCudaLaunchKernel), 16);
  EXPECT_EQ(count(Source::kDriver, op::kCuLaunchKernel), 41);
  EXPECT_EQ(m.nodes, std::vector<std::string>{""});
  EXPECT_EQ(m.process_names.size(), 13u);
  EXPECT_EQ(m.process_names.at(2233), "python3");
  EXPECT_EQ(m.stacks.size(), 21u);
  ASSERT_EQ(m.sessions.size(), 1u);
  EXPECT_EQ(m.sessions[0].gpu_model, "NVIDIA GeForce RTX 4090, 24564 MiB");
  EXPECT_EQ(m.sessions[0].cpu_cores, 4u);
  EXPECT_EQ(m.sessions[0].mem_total_mb, 15989u);
  EXPECT_EQ(m.sessions[0].started_at, 1774015560702813548u);
  EXPECT_EQ(m.snapshots.size(), 40u);
  EXPECT_TRUE(std::is_sorted(m.snapshots.begin(), m.snapshots.end(),
                             [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; }));
  for (const auto& e : d.events) {
    ASSERT_EQ(e.rank, -1);
    ASSERT_EQ(e.node, 0);
    ASSERT_EQ(e.prev_state, OffCpuState::kUnknown);
  }
  // Row id 1: cuMemAlloc with a negative (signed FNV-64) stack hash.
  auto it = std::find_if(d.events.begin(), d.events.end(), [](const Event& e) { return e.id == 1; });
  ASSERT_NE(it, d.events.end());
  EXPECT_EQ(it->ts_ns, 1774015573210678554u);
  EXPECT_EQ(it->dur_ns, 250590u);
  EXPECT_EQ(it->source, Source::kDriver);
  EXPECT_EQ(it->op, op::kCuMemAlloc);
  EXPECT_EQ(it->arg0, 2097152u);
  EXPECT_EQ(it->cgroup_id, 5722u);
  EXPECT_EQ(it->stack_id, static_cast<uint64_t>(int64_t{-5009549282017108909}));
  // Every stack hash that Ingero stored resolves through meta.stacks after the bit-cast.
  const int64_t linked = test::query_int(
      sample, "SELECT count(*) FROM events WHERE stack_hash IN (SELECT hash FROM stack_traces)");
  EXPECT_EQ(std::count_if(d.events.begin(), d.events.end(),
                          [&](const Event& e) { return m.stacks.count(e.stack_id) > 0; }),
            linked);
  EXPECT_GT(linked, 0);
}

TEST(SqliteReaderSample, SchedSwitchBecomesSpanStartingAtSwitchOut) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  std::string error;
  auto src = open_sqlite_trace(sample, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  std::map<uint64_t, const Event*> by_id;
  for (const auto& e : d.events) by_id[e.id] = &e;
  // The first sched_switch row of the file, read by SQL independently of the reader.
  const int64_t id = test::query_int(sample, "SELECT min(id) FROM events WHERE source=3 AND op=1");
  const int64_t ts = test::query_int(sample, "SELECT timestamp FROM events WHERE id=" + std::to_string(id));
  const int64_t dur = test::query_int(sample, "SELECT duration FROM events WHERE id=" + std::to_string(id));
  const int64_t arg1 = test::query_int(sample, "SELECT arg1 FROM events WHERE id=" + std::to_string(id));
  ASSERT_GT(id, 0);
  const Event& e = *by_id.at(static_cast<uint64_t>(id));
  EXPECT_EQ(e.ts_ns, static_cast<uint64_t>(ts - dur));
  EXPECT_EQ(e.end_ns(), static_cast<uint64_t>(ts));
  EXPECT_EQ(e.dur_ns, static_cast<uint64_t>(dur));
  EXPECT_EQ(e.arg1, static_cast<uint64_t>(arg1));  // the task that ran
  // Across the whole trace: every row is a span, the earliest one starts where SQL says.
  const int64_t n_switch = test::query_int(sample, "SELECT count(*) FROM events WHERE source=3 AND op=1");
  const int64_t earliest_start = test::query_int(
      sample, "SELECT min(timestamp - duration) FROM events WHERE source=3 AND op=1");
  uint64_t min_start = std::numeric_limits<uint64_t>::max();
  int64_t seen = 0;
  for (const auto& ev : d.events) {
    if (ev.source != Source::kHost || ev.op != op::kSchedSwitch) continue;
    min_start = std::min(min_start, ev.ts_ns);
    if (++seen > 50) continue;  // each check opens the file: 50 rows are plenty
    const int64_t row_ts = test::query_int(sample, "SELECT timestamp FROM events WHERE id=" + std::to_string(ev.id));
    ASSERT_EQ(ev.end_ns(), static_cast<uint64_t>(row_ts)) << test::describe(ev);
  }
  EXPECT_EQ(seen, n_switch);
  EXPECT_EQ(min_start, static_cast<uint64_t>(earliest_start));
  EXPECT_EQ(src->meta().first_ts, d.events.front().ts_ns);
}

TEST(SqliteReaderSample, BatchesAreOrderedWithWatermarks) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  std::string error;
  auto src = open_sqlite_trace(sample, error, 1000);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  ASSERT_EQ(d.batches.size(), 4u);  // 1000 + 1000 + 1000 + 807
  uint64_t prev_watermark = 0;
  for (size_t i = 0; i < d.batches.size(); ++i) {
    const Batch& b = d.batches[i];
    EXPECT_EQ(b.seq, i);
    EXPECT_EQ(b.final, i + 1 == d.batches.size());
    EXPECT_EQ(b.events.size(), i < 3 ? 1000u : 807u);
    EXPECT_TRUE(std::is_sorted(b.events.begin(), b.events.end(),
                               [](const Event& a, const Event& c) { return a.ts_ns < c.ts_ns; }));
    for (const auto& e : b.events) ASSERT_GE(e.ts_ns, prev_watermark);
    if (b.final) EXPECT_EQ(b.watermark, std::numeric_limits<uint64_t>::max());
    else EXPECT_EQ(b.watermark, b.events.back().ts_ns);
    prev_watermark = b.watermark;
  }
  Batch extra;
  EXPECT_FALSE(src->next(extra));
  uint64_t last = 0;
  for (const auto& e : d.events) last = std::max(last, e.end_ns());
  EXPECT_EQ(src->meta().last_ts, last);
}

TEST(SqliteReaderSample, ClusterDatabaseHasNodesAndTextIds) {
  REQUIRE_SAMPLE(sample, "sample-cluster.db");
  std::string error;
  auto src = open_sqlite_trace(sample, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  const TraceMeta& m = src->meta();
  EXPECT_EQ(m.format, "ingero-0.9");
  EXPECT_EQ(m.nodes, (std::vector<std::string>{"", "gpu-node-01", "gpu-node-02", "gpu-node-03"}));
  ASSERT_EQ(d.events.size(), 600u);
  EXPECT_EQ(m.health.rows_skipped, 0u);
  std::map<uint16_t, int> per_node;
  for (const auto& e : d.events) {
    ++per_node[e.node];
    ASSERT_EQ(e.rank, -1);  // rank is NULL in these traces
  }
  EXPECT_EQ(per_node, (std::map<uint16_t, int>{{1, 200}, {2, 200}, {3, 200}}));
  // "gpu-node-01:3538": an IO block_read at entry time.
  auto it = std::find_if(d.events.begin(), d.events.end(), [](const Event& e) { return e.id == 3538 && e.node == 1; });
  ASSERT_NE(it, d.events.end());
  EXPECT_EQ(it->ts_ns, 1775218723111028602u);
  EXPECT_EQ(it->dur_ns, 460370u);
  EXPECT_EQ(it->source, Source::kIo);
  EXPECT_EQ(it->op, op::kBlockRead);
  EXPECT_EQ(it->pid, 1887u);
  EXPECT_EQ(m.sessions.size(), 3u);
  EXPECT_EQ(m.process_names.size(), 15u);
}

TEST(SqliteReaderSample, NodeDatabasesAreSingleNode09) {
  for (const char* name : {"sample-gpu-node-01.db", "sample-gpu-node-02.db", "sample-gpu-node-03.db"}) {
    REQUIRE_SAMPLE(sample, name);
    std::string error;
    auto src = open_sqlite_trace(sample, error);
    ASSERT_NE(src, nullptr) << error;
    const auto d = test::drain(*src);
    EXPECT_EQ(src->meta().format, "ingero-0.9") << name;
    ASSERT_EQ(src->meta().nodes.size(), 2u) << name;
    EXPECT_EQ(src->meta().nodes[1], std::string("gpu-node-0") + name[17]) << name;
    EXPECT_EQ(d.events.size(), 200u) << name;
  }
}

}  // namespace
}  // namespace ingero
