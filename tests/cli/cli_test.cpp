#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/util/run_command.h"
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using Run = ingero::test::CommandRun;

Run run(const std::string& args) {
  return ingero::test::run_command(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args);
}

const std::string kSample = std::string(INGERO_SHARED_DATA) + "/pytorch-dataloader-starvation.db";

TEST(Cli, HelpTeaches) {
  const auto r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* cmd : {"stats", "explain", "query"}) EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
  const auto s = run("stats --help");
  EXPECT_EQ(s.status, 0);
  EXPECT_NE(s.out.find("nearest-rank"), std::string::npos);
  EXPECT_NE(s.out.find("Examples"), std::string::npos);
}

TEST(Cli, MissingFileIsAnInputErrorNamingTheFile) {
  const auto r = run("stats --db /nonexistent/trace.db");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("/nonexistent/trace.db"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, NotADatabaseIsAnInputError) {
  const auto path = std::filesystem::temp_directory_path() / "ip-cli-not-a-db.txt";
  std::ofstream(path) << "hello, this is not sqlite\n";
  const auto r = run("explain --db " + path.string());
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find(path.string()), std::string::npos) << r.err;
  std::filesystem::remove(path);
}

TEST(Cli, BadArgumentsAreUsageErrors) {
  EXPECT_EQ(run("stats --threads 257").status, 2);
  EXPECT_EQ(run("stats --threads 0").status, 0);  // 0: the automatic count (docs/cli.md)
  EXPECT_EQ(run("no-such-command").status, 2);
}

TEST(Cli, StatsJsonShape) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto r = run("stats --json --db " + kSample);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["ops"].is_array());
  bool launch = false;
  for (const auto& op : j["ops"]) {
    for (const char* k : {"source", "op", "count", "p50_ns", "p95_ns", "p99_ns", "max_ns", "total_ns"})
      ASSERT_TRUE(op.contains(k)) << k;
    if (op["op"] == "cudaLaunchKernel") {
      launch = true;
      EXPECT_EQ(op["count"], 16);
      EXPECT_EQ(op["p50_ns"], 73194);
      EXPECT_EQ(op["p99_ns"], 25799899);
    }
  }
  EXPECT_TRUE(launch);
  EXPECT_EQ(j["trace"]["events"], 3807);
}

TEST(Cli, ExplainJsonShape) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto r = run("explain --json --db " + kSample);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["chains"].is_array());
  ASSERT_FALSE(j["chains"].empty());
  for (const auto& c : j["chains"]) {
    for (const char* k : {"id", "rule", "severity", "category", "op", "pid", "tid", "summary", "root_cause",
                          "recommendations", "evidence"})
      ASSERT_TRUE(c.contains(k)) << k;
    const std::string sev = c["severity"];
    EXPECT_TRUE(sev == "HIGH" || sev == "MEDIUM" || sev == "LOW") << sev;
    EXPECT_NE(c["category"], "cpu_contention") << "no slow call of this trace overlaps off-CPU time of its thread";
  }
  EXPECT_TRUE(j["rules"].is_array());
}

// The verdict first (issue 41): the text report opens with it, the JSON has it and the incidents
// with their cost at the price given; a malformed rates file is refused naming file and line.
TEST(Cli, ExplainOpensWithTheVerdictAndPricesIncidents) {
  const auto dir = std::filesystem::temp_directory_path() / ("ip-cli-verdict-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "cpu.db").string();
  ASSERT_EQ(run("demo cpu_contention --save " + db).status, 0);
  const auto text = run("explain --db " + db + " --gpus 4 --gpu-hour-price 3");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.out.rfind("Verdict: ", 0), 0u) << text.out.substr(0, 400);
  const auto js = run("explain --json --db " + db + " --gpus 4 --gpu-hour-price 3");
  ASSERT_EQ(js.status, 0) << js.err;
  const auto j = nlohmann::json::parse(js.out);
  ASSERT_TRUE(j["verdict"].is_string());
  EXPECT_FALSE(j["verdict"].get<std::string>().empty());
  EXPECT_EQ(text.out.find(j["verdict"].get<std::string>().substr(0, 40)), 9u);
  ASSERT_TRUE(j["incidents"].is_array());
  ASSERT_FALSE(j["incidents"].empty()) << js.out.substr(0, 2000);
  uint64_t prev = UINT64_MAX;
  for (const auto& in : j["incidents"]) {
    for (const char* k : {"id", "rule", "category", "severity", "pid", "tid", "node", "rank", "start_ns", "end_ns",
                          "steps", "lost_ns", "lost_share", "gpu_hours", "cost", "what_if_step_ns", "chains"})
      ASSERT_TRUE(in.contains(k)) << k;
    const auto lost = in["lost_ns"].get<uint64_t>();
    EXPECT_LE(lost, prev) << "most time lost first";
    prev = lost;
    if (in["gpus_from"] != "trace") {
      EXPECT_EQ(in["gpus"], 4.0);
    }
    EXPECT_NEAR(in["gpu_hours"].get<double>(), static_cast<double>(lost) / 3.6e12 * in["gpus"].get<double>(), 1e-12);
    EXPECT_NEAR(in["cost"].get<double>(), in["gpu_hours"].get<double>() * 3, 1e-12);
  }
  // The demo's CPU hog: a contention incident on its feeding thread comes first.
  EXPECT_EQ(j["incidents"][0]["category"], "cpu_contention") << js.out.substr(0, 2000);
  std::ofstream(dir / "rates.txt") << "node-a 2\nnode-b two\n";
  const auto bad = run("explain --db " + db + " --rates " + (dir / "rates.txt").string());
  EXPECT_EQ(bad.status, 3);
  EXPECT_NE(bad.err.find("rates.txt:2:"), std::string::npos) << bad.err;
  std::filesystem::remove_all(dir);
}

