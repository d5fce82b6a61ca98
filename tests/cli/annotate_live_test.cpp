// Privileged (root + BPF): `trace --annotate` with a Python training loop that reports its steps
// the way Ingero's PyTorch Lightning callback does (tests/cli/annotate_steps.py: one NDJSON line
// per batch start on the annotation socket, no ts, its pid), then `explain --json` on the saved
// trace gives that process "annotated (step)" with the loop's period. Skips with the reason when
// not root, without BTF or python3 (libcudart is optional: without it the loop makes no GPU call
// and its steps come from the markers alone).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/util/run_command.h"
#include "tests/util/scratch_db.h"

namespace {

namespace fs = std::filesystem;

const std::string kBin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
const std::string kScript = std::string(INGERO_SOURCE_DIR) + "/tests/cli/annotate_steps.py";
const char* kCudart = "/usr/local/cuda/lib64/libcudart.so.13";
const char* kPython = "/usr/bin/python3";

}  // namespace

TEST(AnnotateLive, LightningStyleStepsWinInExplain) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (eBPF)";
  if (!fs::exists("/sys/kernel/btf/vmlinux")) GTEST_SKIP() << "kernel without BTF";
  if (!fs::exists(kPython)) GTEST_SKIP() << "missing " << kPython;
  ingero::test::ScratchDir dir("ip_annotate_live");
  const std::string sock = dir("annotate.sock"), db = dir("run.db");

  // The training loop: says "ready", waits for a line, then 40 steps of 50 ms.
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
    execl(kPython, kPython, "-u", kScript.c_str(), sock.c_str(), kCudart, "40", "50", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  {
    char buf[16] = {};
    ASSERT_GT(read(out_pipe[0], buf, sizeof buf - 1), 0);
    ASSERT_EQ(std::string(buf).rfind("ready", 0), 0u) << buf;
  }

  // The capture, on its own thread; its stderr says when the socket listens and when libcudart
  // (which the loop loaded before "ready") is probed.
  const bool cudart = fs::exists(kCudart);
  std::atomic<bool> listening{false}, probing{!cudart};
  int trace_status = -1;
  std::string trace_out;
  std::thread tracer([&] {
    const std::string cmd = kBin + " trace --annotate=" + sock + " --pid " + std::to_string(child) +
                            " --duration 8s -q --db " + db + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return;
    std::array<char, 2048> l{};
    while (fgets(l.data(), l.size(), p)) {
      trace_out += l.data();
      if (std::string(l.data()).rfind("annotate: listening on " + sock, 0) == 0) listening = true;
      if (std::string(l.data()).find("tracing libcudart") != std::string::npos) probing = true;
    }
    const int st = pclose(p);
    trace_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  });
  // Attaching takes seconds (20 s seen on a loaded 2-core VM); the socket listens before it.
  for (int i = 0; i < 4800 && !(listening && probing); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  EXPECT_TRUE(listening.load()) << "trace never said it listens";
  EXPECT_TRUE(probing.load()) << "trace never said it probes libcudart";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // probes attached after the line
  ASSERT_EQ(write(in_pipe[1], "go\n", 3), 3);
  close(in_pipe[1]);
  int st = 0;
  waitpid(child, &st, 0);
  close(out_pipe[0]);
  tracer.join();
  ASSERT_EQ(trace_status, 0) << trace_out;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << trace_out;
  EXPECT_NE(trace_out.find("trace: annotate " + sock +
                           ": 1 connection(s), 41 line(s): 41 annotation(s) (40 step marker(s), 1 epoch-only)"),
            std::string::npos)
      << trace_out;
  EXPECT_FALSE(fs::exists(sock)) << "the socket file outlived the trace";

  // Stored: every line, about the loop's pid, sent by it.
  EXPECT_EQ(ingero::test::query_int(db, "SELECT count(*) FROM ip_annotations"), 41);
  EXPECT_EQ(ingero::test::query_int(db, "SELECT count(*) FROM ip_annotations WHERE pid = " + std::to_string(child) +
                                            " AND peer_pid = pid AND ts_given = 0"),
            41);
  EXPECT_EQ(ingero::test::query_int(db, "SELECT max(step) FROM ip_annotations"), 39);

  // explain on the saved trace: the markers win.
  int rc = -1;
  const std::string out = ingero::test::capture(kBin + " explain --json --db " + db, &rc);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("steps")) << out.substr(0, 2000);
  const nlohmann::json* s = nullptr;
  for (const auto& x : j["steps"])
    if (x["pid"] == child) s = &x;
  ASSERT_NE(s, nullptr) << j["steps"].dump(2);
  EXPECT_EQ((*s)["method"], "annotated (step)");
  EXPECT_EQ((*s)["confidence"], 1.0);
  EXPECT_EQ((*s)["count"], 39);
  EXPECT_EQ((*s)["epochs"], 5);  // 0..3 from the steps, 9 from the last line
  // 50 ms steps, paced by the loop's clock; the markers are stamped at receive time.
  EXPECT_NEAR((*s)["period_ns"].get<double>(), 50e6, 5e6) << s->dump();
  EXPECT_NEAR((*s)["p50_ns"].get<double>(), 50e6, 5e6) << s->dump();
}
