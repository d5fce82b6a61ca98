// `ingero-pipeline export --format perfetto`: the real binary on a demo trace written to SQLite and
// LMDB (chains with exemplars, so flow arrows exist), on the shared multi-node Ingero traces, and
// on bad input: a clear message, a non-zero exit, and never a file left at the output path.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "sinks/store/sqlite_store.h"
#include "tests/util/run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using CliRun = ingero::test::CommandRun;

CliRun run(const std::string& args) {
  return ingero::test::run_command(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args);
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

int64_t count_rows(const std::string& db_path) {
  sqlite3* db = nullptr;
  int64_t n = -1;
  const std::string uri = "file:" + db_path + "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM events", -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
      n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return n;
}

// No file at `out`, and no temporary file next to it.
void expect_no_output(const std::string& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  const fs::path dir = fs::path(out).parent_path();
  if (!fs::exists(dir)) return;
  for (const auto& f : fs::directory_iterator(dir))
    EXPECT_EQ(f.path().filename().string().rfind(fs::path(out).filename().string() + ".partial", 0), std::string::npos)
        << f.path();
}

class ExportCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ip-export-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const CliRun a = run("demo cpu_contention --save " + (dir_ / "cpu.db").string());
    const CliRun b = run("demo cpu_contention --save " + (dir_ / "cpu.lmdb").string());
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string p(const std::string& name) { return (dir_ / name).string(); }
  static fs::path dir_;
};
fs::path ExportCli::dir_;

// Checks one exported demo trace: every event once, one chain per reported chain, arrows between
// the chain slice and existing events.
void check_demo_export(const json& doc, int64_t events_in_db) {
  std::set<uint64_t> ids;
  std::map<std::tuple<int64_t, int64_t, double>, int> slice_at;
  size_t chains = 0, events = 0;
  std::map<uint64_t, json> s, f;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X" && e["cat"] == "chain") {
      ++chains;
    } else if (ph == "X" || ph == "i") {
      ++events;
      ids.insert(e["args"]["id"].get<uint64_t>());
      slice_at[{e["pid"], e["tid"], e["ts"].get<double>()}]++;
    } else if (ph == "s") {
      s[e["id"]] = e;
    } else if (ph == "f") {
      f[e["id"]] = e;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(events), events_in_db);
  EXPECT_EQ(ids.size(), events);  // ids unique: every event exactly once
  EXPECT_GE(chains, 1u);
  EXPECT_GE(s.size(), 1u);
  EXPECT_EQ(s.size(), f.size());
  for (const auto& [id, end] : f) {
    EXPECT_TRUE(s.count(id));
    EXPECT_TRUE(slice_at.count({end["pid"], end["tid"], end["ts"].get<double>()})) << end.dump();
  }
}

TEST_F(ExportCli, SqliteAndLmdbTracesWithChainsAndFlows) {
  const int64_t rows = count_rows(p("cpu.db"));
  ASSERT_GT(rows, 1000);
  CliRun r = run("export --format perfetto --db " + p("cpu.db") + " -o " + p("cpu.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("ui.perfetto.dev"), std::string::npos) << r.err;
  const json a = json::parse(slurp(p("cpu.json")));
  check_demo_export(a, rows);
  r = run("export --db " + p("cpu.lmdb") + " -o " + p("cpu-lmdb.json.gz") + " -q");
  ASSERT_EQ(r.status, 0) << r.err;
  gzFile gz = gzopen(p("cpu-lmdb.json.gz").c_str(), "rb");
  ASSERT_TRUE(gz);
  std::string text;
  char buf[65536];
  int n;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  gzclose(gz);
  const json b = json::parse(text);
  check_demo_export(b, rows);
  EXPECT_EQ(a["traceEvents"].size(), b["traceEvents"].size());
}

// Next to the events: a "time ..." counter track per main GPU-feeding thread, second by second,
// whose preempted and in-call time add up to what `explain --json` accounts for the thread; the
// chain slices carry their thread's accounting; a pid filter drops the tracks of other processes.
TEST_F(ExportCli, AccountingCounterTracksPerFeedingThread) {
  const CliRun r = run("export --db " + p("cpu.db") + " -o " + p("acct.json") + " -q");
  ASSERT_EQ(r.status, 0) << r.err;
  const CliRun ex = run("explain --db " + p("cpu.db") + " --json");
  ASSERT_EQ(ex.status, 0) << ex.err;
  const json explained = json::parse(ex.out);
  ASSERT_FALSE(explained["accounting"].empty());
  const json& want = explained["accounting"][0];
  ASSERT_EQ(want["tid"], 4242);
  const json doc = json::parse(slurp(p("acct.json")));
  const std::string name = "time python3 train.py [tid 4242] (ms/s)";
  double preempted_ms = 0, in_calls_ms = 0;
  size_t samples = 0, chains_with_accounting = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "chain" && e["args"].contains("accounting")) {
      ++chains_with_accounting;
      EXPECT_EQ(e["args"]["accounting"]["tid"], 4242);
    }
    if (e["ph"] != "C" || e["name"] != name) continue;
    ++samples;
    EXPECT_EQ(e["pid"], 4242);
    double second = 0;
    for (const auto& [k, v] : e["args"].items()) second += v.get<double>();
    EXPECT_LE(second, 1000.001) << e.dump();
    preempted_ms += e["args"]["preempted"].get<double>();
    in_calls_ms += e["args"]["in calls"].get<double>();
  }
  EXPECT_GE(samples, 30u);  // a 30 s trace, one sample a second, then a zero
  EXPECT_GE(chains_with_accounting, 1u);
  uint64_t in_calls_ns = 0;
  for (const auto& [k, v] : want["in_calls_ns"].items()) in_calls_ns += v.get<uint64_t>();
  EXPECT_GT(want["preempted_ns"].get<uint64_t>(), 0u);
  EXPECT_NEAR(preempted_ms * 1e6, want["preempted_ns"].get<double>(), 1e-4 * want["preempted_ns"].get<double>());
  EXPECT_NEAR(in_calls_ms * 1e6, static_cast<double>(in_calls_ns), 1e-4 * static_cast<double>(in_calls_ns));
  const CliRun other = run("export --db " + p("cpu.db") + " -o " + p("acct-other.json") + " -q --pid 31337");
  if (other.status == 0) {  // the hog has no event of its own in the demo: then nothing is exported
    for (const auto& e : json::parse(slurp(p("acct-other.json")))["traceEvents"]) EXPECT_NE(e.value("name", ""), name);
  }
}