TEST(Cli, EmbeddedSampleRunsWithNoFiles) {
  const auto r = run("explain");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("embedded sample"), std::string::npos);
  EXPECT_NE(r.out.find("unexplained_tail"), std::string::npos) << r.out;
}

TEST(Cli, WhyNotNamesThePredicateOrRejectsUnknownRules) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto r = run("explain --db " + kSample + " --why-not cpu_contention");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("closest miss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("offcpu.share"), std::string::npos) << r.out;
  const auto bad = run("explain --db " + kSample + " --why-not no_such_rule");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("cpu_contention"), std::string::npos) << "the error lists the rules";
}

// A trend rule that never had enough consecutive windows says so, not "0 vs 0 (short by -0)".
TEST(Cli, WhyNotOfAnUnjudgedTrendSaysHowManyWindowsItHad) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto r = run("explain --db " + kSample + " --why-not throughput_drop");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("too few consecutive windows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 needed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("short by -0"), std::string::npos) << r.out;
}

TEST(Cli, SaveWritesAnIngeroReadableDatabase) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto out = std::filesystem::temp_directory_path() / ("ip-cli-save-" + std::to_string(getpid()) + ".db");
  const auto r = run("explain --db " + kSample + " --save " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  // Replaying what was saved gives the same statistics.
  const auto a = nlohmann::json::parse(run("stats --json --db " + kSample).out);
  const auto b = nlohmann::json::parse(run("stats --json --db " + out.string()).out);
  EXPECT_EQ(a["ops"], b["ops"]);
  std::filesystem::remove(out);
  std::filesystem::remove(out.string() + "-wal");
  std::filesystem::remove(out.string() + "-shm");
}

// bench: end-to-end, load and run phases for the pack, each rule replayed from the in-memory
// trace (not reloaded), and the fields docs/cli.md documents.
TEST(Cli, BenchReportsPhasesAndReplaysRulesFromMemory) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto r = run("bench --json --trace " + kSample);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["events"], 3807);
  EXPECT_EQ(j["mode"], "preloaded");
  EXPECT_EQ(j["chains_match"], true);
  for (const char* phase : {"end_to_end", "load", "run"}) {
    ASSERT_TRUE(j["phases"].contains(phase)) << phase;
    const auto& p = j["phases"][phase];
    for (const char* k : {"seconds", "cpu_seconds", "system_cpu_seconds", "minor_page_faults", "events", "events_per_s",
                          "events_per_cpu_s", "peak_rss_bytes"})
      ASSERT_TRUE(p.contains(k)) << phase << "." << k;
    EXPECT_EQ(p["events"], 3807) << phase;
    EXPECT_LE(p["system_cpu_seconds"].get<double>(), p["cpu_seconds"].get<double>() + 1e-6) << phase;
    EXPECT_GT(p["peak_rss_bytes"].get<uint64_t>(), 0u) << phase;
  }
  // 80 bytes per event at least, held in memory for the per-rule runs.
  EXPECT_GE(j["loaded_bytes"].get<uint64_t>(), 3807u * 80u);
  EXPECT_GT(j["rss_after_load_bytes"].get<uint64_t>(), 0u);
  // The compatibility fields are the in-memory run.
  EXPECT_EQ(j["run_seconds"], j["phases"]["run"]["seconds"]);
  EXPECT_EQ(j["end_to_end_seconds"], j["phases"]["end_to_end"]["seconds"]);
  ASSERT_TRUE(j["per_rule"].is_array());
  ASSERT_FALSE(j["per_rule"].empty());
  size_t chains = 0;
  for (const auto& pr : j["per_rule"]) {
    EXPECT_EQ(pr["source"], "memory") << pr["rule"];
    EXPECT_FALSE(pr.contains("end_to_end")) << "streamed per rule only with --per-rule-end-to-end";
    chains += pr["chains"].get<size_t>();
  }
  EXPECT_GT(chains, 0u);
  EXPECT_GT(j["chains"].get<size_t>(), 0u);

  const auto t = run("bench --trace " + kSample + " --no-per-rule");
  ASSERT_EQ(t.status, 0) << t.err;
  for (const char* row : {"end-to-end (stream)", "load (into memory)", "run (from memory)", "peak RSS", "preloaded"})
    EXPECT_NE(t.out.find(row), std::string::npos) << row << "\n" << t.out;
}

