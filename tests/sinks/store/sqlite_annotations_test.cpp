// ip_annotations (sinks/store/sqlite_store.h write_annotations / read_annotations): the round trip
// on a database the sink wrote, Ingero's own `annotations` table (agent v0.17+), odd rows, other
// tools' tables of that name, files without either.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/annotation.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::query_int;
using test::query_text;
using test::run_sql;
using test::TempDir;

Annotation make(uint64_t ts, uint32_t pid, const std::map<std::string, std::string>& labels, uint16_t node = 0) {
  Annotation a;
  a.ts_ns = ts;
  a.pid = pid;
  a.labels = labels;
  a.node = node;
  return a;
}

// A database the sink wrote, naming the nodes "" and "gpu-7".
std::string our_db(const TempDir& dir) {
  const std::string path = dir.file("ours.db");
  std::string error;
  auto sink = SqliteSink::create(path, error);
  EXPECT_TRUE(sink) << error;
  TraceMeta meta;
  meta.nodes = {"", "gpu-7"};
  EXPECT_TRUE(sink->write_meta(meta));
  EXPECT_TRUE(sink->close(error)) << error;
  return path;
}

TEST(SqliteAnnotations, RoundTripKeepsEveryField) {
  TempDir dir;
  const std::string db = our_db(dir);
  std::vector<Annotation> rows;
  Annotation a = make(1'700'000'000'000'000'100ull, 42, {{"step", "7"}, {"epoch", "1"}, {"run_id", "r\"1"}}, 1);
  a.ts_given = true;
  a.tid = 43;
  a.start_time = 12345;
  a.peer_pid = 42;
  a.peer_uid = 1000;
  a.peer_gid = 1001;
  Annotation b = make(1'700'000'000'000'000'000ull, 42, {{"step", "warmup"}});  // earlier: read first
  b.span_start_ns = 1'700'000'000'000'000'000ull;
  b.span_end_ns = 1'700'000'000'500'000'000ull;
  Annotation c = make(1'700'000'000'000'000'200ull, 9, {{"task_id", "t1"}});
  rows = {a, b, c};
  std::string error;
  ASSERT_TRUE(write_annotations(db, rows, {"", "gpu-7"}, error)) << error;
  // SQL users get the numbers as columns.
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ip_annotations"), 3);
  EXPECT_EQ(query_int(db, "SELECT step FROM ip_annotations WHERE pid = 42 AND node = 'gpu-7'"), 7);
  EXPECT_EQ(query_int(db, "SELECT epoch FROM ip_annotations WHERE tid = 43"), 1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ip_annotations WHERE step IS NULL"), 2);  // "warmup", none
  EXPECT_EQ(query_text(db, "SELECT labels FROM ip_annotations WHERE pid = 9"), R"({"task_id":"t1"})");

  std::vector<Annotation> back;
  AnnotationReadStats st;
  ASSERT_TRUE(read_annotations(db, {"", "gpu-7"}, back, st, error)) << error;
  EXPECT_EQ(st.table, "ip_annotations");
  EXPECT_EQ(st.rows, 3u);
  EXPECT_EQ(st.skipped, 0u);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].labels, b.labels);  // time order
  EXPECT_EQ(back[0].span_start_ns, b.span_start_ns);
  EXPECT_EQ(back[0].span_end_ns, b.span_end_ns);
  const Annotation& x = back[1];
  EXPECT_EQ(x.ts_ns, a.ts_ns);
  EXPECT_TRUE(x.ts_given);
  EXPECT_EQ(x.node, 1);
  EXPECT_EQ(x.pid, 42u);
  EXPECT_EQ(x.tid, 43u);
  EXPECT_EQ(x.start_time, 12345u);
  EXPECT_EQ(x.labels, a.labels);
  EXPECT_EQ(x.peer_pid, 42u);
  EXPECT_EQ(x.peer_uid, 1000u);
  EXPECT_EQ(x.peer_gid, 1001u);
  EXPECT_FALSE(back[2].ts_given);
  StepMarker m;
  ASSERT_TRUE(step_marker_of(x, m));
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.node, 1);

  // The same file read for a trace whose only node is "": the gpu-7 row is another node's.
  ASSERT_TRUE(read_annotations(db, {""}, back, st, error)) << error;
  EXPECT_EQ(back.size(), 2u);
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_EQ(st.reasons.at("node not in the trace"), 1u);

  // Appending is appending.
  ASSERT_TRUE(write_annotations(db, {c}, {""}, error)) << error;
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ip_annotations"), 4);
}

