// `explain` on a stored trace with explicit step markers (ip_annotations, or Ingero's own
// annotations table): the real binary. The process with markers gets "annotated (step)", the other
// keeps its inferred steps; `explain --save` carries the markers; `trace --annotate-uid` alone is a
// usage error.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/run_command.h"
#include "tests/util/scratch_db.h"

namespace ingero {
namespace {

using test::capture;
using test::ScratchDir;

const std::string kBin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
constexpr uint64_t kMs = 1'000'000;

// Two processes stepping every 50 ms (launches, then a 20 ms stream sync).
std::string write_trace(const ScratchDir& dir) {
  std::vector<Event> ev;
  for (uint32_t pid : {500u, 600u})
    for (uint64_t i = 0; i < 40; ++i) {
      const uint64_t s = kT0 + i * 50 * kMs + pid;
      for (uint64_t l = 0; l < 10; ++l) {
        Event e;
        e.ts_ns = s + l * kMs;
        e.dur_ns = 5000;
        e.pid = e.tid = pid;
        e.source = Source::kCuda;
        e.op = op::kCudaLaunchKernel;
        ev.push_back(e);
      }
      Event sync;
      sync.ts_ns = s + 30 * kMs;
      sync.dur_ns = 20 * kMs - 1000;
      sync.pid = sync.tid = pid;
      sync.source = Source::kCuda;
      sync.op = op::kCudaStreamSync;
      ev.push_back(sync);
    }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  const std::string path = dir("trace.db");
  std::string error;
  auto sink = SqliteSink::create(path, error);
  EXPECT_TRUE(sink) << error;
  TraceMeta meta;
  meta.process_names = {{500u, "train.py"}, {600u, "other.py"}};
  EXPECT_TRUE(sink->write_meta(meta));
  EXPECT_TRUE(sink->write_events(ev));
  EXPECT_TRUE(sink->close(error)) << error;
  return path;
}

nlohmann::json steps_of(const std::string& db) {
  int rc = -1;
  const std::string out = capture(kBin + " explain --json --db " + db, &rc);
  EXPECT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j.is_object() && j.contains("steps") ? j["steps"] : nlohmann::json::array();
}

const nlohmann::json* entry(const nlohmann::json& steps, uint32_t pid) {
  for (const auto& s : steps)
    if (s["pid"] == pid) return &s;
  return nullptr;
}

TEST(CliAnnotate, ExplainUsesStoredMarkersAndSaveCarriesThem) {
  ScratchDir dir("ip_cli_annotate");
  const std::string db = write_trace(dir);
  // Without markers both processes are inferred at 50 ms.
  auto steps = steps_of(db);
  ASSERT_NE(entry(steps, 500), nullptr) << steps.dump(2);
  EXPECT_EQ((*entry(steps, 500))["method"], "cudaStreamSynchronize x1");
  // pid 500 says its steps are every 100 ms (two syncs each), as Lightning would with
  // accumulate_grad_batches=2: the markers win.
  std::vector<Annotation> rows;
  for (uint64_t i = 0; i < 40; ++i) {
    Annotation a;
    a.ts_ns = kT0 + i * 50 * kMs + 500;
    a.pid = 500;
    a.labels = {{"step", std::to_string(i / 2)}, {"epoch", "0"}};
    rows.push_back(a);
  }
  std::string error;
  ASSERT_TRUE(write_annotations(db, rows, {""}, error)) << error;
  steps = steps_of(db);
  const auto* a = entry(steps, 500);
  const auto* b = entry(steps, 600);
  ASSERT_TRUE(a && b) << steps.dump(2);
  EXPECT_EQ((*a)["method"], "annotated (step)");
  EXPECT_EQ((*a)["confidence"], 1.0);
  EXPECT_EQ((*a)["count"], 19);
  EXPECT_EQ((*a)["period_ns"], 100 * kMs);
  EXPECT_EQ((*a)["epochs"], 1);
  EXPECT_EQ((*b)["method"], "cudaStreamSynchronize x1");
  EXPECT_NEAR((*b)["period_ns"].get<double>(), 50.0 * kMs, 0.5 * kMs);
  // The text says so too.
  int rc = -1;
  const std::string text = capture(kBin + " explain --db " + db, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("pid 500 (train.py): 19 steps, period 100.0 ms (p50 100.0 ms, p99 100.0 ms), recognised by "
                      "annotated (step), confidence 1.00"),
            std::string::npos)
      << text;
  // --save keeps them: the saved trace explains the same.
  const std::string saved = dir("saved.db");
  capture(kBin + " explain --db " + db + " --save " + saved + " > /dev/null", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(test::query_int(saved, "SELECT count(*) FROM ip_annotations"), 40);
  steps = steps_of(saved);
  ASSERT_NE(entry(steps, 500), nullptr);
  EXPECT_EQ((*entry(steps, 500))["method"], "annotated (step)");
}

TEST(CliAnnotate, ExplainReadsIngerosOwnAnnotationsTable) {
  ScratchDir dir("ip_cli_annotate");
  const std::string db = write_trace(dir);
  // What Ingero's agent (v0.17, trace --record --annotate) stores for its Lightning callback.
  std::string sql =
      "CREATE TABLE annotations (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp INTEGER NOT NULL, labels TEXT NOT "
      "NULL, pid INTEGER NOT NULL DEFAULT 0, start_time INTEGER NOT NULL DEFAULT 0, span_start INTEGER NOT NULL "
      "DEFAULT "
      "0, span_end INTEGER NOT NULL DEFAULT 0, peer_uid INTEGER NOT NULL DEFAULT 0, peer_gid INTEGER NOT NULL DEFAULT "
      "0, peer_pid INTEGER NOT NULL DEFAULT 0); INSERT INTO annotations(timestamp, labels, pid) VALUES ";
  for (uint64_t i = 0; i < 10; ++i)
    sql += std::string(i ? "," : "") + "(" + std::to_string(kT0 + i * 200 * kMs) + ", '{\"step\":\"" +
           std::to_string(i) + "\"}', 600)";
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_close(h);
  ASSERT_EQ(rc, SQLITE_OK) << (err ? err : "");
  const auto steps = steps_of(db);
  const auto* b = entry(steps, 600);
  ASSERT_NE(b, nullptr) << steps.dump(2);
  EXPECT_EQ((*b)["method"], "annotated (step)");
  EXPECT_EQ((*b)["period_ns"], 200 * kMs);
  EXPECT_EQ((*entry(steps, 500))["method"], "cudaStreamSynchronize x1");
}

TEST(CliAnnotate, AnnotateUidNeedsAnnotate) {
  const auto r = test::run_command(kBin + " trace --annotate-uid 1000 --duration 1s");
  if (r.err.find("built without eBPF") != std::string::npos) GTEST_SKIP() << "no eBPF in this build";
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--annotate-uid needs --annotate"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ingero