TEST(Cli, BenchStreamsWhenAskedOrOverItsMemoryCap) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto s = nlohmann::json::parse(run("bench --json --no-preload --trace " + kSample).out);
  EXPECT_EQ(s["mode"], "streamed");
  EXPECT_FALSE(s["phases"].contains("load"));
  EXPECT_FALSE(s["phases"].contains("run"));
  for (const auto& pr : s["per_rule"]) {
    EXPECT_EQ(pr["source"], "file");
    EXPECT_FALSE(pr.contains("end_to_end")) << "a streamed rule's run is its end-to-end";
  }
  // 200,000 synthetic events are ~16 MB decoded: over a 1 MiB cap, bench falls back to streaming.
  const auto c = run("bench --json --no-per-rule --synthetic 200000 --max-preload-mb 1");
  ASSERT_EQ(c.status, 0) << c.err;
  const auto j = nlohmann::json::parse(c.out);
  EXPECT_EQ(j["mode"], "streamed");
  EXPECT_NE(j["fallback_reason"].get<std::string>().find("--max-preload-mb"), std::string::npos) << j.dump();
  EXPECT_EQ(j["events"], 200000);
  EXPECT_FALSE(j["phases"].contains("load")) << "an abandoned load is not reported as a phase";
  // Both ways per rule when asked.
  const auto e = nlohmann::json::parse(run("bench --json --per-rule-end-to-end --trace " + kSample).out);
  for (const auto& pr : e["per_rule"]) {
    EXPECT_EQ(pr["source"], "memory");
    ASSERT_TRUE(pr.contains("end_to_end")) << pr.dump();
    EXPECT_EQ(pr["end_to_end"]["events"], 3807);
  }
}

// bench --scaling: rounds of one thread, the engine at --threads N, N copies of the one-thread
// run at once and N runs over alternate batches, each run's events counted (a run that read
// nothing would look fast), the ratios derived from the times, and a clear refusal without
// --threads 2 or more.
TEST(Cli, BenchScalingSetsTheEngineAgainstTheMachine) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  // Batches of 64 events: both slices get some of the trace's 3807.
  const auto r = run("bench --json --no-per-rule --threads 2 --scaling 2 --batch 64 --trace " + kSample);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("scaling")) << r.out;
  const auto& sc = j["scaling"];
  EXPECT_EQ(sc["threads"], 2);
  ASSERT_EQ(sc["rounds"].size(), 2u);
  std::vector<double> speedups;
  for (const auto& round : sc["rounds"]) {
    EXPECT_EQ(round["one_thread"]["events"], 3807);
    EXPECT_EQ(round["engine"]["events"], 3807);
    ASSERT_EQ(round["copies"].size(), 2u);
    for (const auto& c : round["copies"]) EXPECT_EQ(c["events"], 3807) << "each copy runs the whole trace";
    ASSERT_EQ(round["slices"].size(), 2u);
    uint64_t sliced = 0;
    for (const auto& x : round["slices"]) {
      EXPECT_GT(x["events"].get<uint64_t>(), 0u);
      sliced += x["events"].get<uint64_t>();
    }
    EXPECT_EQ(sliced, 3807u) << "the slices share the trace out between them";
    const double one = round["one_thread"]["seconds"], engine = round["engine"]["seconds"];
    const double copies = round["copies_wall_seconds"], slices = round["slices_wall_seconds"];
    ASSERT_GT(one, 0);
    ASSERT_GT(engine, 0);
    ASSERT_GT(copies, 0);
    ASSERT_GT(slices, 0);
    for (const auto& c : round["copies"]) EXPECT_LE(c["seconds"].get<double>(), copies + 1e-9);
    EXPECT_NEAR(round["speedup"].get<double>(), one / engine, 1e-9);
    EXPECT_NEAR(round["capacity"].get<double>(), 2 * one / copies, 1e-9);
    EXPECT_NEAR(round["time_split_bound"].get<double>(), one / slices, 1e-9);
    EXPECT_NEAR(round["efficiency"].get<double>(), (one / engine) / (2 * one / copies), 1e-9);
    speedups.push_back(one / engine);
  }
  std::sort(speedups.begin(), speedups.end());
  EXPECT_NEAR(sc["median"]["speedup"].get<double>(), (speedups[0] + speedups[1]) / 2, 1e-9);

  const auto t = run("bench --no-per-rule --threads 2 --scaling 1 --trace " + kSample);
  ASSERT_EQ(t.status, 0) << t.err;
  for (const char* text : {"scaling", "capacity", "time split bound", "median"})
    EXPECT_NE(t.out.find(text), std::string::npos) << text << "\n" << t.out;

  const auto one = run("bench --no-per-rule --scaling 2 --trace " + kSample);
  EXPECT_NE(one.status, 0);
  EXPECT_NE(one.err.find("--threads 2"), std::string::npos) << one.err;
}

