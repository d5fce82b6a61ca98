// SpoolingWriter: order and completeness through the FIFO and the spill file, metadata order,
// results, failure reporting (sink and spill), memory bound, nothing left behind (even kill -9).
// No test here times anything: a slow writer is made with commit_every = 1 and a tiny FIFO.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "model/ops.h"
#include "sinks/store/spooling_writer.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::TempDir;

constexpr uint64_t kT0 = 1'760'000'000'000'000'000ull;

// Ids 1..n in order; timestamps deliberately not monotonic, so the table order (rowid) is a
// check of the write order and not of the time order.
std::vector<Event> make_events(size_t n, uint64_t first_id = 1) {
  std::mt19937_64 rng(first_id * 7919 + n);
  std::vector<Event> v(n);
  for (size_t i = 0; i < n; ++i) {
    Event& e = v[i];
    e.id = first_id + i;
    e.ts_ns = kT0 + (rng() % 1'000'000'000);
    e.dur_ns = 1'000 + rng() % 50'000;
    e.pid = 4242;
    e.tid = 4242 + static_cast<uint32_t>(i % 4);
    e.source = i % 5 == 4 ? Source::kHost : Source::kCuda;
    e.op = i % 5 == 4 ? op::kSchedSwitch : op::kCudaLaunchKernel;
    e.prev_state = i % 5 == 4 ? OffCpuState::kPreempted : OffCpuState::kUnknown;
    e.arg0 = rng();
    e.node = static_cast<uint16_t>(i % 2);
  }
  return v;
}

std::vector<std::string> ids_in_table_order(const std::string& path) {
  std::vector<std::string> ids;
  // Called on closed databases only: immutable, so no -shm/-wal is created beside them.
  const std::string uri = "file:" + path + "?mode=ro&immutable=1";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT id FROM events ORDER BY rowid", -1, &st, nullptr) == SQLITE_OK)
      while (sqlite3_step(st) == SQLITE_ROW)
        ids.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return ids;
}

std::string expected_id(const Event& e, const std::vector<std::string>& nodes) {
  const std::string& n = nodes.at(e.node);
  return n.empty() ? std::to_string(e.id) : n + ":" + std::to_string(e.id);
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_balanced(const SpoolingWriter::Stats& s) {
  EXPECT_EQ(s.events_in, s.events_written + s.events_rejected + s.lost + s.backlog)
      << "in " << s.events_in << " written " << s.events_written << " rejected " << s.events_rejected << " lost "
      << s.lost << " backlog " << s.backlog;
}

std::unique_ptr<SpoolingWriter> start_writer(const std::string& db, size_t cap, const std::string& spill_dir,
                                             size_t commit_every = 4096) {
  std::string error;
  SqliteSink::Options so;
  so.commit_every = commit_every;
  auto sink = SqliteSink::create(db, error, so);
  EXPECT_NE(sink, nullptr) << error;
  if (!sink) return nullptr;
  SpoolingWriter::Options o;
  o.memory_cap_bytes = cap;
  o.spill_dir = spill_dir;
  auto w = SpoolingWriter::start(std::move(sink), o, error);
  EXPECT_NE(w, nullptr) << error;
  return w;
}

// A writer far slower than the producer (one transaction per event) behind a 4 KiB FIFO: most
// calls spill, some go through memory, and the database must still hold every event, in call
// order, exactly as the reader gives it back.
TEST(SpoolingWriter, SlowWriterTinyFifoKeepsEveryEventInOrder) {
  TempDir dir, spill;
  const std::string p = dir.file("out.db");
  auto w = start_writer(p, 4096, spill.path(), /*commit_every=*/1);
  ASSERT_NE(w, nullptr);
  TraceMeta meta;
  meta.nodes = {"", "gpu-a"};
  w->write_meta(meta);
  const auto events = make_events(6000);
  const size_t sizes[] = {1, 3, 40, 200, 7, 64, 1, 51, 52};
  size_t pos = 0;
  for (size_t k = 0; pos < events.size(); ++k) {
    const size_t n = std::min(sizes[k % std::size(sizes)], events.size() - pos);
    w->write_events(std::span(events).subspan(pos, n));
    pos += n;
    if (k == 40) {
      EXPECT_TRUE(dir_entries(spill.path()).empty()) << "spill file has a name";
    }
  }
  const auto mid = w->stats();
  EXPECT_GT(mid.events_spilled, 0u);
  EXPECT_LE(mid.memory_bytes_peak, mid.memory_cap_bytes);
  expect_balanced(mid);

  std::vector<std::string> lines;
  std::string error;
  ASSERT_TRUE(w->finish(nullptr, error, [&](const std::string& l) { lines.push_back(l); })) << error;
  const auto s = w->stats();
  EXPECT_EQ(s.events_in, events.size());
  EXPECT_EQ(s.events_written, events.size());
  EXPECT_EQ(s.lost, 0u);
  EXPECT_EQ(s.backlog, 0u);
  EXPECT_EQ(s.memory_bytes_now, 0u);
  EXPECT_EQ(s.spill_bytes_now, 0u);
  EXPECT_EQ(s.memory_cap_bytes, 4096u / sizeof(Event) * sizeof(Event));
  EXPECT_GT(s.memory_bytes_peak, 0u);
  EXPECT_LE(s.memory_bytes_peak, s.memory_cap_bytes);
  EXPECT_GE(s.spill_bytes_peak, 200 * sizeof(Event));
  EXPECT_TRUE(s.error.empty()) << s.error;
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "indexing 6,000 events");

  std::vector<std::string> want;
  for (const auto& e : events) want.push_back(expected_id(e, meta.nodes));
  EXPECT_EQ(ids_in_table_order(p), want);
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  auto got = test::drain(*src).events;
  auto sorted = events;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  ASSERT_EQ(got.size(), sorted.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(test::same_event(got[i], sorted[i]))
        << i << ": " << test::describe(got[i]) << " vs " << test::describe(sorted[i]);
  EXPECT_TRUE(dir_entries(spill.path()).empty());
  EXPECT_EQ(dir_entries(dir.path()), (std::vector<std::string>{"out.db"}));
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM pragma_index_list('events')"), 4);
}

// The default spill directory is the database's; still nothing but the database is left.
TEST(SpoolingWriter, DefaultSpillDirLeavesOnlyTheDatabase) {
  TempDir dir;
  const std::string p = dir.file("trace.db");
  auto w = start_writer(p, 0, "");  // no FIFO at all: every call spills
  ASSERT_NE(w, nullptr);
  const auto events = make_events(1000);
  for (size_t i = 0; i < events.size(); i += 100) w->write_events(std::span(events).subspan(i, 100));
  for (const auto& name : dir_entries(dir.path()))
    EXPECT_TRUE(name.rfind("trace.db", 0) == 0) << "unexpected file " << name;
  std::string error;
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  EXPECT_EQ(w->stats().events_spilled, 1000u);
  EXPECT_EQ(w->stats().memory_bytes_peak, 0u);
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 1000);
  EXPECT_EQ(dir_entries(dir.path()), (std::vector<std::string>{"trace.db"}));
}

// Metadata is applied between the events queued before and after it: node names prove it.
TEST(SpoolingWriter, MetaIsAppliedInOrderWithEvents) {
  TempDir dir;
  const std::string p = dir.file("meta.db");
  auto w = start_writer(p, 4096, dir.path());
  ASSERT_NE(w, nullptr);
  auto events = make_events(900);
  for (auto& e : events) e.node = 1;
  TraceMeta a, b;
  a.nodes = {"", "rack-a"};
  a.process_names = {{4242, "python3"}};
  b.nodes = {"", "rack-b"};
  b.process_names = {{4242, "python3"}, {7, "worker"}};
  w->write_meta(a);
  w->write_events(std::span(events).first(300));  // spilled (300 > 51 per FIFO)
  w->write_events(std::span(events).subspan(300, 10));
  w->write_meta(b);
  w->write_events(std::span(events).subspan(310));
  std::string error;
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  const auto ids = ids_in_table_order(p);
  ASSERT_EQ(ids.size(), 900u);
  for (size_t i = 0; i < ids.size(); ++i)
    ASSERT_EQ(ids[i], (i < 310 ? "rack-a:" : "rack-b:") + std::to_string(i + 1)) << i;
  EXPECT_EQ(test::query_text(p, "SELECT value FROM ip_meta WHERE key = 'nodes'"), "[\"\",\"rack-b\"]");
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM process_names"), 2);
  EXPECT_EQ(w->stats().metas_pending, 0u);
}

// Events queued before any write_meta: the metadata tables are still written first.
TEST(SpoolingWriter, EventsWithoutMetaGetMetadataTablesFirst) {
  TempDir dir;
  const std::string p = dir.file("nometa.db");
  auto w = start_writer(p, 1 << 20, dir.path());
  ASSERT_NE(w, nullptr);
  auto events = make_events(10);
  for (auto& e : events) e.node = 0;
  w->write_events(events);
  std::string error;
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  EXPECT_EQ(test::query_text(p, "SELECT value FROM ip_meta WHERE key = 'nodes'"), "[\"\"]");
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM ip_meta WHERE key = 'rows_read'"), 1);
  EXPECT_EQ(ids_in_table_order(p).front(), "1");
}

TEST(SpoolingWriter, FinishWritesTheResultAndLaterEventsAreCountedLost) {
  TempDir dir;
  const std::string p = dir.file("result.db");
  auto w = start_writer(p, 8 << 20, "");
  ASSERT_NE(w, nullptr);
  const auto events = make_events(5000);
  w->write_events(events);
  AnalysisResult r;
  Chain c;
  c.id = "launch_tail_offcpu:4242:1";
  c.rule = "launch_tail_offcpu";
  c.severity = Severity::kHigh;
  c.source = Source::kCuda;
  c.op = op::kCudaLaunchKernel;
  c.pid = 4242;
  c.window_start = kT0;
  c.window_end = kT0 + 10'000'000'000;
  c.summary = "slow launches";
  c.evidence = {{"tail", "p99", 25'000'000, "ns", {3, 4}}};
  r.chains.push_back(c);
  std::string error;
  ASSERT_TRUE(w->finish(&r, error)) << error;
  AnalysisResult back;
  ASSERT_TRUE(read_result(p, back, error)) << error;
  ASSERT_EQ(back.chains.size(), 1u);
  EXPECT_EQ(back.chains[0].id, c.id);
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM causal_chains"), 1);
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 5000);

  w->write_events(std::span(events).first(7));  // a contract violation: counted, not stored
  const auto s = w->stats();
  EXPECT_EQ(s.lost, 7u);
  expect_balanced(s);
  EXPECT_NE(s.error.find("after finish"), std::string::npos) << s.error;
  EXPECT_TRUE(w->finish(nullptr, error));  // idempotent: the answer of the real finish()
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 5000);
}