TEST_F(ExportCli, FiltersNarrowTheOutput) {
  const CliRun all = run("export --db " + p("cpu.db") + " -o " + p("all.json") + " -q");
  ASSERT_EQ(all.status, 0) << all.err;
  const CliRun some = run("export --db " + p("cpu.db") + " -o " + p("some.json") +
                          " -q --from 5s --to 15s --op cudaLaunchKernel");
  ASSERT_EQ(some.status, 0) << some.err;
  const json a = json::parse(slurp(p("all.json"))), b = json::parse(slurp(p("some.json")));
  const uint64_t base = b["metadata"]["ts_base_unix_ns"];
  double first = 1e300;
  for (const auto& e : a["traceEvents"])
    if (e["ph"] == "X" || e["ph"] == "i") first = std::min(first, e["ts"].get<double>());
  size_t kept = 0;
  for (const auto& e : b["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] == "chain") continue;
    ++kept;
    EXPECT_EQ(e["name"], "cudaLaunchKernel");
    EXPECT_GE(e["ts"].get<double>(), first + 5e6 - 1);
    EXPECT_LT(e["ts"].get<double>(), first + 15e6);
  }
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, a["traceEvents"].size());
  EXPECT_EQ(base, a["metadata"]["ts_base_unix_ns"].get<uint64_t>());
}

TEST_F(ExportCli, RunConfigPerfettoSink) {
  {
    std::ofstream cfg(p("run.yaml"));
    cfg << "version: 1\nsources:\n  - name: demo\n    type: sqlite\n    path: cpu.db\n"
           "sinks:\n  - name: timeline\n    type: perfetto\n    path: run.json\n    from: [demo, analysis]\n";
  }
  const CliRun r = run("run --config " + p("run.yaml"));
  ASSERT_EQ(r.status, 0) << r.err;
  // The same events and chain arrows as `export` (flows resolved by re-reading the source).
  check_demo_export(json::parse(slurp(p("run.json"))), count_rows(p("cpu.db")));
}

TEST_F(ExportCli, EmptyTraceGivesValidEmptyTimeline) {
  std::string error;
  {
    auto sink = ingero::SqliteSink::create(p("empty.db"), error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_meta(ingero::TraceMeta{}));
    ASSERT_TRUE(sink->close(error)) << error;
  }
  const CliRun r = run("export --db " + p("empty.db") + " -o " + p("empty.json") + " -q");
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(slurp(p("empty.json")));
  EXPECT_TRUE(doc["traceEvents"].empty()) << doc.dump();
}

