// RollingWriter and the set of rolled files read as one trace (sinks/store/rollover.h): rollover
// at a size and an age bound, retention (oldest deleted, newest kept, total bounded), every file
// readable alone, the set replayed and queried as one trace, and a writer killed with SIGKILL
// leaving every closed file complete and the open one recoverable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "model/ops.h"
#include "sinks/store/rollover.h"
#include "sinks/store/sql_query.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr uint64_t kT0 = 1'760'000'000'000'000'000ull;

// Ids first_id.., one every 10 us, two processes.
std::vector<Event> make_events(size_t n, uint64_t first_id) {
  std::vector<Event> v(n);
  for (size_t i = 0; i < n; ++i) {
    Event& e = v[i];
    e.id = first_id + i;
    e.ts_ns = kT0 + (first_id + i) * 10'000;
    e.dur_ns = 2'000 + (i % 7) * 100;
    e.pid = (first_id + i) % 2 ? 1001 : 1002;
    e.tid = e.pid;
    e.source = Source::kCuda;
    e.op = op::kCudaLaunchKernel;
  }
  return v;
}

TraceMeta make_meta() {
  TraceMeta m;
  m.path = "<live>";
  m.nodes = {"node-a"};
  m.process_names = {{1001, "trainer-1"}, {1002, "trainer-2"}};
  return m;
}

std::vector<std::string> db_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".db") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;  // files come and go while the writer rolls
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const auto n = fs::file_size(it->path(), ec2);
    if (!ec2) total += n;
  }
  return total;
}

// Replays `path` (a file or a set): ids in delivery order; checks the batch contract on the way.
std::vector<uint64_t> replay_ids(const std::string& path, TraceMeta* meta_out = nullptr) {
  std::string error;
  auto src = open_sqlite_trace(path, error, 1000);
  EXPECT_TRUE(src) << error;
  std::vector<uint64_t> ids;
  if (!src) return ids;
  Batch b;
  uint64_t wm = 0;
  bool final_seen = false;
  while (src->next(b)) {
    EXPECT_FALSE(final_seen) << "a batch after the final one";
    EXPECT_TRUE(std::is_sorted(b.view().begin(), b.view().end(),
                               [](const Event& x, const Event& y) { return x.ts_ns < y.ts_ns; }));
    for (const Event& e : b.view()) {
      EXPECT_TRUE(e.ts_ns >= wm || (e.flags & event_flags::kLate)) << "event behind the watermark";
      ids.push_back(e.id);
    }
    EXPECT_GE(b.watermark, wm) << "watermark went back";
    wm = b.watermark;
    final_seen = b.final;
  }
  EXPECT_TRUE(final_seen);
  EXPECT_EQ(wm, UINT64_MAX);
  if (meta_out) *meta_out = src->meta();
  return ids;
}

RolloverOptions small_files(const std::string& dir) {
  RolloverOptions o;
  o.dir = dir;
  o.file_bytes = 2 << 20;
  o.file_age_ns = 0;
  o.check_every_ns = 0;  // read the size at every write
  o.writer.memory_cap_bytes = 1 << 20;
  return o;
}

TEST(Rollover, RollsAtSizeAndEveryFileStandsAloneAndTheSetIsOneTrace) {
  TempDir dir;
  std::string error;
  auto w = RollingWriter::start(small_files(dir.path()), error);
  ASSERT_TRUE(w) << error;
  const TraceMeta meta = make_meta();
  w->write_meta(meta);
  constexpr size_t kBatches = 80, kPer = 2000;
  for (size_t b = 0; b < kBatches; ++b) {
    const auto ev = make_events(kPer, 1 + b * kPer);
    w->write_events(ev, meta);
    // Give the writer thread time to commit, so the file grows on disk between size checks, and
    // the closer time to close the previous file (a roll waits for it: RetentionDeletes... below
    // has the busy closer).
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int i = 0; i < 2000; ++i) {
      const auto st = w->stats();
      if (st.files_closed + 1 >= st.files_opened && st.backlog == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  AnalysisResult result;
  result.meta = meta;
  ASSERT_TRUE(w->finish(&result, error)) << error;
  const auto st = w->stats();
  EXPECT_EQ(st.events_in, kBatches * kPer);
  EXPECT_EQ(st.events_written, kBatches * kPer);
  EXPECT_EQ(st.lost, 0u);
  EXPECT_EQ(st.files_deleted, 0u);

  const auto files = db_files(dir.path());
  ASSERT_GE(files.size(), 3u) << "expected several rolled files";
  EXPECT_EQ(st.files_opened, files.size());
  EXPECT_EQ(st.files_closed, files.size());
  // Each file alone: our reader, with its metadata; no side files left (all closed).
  std::set<uint64_t> seen;
  for (const auto& f : files) {
    EXPECT_EQ(fs::path(f).filename().string().rfind("ingero-", 0), 0u) << f;
    EXPECT_FALSE(fs::exists(f + "-wal")) << f;
    TraceMeta m;
    const auto ids = replay_ids(f, &m);
    EXPECT_TRUE(!ids.empty() || f == files.back()) << f;  // the last may be opened by the last roll
    EXPECT_EQ(m.process_names.at(1001), "trainer-1") << f;
    EXPECT_EQ(m.nodes.at(0), "node-a") << f;
    for (uint64_t id : ids) EXPECT_TRUE(seen.insert(id).second) << "id " << id << " in two files";
  }
  EXPECT_EQ(seen.size(), kBatches * kPer);
  // The directory as one trace: every event once, in time order.
  TraceMeta m;
  const auto ids = replay_ids(dir.path(), &m);
  ASSERT_EQ(ids.size(), kBatches * kPer);
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], i + 1);
  EXPECT_EQ(m.nodes.at(0), "node-a");
  EXPECT_EQ(m.process_names.at(1002), "trainer-2");
  EXPECT_TRUE(m.health.damage.empty());
  // A glob of the same files, and of only the newest two.
  EXPECT_EQ(replay_ids(dir.path() + "/ingero-*.db").size(), kBatches * kPer);
  const std::string two = files[files.size() - 2];
  EXPECT_GT(replay_ids(dir.path() + "/ingero-*.db").size(), replay_ids(two).size());

  // SQL over the set: the events table is every file's rows.
  ASSERT_LE(files.size(), 10u) << "SQLite attaches at most 10 files; make the files larger";
  auto q = SqlQueryRunner::open(dir.path(), error);
  ASSERT_TRUE(q) << error;
  const SqlResult r = q->run("SELECT count(*), count(DISTINCT id) FROM events", SqlLimits{});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.rows.at(0).at(0).integer, static_cast<int64_t>(kBatches * kPer));
  EXPECT_EQ(r.rows.at(0).at(1).integer, static_cast<int64_t>(kBatches * kPer));
  // Still read-only and guarded.
  EXPECT_FALSE(q->run("DELETE FROM events", SqlLimits{}).ok);
  EXPECT_FALSE(q->run("ATTACH '/tmp/x.db' AS x", SqlLimits{}).ok);
}

