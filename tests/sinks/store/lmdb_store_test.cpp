// LMDB store: round trip, merge of overlapping chunks, map growth, retention under a size bound,
// kill -9 while writing, and bad input.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "model/synth.h"
#include "sinks/store/lmdb_store.h"

namespace fs = std::filesystem;
using namespace ingero;

namespace {

class LmdbStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ip-lmdb-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

bool same_event(const Event& a, const Event& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Reads a whole trace, checking the EventSource contract on the way.
std::vector<Event> read_all(EventSource& src, uint64_t* batches = nullptr) {
  std::vector<Event> out;
  Batch b;
  uint64_t wm = 0, n = 0;
  bool final_seen = false;
  while (src.next(b)) {
    EXPECT_FALSE(final_seen) << "a batch after the final one";
    for (size_t i = 0; i < b.events.size(); ++i) {
      EXPECT_GE(b.events[i].ts_ns, wm) << "event behind the previous watermark";
      if (i > 0) {
        EXPECT_LE(b.events[i - 1].ts_ns, b.events[i].ts_ns) << "batch not sorted";
      }
    }
    if (!b.events.empty()) {
      EXPECT_LE(b.events.back().ts_ns, b.watermark);
    }
    EXPECT_GE(b.watermark, wm) << "watermark went back";
    wm = b.watermark;
    out.insert(out.end(), b.events.begin(), b.events.end());
    final_seen = b.final;
    ++n;
  }
  EXPECT_TRUE(final_seen) << "no final batch";
  if (batches) *batches = n;
  return out;
}

TEST_F(LmdbStoreTest, RoundTripEventsMetaAndChains) {
  const auto events = synth::make_large_trace(100'000, 7);
  std::string err;
  auto sink = LmdbSink::create(path("t.lmdb"), err);
  ASSERT_TRUE(sink) << err;
  TraceMeta meta;
  meta.process_names[20000] = "python3 train.py";
  meta.nodes = {"", "gpu-node-01"};
  meta.stacks[42] = StackTrace{"[\"0x1\"]", "[{\"s\":\"main\",\"f\":\"a.out\"}]"};
  ASSERT_TRUE(sink->write_meta(meta)) << sink->error();
  for (size_t i = 0; i < events.size(); i += 1000)
    ASSERT_TRUE(sink->write_events(std::span(events).subspan(i, std::min<size_t>(1000, events.size() - i))))
        << sink->error();
  Chain c;
  c.id = "launch_tail_offcpu:4242/4242:1763800010000000000";
  c.rule = "launch_tail_offcpu";
  c.category = "cpu_contention";
  c.severity = Severity::kHigh;
  c.tid = 4242;
  c.evidence.push_back({"offcpu", "thread off CPU", 0.93, "ratio", {1, 2, 3}});
  PredicateResult pred;
  pred.label = "p99 / p50 >= 3";
  pred.lhs = 200;
  pred.rhs = 3;
  pred.margin = 197;
  pred.passed = true;
  pred.lhs_text = "200x";
  c.predicates.push_back(pred);
  c.values.emplace_back("share", 0.93);
  c.node = 1;
  c.over_time = true;
  ThreadAccounting acc;  // the chain's thread over its window
  acc.pid = 20000;
  acc.tid = 4242;
  acc.node = 1;
  acc.comm = "python3 train.py";
  acc.start_ns = 1'763'800'010'000'000'000;
  acc.end_ns = acc.start_ns + 2'000'000'000;
  acc.wall_ns = 2'000'000'000;
  acc.in_calls_ns = {{"launch", 5}, {"sync", 7}};
  acc.preempted_ns = 1'000'000'000;
  acc.preempted_by = {{0, 99, "stress", 900'000'000}};
  acc.blocked_ns = {{"lock", 3}};
  acc.on_cpu_ns = 1'000'000'000 - 15;
  acc.scheduler_data = true;
  c.accounting = acc;
  ASSERT_TRUE(sink->write_chains(std::span(&c, 1))) << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  EXPECT_EQ(sink->events_committed(), events.size());

  LmdbTraceInfo info;
  ASSERT_TRUE(lmdb_trace_info(path("t.lmdb"), info, err)) << err;
  EXPECT_EQ(info.events, events.size());
  EXPECT_EQ(info.chunks, (events.size() + 4095) / 4096);
  EXPECT_EQ(info.chains, 1u);
  EXPECT_EQ(info.first_ts, events.front().ts_ns);

  auto src = open_lmdb_trace(path("t.lmdb"), err);
  ASSERT_TRUE(src) << err;
  const auto back = read_all(*src);
  ASSERT_EQ(back.size(), events.size());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_TRUE(same_event(back[i], events[i])) << "event " << i;
  EXPECT_EQ(src->meta().process_names.at(20000), "python3 train.py");
  EXPECT_EQ(src->meta().nodes.at(1), "gpu-node-01");
  EXPECT_EQ(src->meta().stacks.at(42).ips, "[\"0x1\"]");
  EXPECT_EQ(src->meta().format, kLmdbStoreFormat);
  EXPECT_EQ(src->meta().health.rows_read, events.size());
  EXPECT_EQ(src->meta().health.rows_skipped, 0u);

  std::vector<Chain> chains;
  ASSERT_TRUE(read_lmdb_chains(path("t.lmdb"), chains, err)) << err;
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_EQ(chains[0].id, c.id);
  EXPECT_EQ(chains[0].category, "cpu_contention");
  EXPECT_EQ(chains[0].severity, Severity::kHigh);
  ASSERT_EQ(chains[0].evidence.size(), 1u);
  EXPECT_EQ(chains[0].evidence[0].event_ids, (std::vector<uint64_t>{1, 2, 3}));
  ASSERT_EQ(chains[0].predicates.size(), 1u);
  EXPECT_DOUBLE_EQ(chains[0].predicates[0].margin, 197);
  EXPECT_EQ(chains[0].predicates[0].lhs_text, "200x");
  // Where the chain's thread's time went, kept with the chain.
  EXPECT_TRUE(chains[0].over_time);
  ASSERT_TRUE(chains[0].accounting.has_value());
  const ThreadAccounting& a = *chains[0].accounting;
  EXPECT_EQ(a.node, 1);
  EXPECT_EQ(a.tid, 4242u);
  EXPECT_EQ(a.comm, "python3 train.py");
  EXPECT_EQ(a.start_ns, acc.start_ns);
  EXPECT_EQ(a.wall_ns, acc.wall_ns);
  EXPECT_EQ(a.in_calls_ns, acc.in_calls_ns);
  EXPECT_EQ(a.blocked_ns, acc.blocked_ns);
  EXPECT_EQ(a.on_cpu_ns, acc.on_cpu_ns);
  EXPECT_EQ(a.preempted_ns, acc.preempted_ns);
  ASSERT_EQ(a.preempted_by.size(), 1u);
  EXPECT_EQ(a.preempted_by[0].comm, "stress");
  EXPECT_EQ(a.preempted_by[0].ns, 900'000'000u);
  EXPECT_TRUE(a.scheduler_data);
}

TEST_F(LmdbStoreTest, EmptyTraceGivesOneFinalBatch) {
  std::string err;
  auto sink = LmdbSink::create(path("e.lmdb"), err);
  ASSERT_TRUE(sink) << err;
  ASSERT_TRUE(sink->close(err)) << err;
  auto src = open_lmdb_trace(path("e.lmdb"), err);
  ASSERT_TRUE(src) << err;
  uint64_t batches = 0;
  EXPECT_TRUE(read_all(*src, &batches).empty());
  EXPECT_EQ(batches, 1u);
}

// Live batches overlap up to their watermark: chunks then overlap in time and the reader must
// merge them back into one ordered stream.
TEST_F(LmdbStoreTest, OverlappingChunksAreMerged) {
  auto events = synth::make_large_trace(50'000, 3);
  std::mt19937_64 rng(1);
  // Swap events up to 3000 positions apart: chunks of 1000 then overlap their neighbours.
  for (size_t i = 0; i + 3000 < events.size(); i += 7) std::swap(events[i], events[i + rng() % 3000]);
  std::string err;
  LmdbSink::Options o;
  o.chunk_events = 1000;
  o.chunks_per_txn = 3;
  auto sink = LmdbSink::create(path("o.lmdb"), err, o);
  ASSERT_TRUE(sink) << err;
  ASSERT_TRUE(sink->write_events(events)) << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  LmdbReadOptions ro;
  ro.batch_size = 700;
  auto src = open_lmdb_trace(path("o.lmdb"), err, ro);
  ASSERT_TRUE(src) << err;
  const auto back = read_all(*src);
  ASSERT_EQ(back.size(), events.size());
  std::vector<uint64_t> ids;
  for (const auto& e : back) ids.push_back(e.id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], i + 1);
}

TEST_F(LmdbStoreTest, MapGrowsWithoutLosingEvents) {
  const auto events = synth::make_large_trace(200'000, 5);
  std::string err;
  LmdbSink::Options o;
  o.chunk_events = 512;
  o.chunks_per_txn = 4;
  o.initial_map_bytes = 1 << 20;
  o.durable = false;
  auto sink = LmdbSink::create(path("g.lmdb"), err, o);
  ASSERT_TRUE(sink) << err;
  ASSERT_TRUE(sink->write_events(events)) << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  EXPECT_GT(sink->map_resizes(), 2u);
  auto src = open_lmdb_trace(path("g.lmdb"), err);
  ASSERT_TRUE(src) << err;
  EXPECT_EQ(read_all(*src).size(), events.size());
}

TEST_F(LmdbStoreTest, RetentionKeepsTheNewestWithinTheBound) {
  constexpr uint64_t kBound = 8 << 20;
  const auto events = synth::make_large_trace(400'000, 11);  // ~32 MB of events
  std::string err;
  LmdbSink::Options o;
  o.chunk_events = 1024;
  o.chunks_per_txn = 4;
  o.max_bytes = kBound;
  o.durable = false;
  auto sink = LmdbSink::create(path("r.lmdb"), err, o);
  ASSERT_TRUE(sink) << err;
  for (size_t i = 0; i < events.size(); i += 5000)
    ASSERT_TRUE(sink->write_events(std::span(events).subspan(i, std::min<size_t>(5000, events.size() - i))))
        << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  EXPECT_GT(sink->events_dropped(), 0u);

  EXPECT_LE(fs::file_size(path("r.lmdb")), kBound);
  LmdbTraceInfo info;
  ASSERT_TRUE(lmdb_trace_info(path("r.lmdb"), info, err)) << err;
  EXPECT_EQ(info.events + info.dropped_events, events.size());
  EXPECT_GT(info.events, 10'000u);
  EXPECT_EQ(info.dropped_events, sink->events_dropped());

  auto src = open_lmdb_trace(path("r.lmdb"), err);
  ASSERT_TRUE(src) << err;
  const auto back = read_all(*src);
  ASSERT_EQ(back.size(), info.events);
  // What is left is exactly the newest events, in order (the input was sorted).
  const size_t skip = events.size() - back.size();
  for (size_t i = 0; i < back.size(); ++i) ASSERT_TRUE(same_event(back[i], events[skip + i])) << i;
  EXPECT_EQ(src->meta().health.dropped_events, info.dropped_events);
}

TEST_F(LmdbStoreTest, Kill9WhileWritingLosesOnlyTheUncommittedTail) {
  constexpr size_t kChunk = 1024, kPerTxn = 2, kTxnEvents = kChunk * kPerTxn;
  const std::string file = path("crash.lmdb");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string err;
    LmdbSink::Options o;
    o.chunk_events = kChunk;
    o.chunks_per_txn = kPerTxn;
    o.durable = false;  // a killed process loses nothing the kernel already has
    auto sink = LmdbSink::create(file, err, o);
    if (!sink) ::_exit(2);
    synth::LargeTraceGenerator gen(1ull << 40, 1);
    std::vector<Event> buf;
    for (;;) {
      buf.clear();
      gen.next(buf, 1000);  // not a multiple of the chunk: the kill lands mid-chunk too
      const uint64_t before = sink->events_committed();
      if (!sink->write_events(buf)) ::_exit(3);
      const uint64_t after = sink->events_committed();
      if (after != before && ::write(fds[1], &after, sizeof after) != sizeof after) ::_exit(4);
    }
  }
  ::close(fds[1]);
  uint64_t acknowledged = 0, v = 0;
  while (acknowledged < 300'000 && ::read(fds[0], &v, sizeof v) == sizeof v) acknowledged = v;
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer died on its own, status " << status;
  ASSERT_GE(acknowledged, 300'000u);

  std::string err;
  LmdbTraceInfo info;
  ASSERT_TRUE(lmdb_trace_info(file, info, err)) << err;
  EXPECT_GE(info.events, acknowledged);
  EXPECT_EQ(info.events % kTxnEvents, 0u) << "a partial transaction is visible";
  auto src = open_lmdb_trace(file, err);
  ASSERT_TRUE(src) << err;
  const auto back = read_all(*src);
  ASSERT_EQ(back.size(), info.events);
  EXPECT_EQ(src->meta().health.rows_skipped, 0u) << "corrupt chunks after the crash";
  // The readable log is exactly a prefix of what was written.
  const auto expected = synth::make_large_trace(back.size(), 1);
  for (size_t i = 0; i < back.size(); ++i) ASSERT_TRUE(same_event(back[i], expected[i])) << i;

  // The log stays writable: appending after the crash continues it.
  LmdbSink::Options o;
  o.append = true;
  auto sink = LmdbSink::create(file, err, o);
  ASSERT_TRUE(sink) << err;
  ASSERT_TRUE(sink->write_events(std::span(expected).first(10))) << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  ASSERT_TRUE(lmdb_trace_info(file, info, err)) << err;
  EXPECT_EQ(info.events, back.size() + 10);
}

TEST_F(LmdbStoreTest, CorruptChunkIsSkippedAndCounted) {
  auto events = synth::make_large_trace(20'000, 2);
  for (size_t i = 8192; i < 8192 + 4096; ++i) events[i].arg1 = 0xFEEDFACECAFEBEEFull;
  std::string err;
  auto sink = LmdbSink::create(path("c.lmdb"), err);
  ASSERT_TRUE(sink) << err;
  ASSERT_TRUE(sink->write_events(events)) << sink->error();
  ASSERT_TRUE(sink->close(err)) << err;
  // Flip a byte inside the third chunk's payload (found by its marker value).
  std::fstream f(path("c.lmdb"), std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  uint64_t marker = 0xFEEDFACECAFEBEEFull;
  const auto at = bytes.find(std::string(reinterpret_cast<char*>(&marker), 8));
  ASSERT_NE(at, std::string::npos);
  f.seekp(static_cast<std::streamoff>(at + 3));
  f.put(static_cast<char>(bytes[at + 3] ^ 0x40));
  f.close();
  auto src = open_lmdb_trace(path("c.lmdb"), err);
  ASSERT_TRUE(src) << err;
  const auto back = read_all(*src);
  EXPECT_EQ(back.size(), events.size() - 4096);
  EXPECT_EQ(src->meta().health.rows_skipped, 1u);
  EXPECT_EQ(src->meta().health.reasons.count("corrupt chunk (checksum mismatch)"), 1u);
}

TEST_F(LmdbStoreTest, BadInputGivesOneLineErrors) {
  std::string err;
  EXPECT_FALSE(open_lmdb_trace(path("missing.lmdb"), err));
  EXPECT_EQ(err, path("missing.lmdb") + ": no such file");

  std::ofstream(path("garbage.bin")) << std::string(8192, 'x');
  EXPECT_FALSE(open_lmdb_trace(path("garbage.bin"), err));
  EXPECT_EQ(err, path("garbage.bin") + ": not an LMDB trace (no LMDB meta page at the start of the file)");

  std::ofstream(path("tiny.bin")) << "ab";
  EXPECT_FALSE(open_lmdb_trace(path("tiny.bin"), err));
  EXPECT_NE(err.find("not an LMDB trace"), std::string::npos) << err;

  std::ofstream(path("fake.db"), std::ios::binary) << std::string("SQLite format 3\0", 16) << std::string(4096, '\0');
  EXPECT_FALSE(open_lmdb_trace(path("fake.db"), err));
  EXPECT_NE(err.find("it is a SQLite database"), std::string::npos) << err;

  EXPECT_FALSE(open_lmdb_trace(dir_.string(), err));
  EXPECT_NE(err.find("is a directory"), std::string::npos) << err;

  // An LMDB environment that is not ours.
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  ASSERT_EQ(mdb_env_open(env, path("other.mdb").c_str(), MDB_NOSUBDIR, 0644), 0);
  MDB_txn* txn = nullptr;
  MDB_dbi dbi;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, nullptr, 0, &dbi), 0);
  MDB_val k{3, const_cast<char*>("key")}, v{5, const_cast<char*>("value")};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  EXPECT_FALSE(open_lmdb_trace(path("other.mdb"), err));
  EXPECT_EQ(err, path("other.mdb") +
                     ": an LMDB environment, but not an ingero-pipeline trace (no "
                     "'events'/'meta' databases)");

  // The writer never replaces a file that is not an LMDB trace.
  EXPECT_FALSE(LmdbSink::create(path("garbage.bin"), err));
  EXPECT_EQ(err, path("garbage.bin") + ": exists and is not an LMDB trace; refusing to overwrite it");
  EXPECT_EQ(fs::file_size(path("garbage.bin")), 8192u);

  LmdbSink::Options o;
  o.max_bytes = 1 << 20;
  EXPECT_FALSE(LmdbSink::create(path("small.lmdb"), err, o));
  EXPECT_NE(err.find("max_bytes 1048576 is too small"), std::string::npos) << err;
}

}  // namespace
