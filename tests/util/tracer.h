// Test helper: `ingero-pipeline trace` as a child process writing a database, for the privileged
// end-to-end tests (tests/bpf).
//
// Contract:
// - Tracer(bin, name): the pipeline binary to run, and a name that makes its files unique:
//   /tmp/ip_<name>_<our pid>.db (the database) and .err (the tracer's stderr); leftovers of a
//   previous run under those names are removed.
// - start(args, nice): forks and execs `bin trace -q --db <db> --disable
//   driver,nccl,block,tcp,net,memory <args...>` (e.g. {"--duration", "3s"} or {"--pid", "N",
//   "--cuda-lib", path}), stdout to /dev/null, stderr to the .err file; with nice != 0 the child
//   sets that priority first, in a session of its own whose scheduler autogroup is at that nice
//   too (where autogroups are on, nice alone does not rank a task against other sessions'): a
//   privileged test may give the tracer the workload's priority, so a workload at high priority
//   does not starve it. pid is the tracer's (> 0 once started).
// - wait_attached(): true once the tracer said "tracing libcudart" (its probes are in), within
//   30 s; false when it exited first or did not say it in time (the test skips with log()).
// - wait(): waits for a tracer that stops by itself (--duration): its exit status, -1 when it did
//   not exit normally. interrupt(): Ctrl-C (SIGINT) then wait().
// - log(): what it wrote to stderr so far.
// - The destructor kills (SIGKILL) and reaps a tracer still running, and removes the database,
//   the -wal and -shm files that reading it in WAL mode leaves beside it, and the .err file:
//   nothing is left in /tmp, failed assertions included.
// Header-only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ingero::test {

struct Tracer {
  pid_t pid = -1;
  std::string bin, db, err;

  Tracer(std::string pipeline_bin, const std::string& name) : bin(std::move(pipeline_bin)) {
    const std::string base = "/tmp/ip_" + name + "_" + std::to_string(::getpid());
    db = base + ".db";
    err = base + ".err";
    remove_files();
  }
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void start(const std::vector<std::string>& extra = {}, int nice = 0) {
    std::vector<std::string> args = {bin, "trace", "-q", "--db", db, "--disable", "driver,nccl,block,tcp,net,memory"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid = ::fork();
    if (pid != 0) return;
    if (nice != 0) {
      // With scheduler autogroups on, nice only ranks tasks within their session's group: a new
      // session whose group is at the same nice, so the priority counts against other sessions.
      if (::setsid() >= 0) {
        if (FILE* f = std::fopen("/proc/self/autogroup", "w")) {
          std::fprintf(f, "%d\n", nice);
          std::fclose(f);
        }
      }
      ::setpriority(PRIO_PROCESS, 0, nice);
    }
    const int null_fd = ::open("/dev/null", O_WRONLY);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null_fd, 1);
    ::dup2(err_fd, 2);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }

  bool wait_attached() {
    for (int i = 0; i < 300; ++i) {
      if (log().find("tracing libcudart") != std::string::npos) return true;
      int st = 0;
      if (pid <= 0 || ::waitpid(pid, &st, WNOHANG) == pid) {  // it gave up
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  int wait() {
    if (pid <= 0) return -1;
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  int interrupt() {
    if (pid > 0) ::kill(pid, SIGINT);
    return wait();
  }

  std::string log() const {
    std::ifstream in(err);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  ~Tracer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    remove_files();
  }

 private:
  void remove_files() const {
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((db + suffix).c_str());
    ::unlink(err.c_str());
  }
};

}  // namespace ingero::test