// --quiet is accepted by the long commands and leaves their results alone (the progress line it
// suppresses is only drawn on a terminal, so it is checked by hand: docs/cli.md).
TEST(Cli, QuietIsAcceptedByLongCommands) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto a = run("stats --json --db " + kSample);
  const auto b = run("stats --json --quiet --db " + kSample);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out), nlohmann::json::parse(b.out));
  const auto e = run("explain --json -q --db " + kSample);
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_FALSE(nlohmann::json::parse(e.out)["chains"].empty());
  EXPECT_EQ(run("bench --quiet --no-per-rule --trace " + kSample).status, 0);
  const auto out = std::filesystem::temp_directory_path() / ("ip-cli-quiet-" + std::to_string(getpid()) + ".lmdb");
  const auto loud = run("convert " + kSample + " " + out.string());
  ASSERT_EQ(loud.status, 0) << loud.err;
  EXPECT_FALSE(loud.out.empty() && loud.err.empty()) << "convert prints a summary without --quiet";
  std::filesystem::remove_all(out);
  const auto quiet = run("convert --quiet " + kSample + " " + out.string());
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_TRUE(quiet.out.empty()) << quiet.out;
  EXPECT_TRUE(quiet.err.empty()) << quiet.err;
  std::filesystem::remove_all(out);
  // LMDB keeps its lock table in a file beside the store (MDB_NOSUBDIR): remove it too, so that
  // the suite leaves nothing in the temporary directory.
  std::filesystem::remove(out.string() + "-lock");
}

// query: an endless statement or a huge string stops with an error naming the file and the
// limit (exit status 2), never by running out of memory.
TEST(Cli, QueryLimitsNameTheFileAndTheLimit) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << "missing " << kSample;
  const auto t = run("query --db " + kSample +
                     " --timeout-ms 200 "
                     "\"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c\"");
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find(kSample), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("200 ms"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("timeout"), std::string::npos) << t.err;
  const auto s = run(
      "query --db " + kSample +
      " --max-value-bytes 100000 "
      "\"WITH RECURSIVE c(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM c) SELECT max(length(s)) FROM c\"");
  EXPECT_EQ(s.status, 2);
  EXPECT_NE(s.err.find(kSample), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("100000 bytes"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("too_big"), std::string::npos) << s.err;
  const auto m = run("query --db " + kSample +
                     " --max-memory-mb 4 --timeout-ms 60000 "
                     "\"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000000) "
                     "SELECT count(DISTINCT randomblob(100)) FROM c\"");
  EXPECT_EQ(m.status, 2);
  EXPECT_NE(m.err.find(kSample), std::string::npos) << m.err;
  EXPECT_NE(m.err.find("4 MiB"), std::string::npos) << m.err;
  // Rows of an endless CTE stop at --max-rows with a note.
  const auto r = run("query --db " + kSample +
                     " --json --max-rows 50 "
                     "\"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c\"");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["row_count"], 50);
  EXPECT_EQ(j["truncated"], true);
}

}  // namespace
