#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Run {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

Run run(const std::string& args) {
  const std::string bin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
  const auto err_path = std::filesystem::temp_directory_path() / ("ip-cli-" + std::to_string(getpid()) + ".err");
  const std::string cmd = bin + " " + args + " 2>" + err_path.string();
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_path);
  return r;
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
  EXPECT_EQ(run("stats --threads 0").status, 2);
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

}  // namespace
