// Privileged (root + BPF): a live capture of a Python process calling the real libcudart through
// ctypes from a known line of `train_step` (tests/cli/step_syncs.py), then:
// - `stacks --json` ranks that line first, as a Python frame (file, function, the line being
//   executed), with the libcudart function innermost in its top stack;
// - a rule matching the call site (`site ~ step_functions`, `window ... by pid, site`;
//   tests/cli/live_sync_sites.rules) emits its chain during the capture, naming the line.
// Skips with the reason when not root, without BTF, libcudart or python3.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/util/run_command.h"
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;

const std::string kBin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
const std::string kDir = std::string(INGERO_SOURCE_DIR) + "/tests/cli";
const char* kCudart = "/usr/local/cuda/lib64/libcudart.so.13";
const char* kPython = "/usr/bin/python3";

using ingero::test::capture;

int marker_line(const std::string& file, const std::string& marker) {
  std::ifstream in(file);
  std::string l;
  for (int n = 1; std::getline(in, l); ++n)
    if (l.find(marker) != std::string::npos) return n;
  return -1;
}

}  // namespace

TEST(StacksLive, PythonCallSiteRankedAndMatchedByARuleWhileCapturing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (eBPF uprobes)";
  if (!fs::exists("/sys/kernel/btf/vmlinux")) GTEST_SKIP() << "kernel without BTF";
  if (!fs::exists(kCudart)) GTEST_SKIP() << "missing " << kCudart;
  if (!fs::exists(kPython)) GTEST_SKIP() << "missing " << kPython;
  const std::string script = kDir + "/step_syncs.py";
  const int line = marker_line(script, "SITE:sync");
  ASSERT_GT(line, 0);
  const std::string db = (fs::temp_directory_path() / ("ip-stacks-live-" + std::to_string(getpid()) + ".db")).string();

  // The workload: loads libcudart, says "ready", waits for a line on stdin.
  int in_pipe[2], out_pipe[2];
  ASSERT_EQ(pipe(in_pipe), 0);
  ASSERT_EQ(pipe(out_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    close(in_pipe[1]);
    close(out_pipe[0]);
    execl(kPython, kPython, "-u", script.c_str(), kCudart, "300", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  {
    char buf[16] = {};
    ASSERT_GT(read(out_pipe[0], buf, sizeof buf - 1), 0);
    ASSERT_EQ(std::string(buf).rfind("ready", 0), 0u) << buf;
  }

  // The capture, on its own thread; its stderr says when libcudart is probed.
  std::atomic<bool> probing{false};
  int trace_status = -1;
  std::string trace_out;
  std::thread tracer([&] {
    const std::string cmd = kBin + " trace --pid " + std::to_string(child) + " --duration 7s --stack-min 0 -q --db " +
                            db + " --rules " + kDir + "/live_sync_sites.rules 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return;
    std::array<char, 1024> l{};
    while (fgets(l.data(), l.size(), p)) {
      trace_out += l.data();
      if (std::string(l.data()).find("tracing libcudart") != std::string::npos) probing = true;
    }
    const int st = pclose(p);
    trace_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  });
  for (int i = 0; i < 200 && !probing; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // probes attached after the line
  EXPECT_TRUE(probing.load()) << "trace never said it probes libcudart";
  ASSERT_EQ(write(in_pipe[1], "go\n", 3), 3);
  close(in_pipe[1]);
  int st = 0;
  waitpid(child, &st, 0);
  close(out_pipe[0]);
  tracer.join();
  ASSERT_EQ(trace_status, 0) << trace_out;

  // stacks: the line of train_step first, with libcudart's function innermost.
  int rc = -1;
  const auto j = nlohmann::json::parse(capture(kBin + " stacks --json --db " + db, &rc));
  ASSERT_EQ(rc, 0);
  ASSERT_FALSE(j["sites"].empty()) << j.dump(2) << trace_out;
  EXPECT_GE(j["calls_with_stack"].get<int>(), 5);
  const auto& top = j["sites"][0];
  EXPECT_EQ(top["frame"]["kind"], "python");
  EXPECT_EQ(top["frame"]["function"], "train_step");
  EXPECT_EQ(top["frame"]["line"], line);
  EXPECT_TRUE(top["frame"]["file"].get<std::string>().ends_with("step_syncs.py")) << top["frame"];
  const auto& frames = top["top_stack"]["frames"];
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0]["function"], "cudaDeviceSynchronize") << frames[0];
  EXPECT_EQ(frames[0]["module"].get<std::string>().rfind("libcudart", 0), 0u) << frames[0];

  // The rule's chain, emitted by the live run and stored: one per (pid, call site).
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open_v2(("file:" + db + "?immutable=1").c_str(), &h, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI,
                            nullptr),
            SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT summary FROM ip_chains WHERE rule = 'live_sync_sites'", -1, &s, nullptr),
            SQLITE_OK);
  std::string summaries;
  int chains = 0;
  while (sqlite3_step(s) == SQLITE_ROW) {
    ++chains;
    summaries += reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
    summaries += "\n";
  }
  sqlite3_finalize(s);
  sqlite3_close(h);
  EXPECT_GE(chains, 1) << trace_out;
  EXPECT_NE(summaries.find("step_syncs.py:" + std::to_string(line) + " in train_step"), std::string::npos) << summaries;
  fs::remove(db);
  fs::remove(db + "-wal");
  fs::remove(db + "-shm");
}