TEST(Rollover, RollsAtAge) {
  TempDir dir;
  RolloverOptions o = small_files(dir.path());
  o.file_bytes = 0;
  o.file_age_ns = 30'000'000;  // 30 ms
  std::string error;
  auto w = RollingWriter::start(o, error);
  ASSERT_TRUE(w) << error;
  const TraceMeta meta = make_meta();
  for (size_t b = 0; b < 8; ++b) {
    w->write_events(make_events(100, 1 + b * 100), meta);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  EXPECT_GE(db_files(dir.path()).size(), 4u);
  EXPECT_EQ(replay_ids(dir.path()).size(), 800u);
}

// Samples the directory's size (every file: databases, -wal, -shm, -journal) every millisecond
// while it lives; peak() is the largest total seen.
class DiskSampler {
 public:
  explicit DiskSampler(std::string dir)
      : dir_(std::move(dir)), t_([this] {
          while (!stop_.load()) {
            peak_ = std::max(peak_.load(), dir_bytes(dir_));
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  ~DiskSampler() { stop(); }
  uint64_t stop() {
    stop_.store(true);
    if (t_.joinable()) t_.join();
    return peak_.load();
  }

 private:
  std::string dir_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread t_;
};

TEST(Rollover, RetentionDeletesTheOldestAndKeepsTheNewestWithinTheBound) {
  TempDir dir;
  RolloverOptions o = small_files(dir.path());
  o.max_bytes = 12 << 20;  // ~2-3 closed files of 2 MiB (+ their indexes) beside the files in use
  std::string error;
  auto w = RollingWriter::start(o, error);
  ASSERT_TRUE(w) << error;
  const TraceMeta meta = make_meta();
  constexpr size_t kBatches = 150, kPer = 2000;  // ~30 MiB in all
  DiskSampler sampler(dir.path());
  for (size_t b = 0; b < kBatches; ++b) {
    w->write_events(make_events(kPer, 1 + b * kPer), meta);
    // Paced to the closer (a producer outrunning SQLite makes the writer shed events instead:
    // the next test).
    for (int i = 0; i < 2000; ++i) {
      const auto s = w->stats();
      if (s.files_closed + 1 >= s.files_opened && s.backlog == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_TRUE(w->finish(nullptr, error)) << error;
  const uint64_t peak = sampler.stop();
  const auto st = w->stats();
  EXPECT_GT(st.files_deleted, 0u);
  const auto files = db_files(dir.path());
  EXPECT_EQ(files.size() + st.files_deleted, st.files_opened);
  // Within the bound at all times, the files in use, their write-ahead logs and the index build
  // at close included (a file's growth at close is reserved before it happens).
  EXPECT_LE(peak, o.max_bytes) << "peak " << peak << ", " << st.rolls_deferred << " rolls deferred";
  EXPECT_LE(st.bytes_on_disk_peak, o.max_bytes);
  EXPECT_LE(dir_bytes(dir.path()), o.max_bytes);
  EXPECT_EQ(st.shed, 0u);
  // What is left is the newest data: the last event written is there, ids are contiguous up to it.
  const auto ids = replay_ids(dir.path());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), kBatches * kPer);
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_EQ(ids[i], ids[i - 1] + 1);
  EXPECT_GT(ids.front(), 1u);
}

// A producer faster than SQLite (no pacing): the bound still holds at every moment; what did not
// fit is shed and counted, never silently dropped, and the files left are whole.
TEST(Rollover, TheBoundHoldsWhenTheProducerOutrunsSqlite) {
  TempDir dir;
  RolloverOptions o = small_files(dir.path());
  o.max_bytes = 10 << 20;
  std::string error;
  auto w = RollingWriter::start(o, error);
  ASSERT_TRUE(w) << error;
  const TraceMeta meta = make_meta();
  constexpr size_t kBatches = 200, kPer = 2000;
  DiskSampler sampler(dir.path());
  for (size_t b = 0; b < kBatches; ++b) w->write_events(make_events(kPer, 1 + b * kPer), meta);
  w->finish(nullptr, error);  // false when anything was shed
  const uint64_t peak = sampler.stop();
  const auto st = w->stats();
  EXPECT_LE(peak, o.max_bytes) << "peak " << peak << ", shed " << st.shed;
  EXPECT_LE(st.bytes_on_disk_peak, o.max_bytes);
  EXPECT_EQ(st.events_in + st.shed, kBatches * kPer) << "every event offered is stored or counted shed";
  EXPECT_EQ(st.events_written + st.lost, kBatches * kPer);
  for (const auto& f : db_files(dir.path())) EXPECT_FALSE(replay_ids(f).empty()) << f;
}

TEST(Rollover, AnEmptyOrMissingSetIsAClearError) {
  TempDir dir;
  std::string error;
  EXPECT_FALSE(open_sqlite_trace(dir.path(), error, 1000));
  EXPECT_NE(error.find("is a directory with no trace files"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(open_sqlite_trace(dir.path() + "/nothing-*.db", error, 1000));
  EXPECT_NE(error.find("no trace files match"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(SqlQueryRunner::open(dir.path(), error));
  EXPECT_FALSE(error.empty());
}

// kill -9 of a process writing rolled files: each closed file is complete, and the open one (WAL,
// no indexes) reads as is and again after recover_trace_set().
TEST(Rollover, KillNineLeavesEveryFileReadable) {
  TempDir dir;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string error;
    RolloverOptions o = small_files(dir.path());
    o.file_bytes = 1 << 20;
    auto w = RollingWriter::start(o, error);
    if (!w) ::_exit(2);
    const TraceMeta meta = make_meta();
    for (uint64_t b = 0;; ++b) {
      w->write_events(make_events(1000, 1 + b * 1000), meta);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // Until five files exist, at most 20 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline && db_files(dir.path()).size() < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: status " << status;
  auto files = db_files(dir.path());
  ASSERT_GE(files.size(), 5u);
  // Files in progress at the kill: the open one and any the closer thread was still closing (a
  // WAL beside them, whose -shm may need a recovery that a read-only reader cannot run; or a
  // rollback journal, killed while its indexes were built), or one killed as it was being created
  // (0 bytes, nothing committed). Every other file is closed and reads as is.
  std::vector<std::string> in_progress;
  for (auto it = files.begin(); it != files.end();)
    if (fs::exists(*it + "-wal") || fs::exists(*it + "-journal") || fs::file_size(*it) == 0) {
      in_progress.push_back(*it);
      it = files.erase(it);
    } else {
      ++it;
    }
  ASSERT_FALSE(in_progress.empty());
  ASSERT_GE(files.size(), 2u) << "expected closed files before the kill";
  uint64_t total = 0;
  for (const auto& f : files) {
    const auto ids = replay_ids(f);
    EXPECT_FALSE(ids.empty()) << f;
    total += ids.size();
    // Each closed file holds a contiguous run of ids.
    for (size_t i = 1; i < ids.size(); ++i) ASSERT_EQ(ids[i], ids[i - 1] + 1) << f;
  }
  // The next writer on the directory (RollingWriter::start) recovers the open file: afterwards it
  // stands alone (no WAL) with every committed transaction, or is gone when it held none.
  std::vector<std::string> warnings;
  EXPECT_EQ(recover_trace_set(dir.path(), "ingero", warnings), in_progress.size());
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  uint64_t after = 0;
  for (const auto& f : files) after += replay_ids(f).size();
  EXPECT_EQ(after, total) << "recovery changed a closed file";
  uint64_t recovered = 0;
  for (const auto& f : in_progress) {
    EXPECT_FALSE(fs::exists(f + "-wal")) << f;
    EXPECT_FALSE(fs::exists(f + "-journal")) << f;
    if (!fs::exists(f)) continue;  // held nothing
    const auto ids = replay_ids(f);
    recovered += ids.size();
    for (size_t i = 1; i < ids.size(); ++i) ASSERT_EQ(ids[i], ids[i - 1] + 1);
  }
  // The set as one trace: every committed event once, ids strictly increasing (each file's
  // uncommitted tail, at most one transaction, may be missing).
  const auto ids = replay_ids(dir.path());
  EXPECT_EQ(ids.size(), total + recovered);
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_LT(ids[i - 1], ids[i]);
}

}  // namespace
}  // namespace ingero