TEST(SqliteAnnotations, ReadsIngerosOwnTable) {
  TempDir dir;
  const std::string db = dir.file("ingero.db");
  // Ingero's agent v0.17 schema (internal/store: annotations), beside a minimal events table.
  ASSERT_EQ(run_sql(db,
                    "CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL,"
                    " tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL);"
                    "CREATE TABLE annotations (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp INTEGER NOT NULL,"
                    " labels TEXT NOT NULL, pid INTEGER NOT NULL DEFAULT 0, start_time INTEGER NOT NULL DEFAULT 0,"
                    " span_start INTEGER NOT NULL DEFAULT 0, span_end INTEGER NOT NULL DEFAULT 0,"
                    " peer_uid INTEGER NOT NULL DEFAULT 0, peer_gid INTEGER NOT NULL DEFAULT 0,"
                    " peer_pid INTEGER NOT NULL DEFAULT 0);"
                    "INSERT INTO annotations(timestamp, labels, pid, start_time, peer_uid, peer_pid) VALUES"
                    " (1700000000200000000, '{\"epoch\":\"0\",\"step\":\"1\"}', 4821, 99, 1000, 4821),"
                    " (1700000000100000000, '{\"epoch\":\"0\",\"step\":\"0\"}', 4821, 99, 1000, 4821),"
                    " (1700000000300000000, 'not json', 4821, 0, 0, 0),"
                    " (0, '{\"step\":\"2\"}', 4821, 0, 0, 0),"
                    " (1700000000400000000, '{\"step\":\"3\"}', -5, 0, 0, 0),"
                    " (1700000000500000000, '{\"step\":[3]}', 4821, 0, 0, 0);"),
            "");
  std::vector<Annotation> back;
  AnnotationReadStats st;
  std::string error;
  ASSERT_TRUE(read_annotations(db, {""}, back, st, error)) << error;
  EXPECT_EQ(st.table, "annotations");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].ts_ns, 1'700'000'000'100'000'000ull);
  EXPECT_EQ(*back[0].label("step"), "0");
  EXPECT_EQ(back[0].pid, 4821u);
  EXPECT_EQ(back[0].start_time, 99u);
  EXPECT_EQ(back[0].peer_uid, 1000u);
  EXPECT_TRUE(back[0].ts_given);
  EXPECT_EQ(st.skipped, 4u);
  EXPECT_EQ(st.reasons.at("labels not a JSON object of strings"), 2u);
  EXPECT_EQ(st.reasons.at("time not a positive integer"), 1u);
  EXPECT_EQ(st.reasons.at("pid or tid out of range"), 1u);
}

TEST(SqliteAnnotations, FilesWithoutThemAndOtherToolsTables) {
  TempDir dir;
  std::string error;
  std::vector<Annotation> back{make(1, 1, {{"a", "b"}})};
  AnnotationReadStats st;
  const std::string ours = our_db(dir);
  ASSERT_TRUE(read_annotations(ours, {""}, back, st, error)) << error;
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(st.table, "");
  // Someone else's `annotations` (no timestamp/labels columns): not ours to read.
  const std::string other = dir.file("other.db");
  ASSERT_EQ(run_sql(other,
                    "CREATE TABLE annotations (id INTEGER, memory_id TEXT, kind TEXT, value TEXT);"
                    "INSERT INTO annotations VALUES (1, 'm', 'k', 'v');"),
            "");
  ASSERT_TRUE(read_annotations(other, {""}, back, st, error)) << error;
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(st.table, "");
  // Not a database, no file: an error naming it.
  test::write_file(dir.file("text.db"), "hello world");
  EXPECT_FALSE(read_annotations(dir.file("text.db"), {""}, back, st, error));
  EXPECT_EQ(error.rfind(dir.file("text.db") + ": not a SQLite database", 0), 0u) << error;
  EXPECT_FALSE(write_annotations(dir.file("missing.db"), {make(1, 1, {{"a", "b"}})}, {""}, error));
  EXPECT_EQ(error.rfind(dir.file("missing.db") + ": ", 0), 0u) << error;
}

}  // namespace
}  // namespace ingero