// The chains drawn follow the same analysis as `explain`, --param included: on the embedded
// DataLoader sample the pack's 10 s warm-up reports some chains as "warm-up:"; `--param
// warmup=0s` judges every call as steady state, so none is. Bad overrides are refused up front.
TEST_F(ExportCli, ParamOverridesReachTheChainAnnotator) {
  auto warm_chains = [](const json& doc) {
    size_t n = 0;
    for (const auto& e : doc["traceEvents"])
      if (e["ph"] == "X" && e["cat"] == "chain" && e["args"].value("summary", "").rfind("warm-up:", 0) == 0) ++n;
    return n;
  };
  CliRun r = run("export -o " + p("warm.json") + " -q");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GT(warm_chains(json::parse(slurp(p("warm.json")))), 0u);
  r = run("export -o " + p("steady.json") + " -q --param warmup=0s");
  ASSERT_EQ(r.status, 0) << r.err;
  const json steady = json::parse(slurp(p("steady.json")));
  EXPECT_EQ(warm_chains(steady), 0u);
  size_t chains = 0;
  for (const auto& e : steady["traceEvents"]) chains += e["ph"] == "X" && e["cat"] == "chain";
  EXPECT_GT(chains, 0u);

  r = run("export -o " + p("bad.json") + " --param warmup");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("NAME=VALUE"), std::string::npos) << r.err;
  expect_no_output(p("bad.json"));
  r = run("export -o " + p("bad.json") + " --param no_such_param=1");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("no_such_param"), std::string::npos) << r.err;
  expect_no_output(p("bad.json"));
  r = run("export -o " + p("bad.json") + " --no-chains --param warmup=0s");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--no-chains"), std::string::npos) << r.err;
}

TEST_F(ExportCli, MissingDatabase) {
  const CliRun r = run("export --db " + p("nope.db") + " -o " + p("x.json"));
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("nope.db"), std::string::npos) << r.err;
  expect_no_output(p("x.json"));
}

TEST_F(ExportCli, UnwritableOutput) {
  const CliRun r = run("export --db " + p("cpu.db") + " -o /nonexistent-dir/x.json");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("cannot create"), std::string::npos) << r.err;
}

TEST_F(ExportCli, FilterMatchingNothing) {
  const CliRun r = run("export --db " + p("cpu.db") + " -o " + p("none.json") + " --pid 999999");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("no event matches --pid 999999"), std::string::npos) << r.err;
  expect_no_output(p("none.json"));
  const CliRun op = run("export --db " + p("cpu.db") + " -o " + p("none.json") + " --op cudaNoSuchThing");
  EXPECT_EQ(op.status, 2);
  EXPECT_NE(op.err.find("unknown operation"), std::string::npos) << op.err;
}

TEST_F(ExportCli, TooLargeForTheViewersSaysWhatWouldFit) {
  const CliRun r = run("export --db " + p("cpu.db") + " -o " + p("big.json") + " --max-size 1MiB");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("more than --max-size 1MiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this would fit: --from "), std::string::npos) << r.err;
  expect_no_output(p("big.json"));
  // The suggested range does fit.
  const auto at = r.err.find("this would fit: ");
  const std::string rest = r.err.substr(at + 16);
  const std::string range = rest.substr(0, rest.find(" ("));
  const CliRun fits = run("export --db " + p("cpu.db") + " -o " + p("fits.json") + " --max-size 1MiB -q " + range);
  EXPECT_EQ(fits.status, 0) << range << "\n" << fits.err;
  EXPECT_LE(fs::file_size(p("fits.json")), 1u << 20);
}

TEST_F(ExportCli, MergedMultiNodeTraces) {
  const std::string a = std::string(INGERO_SHARED_DATA) + "/sample-gpu-node-01.db";
  const std::string b = std::string(INGERO_SHARED_DATA) + "/sample-gpu-node-02.db";
  if (!fs::exists(a) || !fs::exists(b)) GTEST_SKIP() << "shared Ingero samples not found under " << INGERO_SHARED_DATA;
  const auto size_a = fs::file_size(a), size_b = fs::file_size(b);
  const CliRun r = run("export --db " + a + " --db " + b + " -o " + p("merged.json") + " -q");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(fs::file_size(a), size_a);
  EXPECT_EQ(fs::file_size(b), size_b);
  const json doc = json::parse(slurp(p("merged.json")));
  std::map<int64_t, std::string> labels;
  std::map<std::string, size_t> events_by_label;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_labels") labels[e["pid"]] = e["args"]["labels"];
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["cat"] != "chain") events_by_label[labels.count(e["pid"]) ? labels[e["pid"]] : "?"]++;
  EXPECT_EQ(events_by_label.size(), 2u);
  EXPECT_EQ(events_by_label["gpu-node-01"], static_cast<size_t>(count_rows(a)));
  EXPECT_EQ(events_by_label["gpu-node-02"], static_cast<size_t>(count_rows(b)));
}

}  // namespace
