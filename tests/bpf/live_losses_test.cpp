// Issue 43, item 4: a finding made of lost data. One thread calls cudaLaunchKernel in a tight
// loop (it never pauses) while the tracer is made to lose events: a 1 MiB ring, and the tracer
// pinned to the workload's CPU at nice 19 against the workload's nice -10, so its poller falls
// behind and the ring overflows for long stretches. The gaps those losses leave in the recorded
// stream must not come out as MEDIUM/HIGH launch_gap (or throughput_drop) findings, neither from
// `trace` itself (its stored chains, judged live) nor from `explain` on the database (replay,
// which reads the recorded loss spans back). Skips with the reason without root, BPF, the
// pipeline binary, the workload or libcudart, and when no loss could be forced.
#include <gtest/gtest.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/util/child_process.h"
#include "tests/util/run_command.h"
#include "tests/util/tracer.h"

using json = nlohmann::json;

#if defined(IP_PIPELINE_BIN) && defined(IP_CUDA_WORKLOAD) && defined(IP_REAL_CUDART)
namespace {

// The tracer's priority while the loop runs (the workload's is 0): low enough that its poller falls
// behind in stretches, high enough that it still records most of the loop, so the recorded stream
// has gaps made of losses with launches around them.
constexpr int kTracerNice = 8;

// Every thread of `pid` (and its autogroup) at kTracerNice.
void starve(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  if (FILE* f = std::fopen((dir + "/autogroup").c_str(), "w")) {
    std::fprintf(f, "%d\n", kTracerNice);
    std::fclose(f);
  }
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(dir + "/task", ec))
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(std::stoul(t.path().filename().string())), kTracerNice);
}

bool absence_finding(const std::string& category) { return category == "launch_gap" || category == "throughput_drop"; }

TEST(LiveLosses, TightLoopWithForcedLossesHasNoGapFinding) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF uprobes and tracepoints)";
  if (::access(IP_REAL_CUDART, R_OK) != 0) GTEST_SKIP() << IP_REAL_CUDART << " absent";
  cpu_set_t all, one;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  int cpu = -1;
  for (int i = 0; i < CPU_SETSIZE && cpu < 0; ++i)
    if (CPU_ISSET(i, &all)) cpu = i;
  ASSERT_GE(cpu, 0);

  ingero::test::Child work;
  if (!work.spawn({IP_CUDA_WORKLOAD, "loop", "--calls", "3000000", "--cpu", std::to_string(cpu), "--wait"}))
    GTEST_SKIP() << "cannot start the CUDA workload";
  ingero::test::Tracer tracer(IP_PIPELINE_BIN, "losses");
  // The tracer inherits our affinity: the workload's CPU only.
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  // Nice 1 puts it in a session (and scheduler autogroup) of its own; it attaches at that priority
  // (loading the BPF programs takes CPU), then every thread of it and its autogroup go to nice 19.
  tracer.start({"--duration", "14s", "--pid", std::to_string(work.pid), "--cuda-lib", IP_REAL_CUDART, "--ring-mb", "1"},
               1);
  ASSERT_EQ(::sched_setaffinity(0, sizeof all, &all), 0);
  if (!tracer.wait_attached()) GTEST_SKIP() << "the tracer did not attach (BPF unavailable?): " << tracer.log();
  starve(tracer.pid);
  work.go();
  ASSERT_EQ(work.finish(), 0) << work.output;
  ASSERT_EQ(tracer.wait(), 0) << tracer.log();
  std::printf("[workload] %s", work.output.c_str());

  const std::string out = ingero::test::capture(std::string(IP_PIPELINE_BIN) + " explain --json --db " + tracer.db +
                                                " 2>/dev/null");
  const json ex = json::parse(out, nullptr, false);
  ASSERT_FALSE(ex.is_discarded()) << "explain --json did not print JSON";
  const json health = ex.contains("health") ? ex["health"] : json::object();
  const uint64_t dropped = health.value("dropped_events", uint64_t{0});
  if (dropped == 0) GTEST_SKIP() << "no loss could be forced (the tracer kept up); nothing to judge";
  ASSERT_TRUE(health.contains("loss_spans")) << "events were dropped but no loss span was recorded: " << health.dump();
  uint64_t in_spans = 0;
  for (const auto& s : health["loss_spans"])
    in_spans += s.value("gpu", uint64_t{0}) + s.value("host", uint64_t{0}) + s.value("queue", uint64_t{0});
  EXPECT_EQ(in_spans, dropped) << "every dropped event is placed in a span";
  std::printf("[measure] %llu events dropped in %zu loss spans\n", static_cast<unsigned long long>(dropped),
              health["loss_spans"].size());

  // Replay: explain's chains.
  size_t gaps = 0, lossy = 0;
  for (const auto& c : ex["chains"]) {
    const std::string cat = c.value("category", ""), sev = c.value("severity", "");
    std::printf("[chain] %s %s: %s\n", sev.c_str(), cat.c_str(), c.value("summary", "").c_str());
    if (!absence_finding(cat)) continue;
    ++gaps;
    lossy += c.value("summary", "").rfind("lossy capture", 0) == 0;
    EXPECT_TRUE(sev != "MEDIUM" && sev != "HIGH") << "explain: " << cat << " at " << sev << ": " << c.dump();
  }
  // Live: the chains `trace` judged as it ran and stored.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(tracer.db.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT category, severity, summary FROM ip_chains", -1, &st, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  size_t live_gaps = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const std::string cat = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    const std::string sev = reinterpret_cast<const char*>(sqlite3_column_text(st, 1));
    if (!absence_finding(cat)) continue;
    ++live_gaps;
    EXPECT_TRUE(sev != "MEDIUM" && sev != "HIGH")
        << "trace: " << cat << " at " << sev << ": " << reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  std::printf("[measure] gap/rate chains: explain %zu (%zu say lossy capture), trace %zu\n", gaps, lossy, live_gaps);
}

}  // namespace
#else
TEST(LiveLosses, Skipped) { GTEST_SKIP() << "built without the pipeline binary, ip-cuda-workload or libcudart"; }
#endif