TEST(SpoolingWriter, DestructorDrainsWhatIsQueued) {
  TempDir dir;
  const std::string p = dir.file("dtor.db");
  {
    auto w = start_writer(p, 4096, dir.path());
    ASSERT_NE(w, nullptr);
    const auto events = make_events(3000);
    for (size_t i = 0; i < events.size(); i += 30) w->write_events(std::span(events).subspan(i, 30));
  }
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 3000);
  EXPECT_EQ(dir_entries(dir.path()), (std::vector<std::string>{"dtor.db"}));
}

TEST(SpoolingWriter, StartFailsCleanlyOnAMissingSpillDir) {
  TempDir dir;
  std::string error;
  auto sink = SqliteSink::create(dir.file("x.db"), error);
  ASSERT_NE(sink, nullptr) << error;
  SpoolingWriter::Options o;
  o.spill_dir = dir.file("no/such/dir");
  EXPECT_EQ(SpoolingWriter::start(std::move(sink), o, error), nullptr);
  EXPECT_NE(error.find("no/such/dir"), std::string::npos) << error;
  EXPECT_NE(error.find("spill"), std::string::npos) << error;
}

// Runs `body` in a child process whose files may not grow past `fsize_limit` bytes (writes past
// it fail with EFBIG, as on a full disk). The child reports one line through `report`; returns
// the child's exit status.
template <typename F>
int in_child_with_file_limit(rlim_t fsize_limit, std::string& report, F&& body) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{fsize_limit, fsize_limit};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(90);
    std::string line;
    const int code = body(line);
    if (::write(fds[1], line.data(), line.size()) < 0) ::_exit(91);
    ::_exit(code);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t r;
  while ((r = ::read(fds[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(r));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

// The database cannot grow (a full disk): the failure is reported, events not stored are
// counted lost, nothing crashes, and what was committed stays readable.
TEST(SpoolingWriter, SinkFailureIsReportedNotACrash) {
  TempDir dir;
  const std::string p = dir.file("full.db");
  std::string report;
  const int status = in_child_with_file_limit(2 << 20, report, [&](std::string& line) {
    auto w = start_writer(p, 16 << 20, dir.path(), 1000);
    if (!w) return 10;
    const auto events = make_events(100'000);
    for (size_t i = 0; i < events.size(); i += 1000) w->write_events(std::span(events).subspan(i, 1000));
    std::string error;
    const bool ok = w->finish(nullptr, error);
    w->write_events(std::span(events).first(5));
    const auto s = w->stats();
    line = std::to_string(s.events_written) + " " + std::to_string(s.lost) + " " + error;
    if (ok) return 11;
    if (error.empty() || s.error.empty()) return 12;
    if (s.lost == 0 || s.events_written + s.lost + s.events_rejected != s.events_in) return 13;
    if (s.backlog != 0) return 14;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status << " " << report;
  ASSERT_EQ(WEXITSTATUS(status), 0) << report;
  const uint64_t written = std::stoull(report);
  EXPECT_LT(written, 100'000u) << report;
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  EXPECT_EQ(test::drain(*src).events.size(), written) << report;
}

// The spill file cannot grow: that call's events are lost and counted, the others are stored,
// and the database records the loss where readers look for drops.
TEST(SpoolingWriter, SpillFailureCountsLostAndRecordsDrops) {
  TempDir dir, spill;
  const std::string p = dir.file("spillfail.db");
  std::string report;
  const int status = in_child_with_file_limit(4 << 20, report, [&](std::string& line) {
    auto w = start_writer(p, 4096, spill.path());
    if (!w) return 10;
    const auto events = make_events(60'200);
    w->write_events(std::span(events).first(100));
    w->write_events(std::span(events).subspan(100, 60'000));  // 4.8 MB: past the limit
    w->write_events(std::span(events).subspan(60'100));
    const auto mid = w->stats();
    std::string error;
    const bool ok = w->finish(nullptr, error);
    const auto s = w->stats();
    line = error;
    if (ok) return 11;
    if (mid.lost != 60'000 || s.lost != 60'000) return 12;
    if (s.events_written != 200) return 13;
    if (error.find("spill file write failed") == std::string::npos) return 14;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status << " " << report;
  ASSERT_EQ(WEXITSTATUS(status), 0) << report;
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto got = test::drain(*src).events;
  ASSERT_EQ(got.size(), 200u);
  std::set<uint64_t> ids;
  for (const auto& e : got) ids.insert(e.id);
  EXPECT_EQ(*ids.begin(), 1u);
  EXPECT_EQ(ids.count(100), 1u);
  EXPECT_EQ(ids.count(101), 0u);
  EXPECT_EQ(ids.count(60'101), 1u);
  EXPECT_EQ(src->meta().health.dropped_events, 60'000u);
  EXPECT_TRUE(dir_entries(spill.path()).empty());
}

// kill -9 while spilling: the database is readable (committed transactions, no indexes) and the
// spill file is gone with the process.
TEST(SpoolingWriter, KillDashNineLeavesNoSpillFile) {
  TempDir dir, spill;
  const std::string p = dir.file("killed.db");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string error;
    SqliteSink::Options so;
    so.commit_every = 100;
    auto sink = SqliteSink::create(p, error, so);
    if (!sink) ::_exit(2);
    SpoolingWriter::Options o;
    o.memory_cap_bytes = 4096;
    o.spill_dir = spill.path();
    auto w = SpoolingWriter::start(std::move(sink), o, error);
    if (!w) ::_exit(3);
    w->write_meta(TraceMeta{});
    bool told = false;
    for (uint64_t id = 1;; id += 100) {
      const auto events = make_events(100, id);
      w->write_events(events);
      const auto s = w->stats();
      if (!told && s.events_spilled >= 20'000 && s.events_written >= 1000) {
        told = true;
        const char c = 'x';
        if (::write(fds[1], &c, 1) != 1) ::_exit(4);
      }
    }
  }
  ::close(fds[1]);
  char c = 0;
  const bool ready = ::read(fds[0], &c, 1) == 1;
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ASSERT_TRUE(ready) << "writer exited early with status " << status;
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_TRUE(dir_entries(spill.path()).empty());
  EXPECT_EQ(test::query_text(p, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM pragma_index_list('events')"), 0);
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto got = test::drain(*src).events;
  EXPECT_GE(got.size(), 1000u);
  EXPECT_EQ(got.size() % 100, 0u) << "only whole transactions survive";
  // A prefix of the calls: ids 1..n, each once.
  std::vector<uint64_t> ids;
  for (const auto& e : got) ids.push_back(e.id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], i + 1);
}

// Whatever the rate, the FIFO never holds more than its cap (the rest waits on disk).
TEST(SpoolingWriter, MemoryStaysWithinTheCap) {
  TempDir dir;
  const std::string p = dir.file("cap.db");
  const size_t cap = 64 << 10;
  auto w = start_writer(p, cap, dir.path(), 1);
  ASSERT_NE(w, nullptr);
  const auto events = make_events(20'000);
  uint64_t peak_seen = 0;
  for (size_t i = 0; i < events.size(); i += 500) {
    w->write_events(std::span(events).subspan(i, 500));
    const auto s = w->stats();
    peak_seen = std::max(peak_seen, s.memory_bytes_now);
    ASSERT_LE(s.memory_bytes_now, cap);
    expect_balanced(s);
  }
  std::string error;
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  const auto s = w->stats();
  EXPECT_LE(s.memory_bytes_peak, cap);
  EXPECT_GE(s.memory_bytes_peak, peak_seen);
  EXPECT_GT(s.events_spilled, 0u);
  EXPECT_EQ(s.events_written, 20'000u);
}

}  // namespace
}  // namespace ingero
