// `trace` stamps the node and each traced process's rank (docs/fleet.md "Node identity") on a
// live capture. Needs root and eBPF: skips with the reason elsewhere. A shell loop exec'd with
// torchrun variables is traced by pid; its scheduler events must carry rank 3, the database must
// name the node by the id persisted in a temporary INGERO_STATE_DIR, and record the process's
// identity and the hostname.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/util/run_command.h"
#include "tests/util/scratch_db.h"
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::string kBin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";

using ingero::test::capture;

using ingero::test::query_int;

}  // namespace

TEST(TraceIdentityLive, RankFromTheEnvironmentAndPersistedNodeId) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (eBPF tracepoints)";
  if (!fs::exists("/sys/kernel/btf/vmlinux")) GTEST_SKIP() << "kernel without BTF";
  if (!fs::exists(kBin)) GTEST_SKIP() << "missing " << kBin;
  const fs::path dir = fs::temp_directory_path() / ("fleet_live_identity_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string state = (dir / "state").string(), db = (dir / "live.db").string();

  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    const char* argv[] = {"sh", "-c", "while :; do sleep 0.01; done", nullptr};
    const char* envp[] = {
        "PATH=/usr/bin:/bin", "RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=live-test", nullptr};
    ::execve("/bin/sh", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::_exit(127);
  }
  ::close(fds[1]);
  char c;
  while (::read(fds[0], &c, 1) > 0) {
  }
  ::close(fds[0]);

  int status = 0;
  const std::string out = capture("INGERO_STATE_DIR=" + state + " " + kBin + " trace --pid " + std::to_string(child) +
                                      " --duration 3s --no-stacks --no-samples -q --db " + db + " 2>&1",
                                  &status);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  if (status != 0 && (out.find("BPF") != std::string::npos || out.find("bpf") != std::string::npos ||
                      out.find("ermission") != std::string::npos)) {
    fs::remove_all(dir);
    GTEST_SKIP() << "eBPF capture unavailable here: " << out.substr(0, 400);
  }
  ASSERT_EQ(status, 0) << out;

  std::string node;
  std::ifstream(state + "/node-id") >> node;
  EXPECT_EQ(node.rfind("node-", 0), 0u) << node;
  EXPECT_NE(out.find("created in"), std::string::npos) << out;
  const std::string pid = std::to_string(child);
  // Scheduler switches of the traced shell: every one carries rank 3 and the persisted node.
  const int64_t switches = query_int(db, "SELECT count(*) FROM events WHERE pid=" + pid + " AND source=3 AND op=1");
  EXPECT_GT(switches, 10) << out;
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM events WHERE pid=" + pid +
                              " AND source=3 AND op=1 AND rank=3 AND node='" + node + "'"),
            switches);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ip_process_identity WHERE pid=" + pid +
                              " AND rank=3 AND local_rank=1 AND world_size=8 AND job_id='live-test'"
                              " AND launcher='torchrun' AND node='" +
                              node + "'"),
            1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ip_node_attributes WHERE node='" + node +
                              "' AND key='hostname' AND value<>''"),
            1);
  fs::remove_all(dir);
}
