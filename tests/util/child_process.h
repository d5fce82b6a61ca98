// Test helper: a workload child process with a line protocol on its stdin/stdout.
//
// Contract:
// - spawn(args): starts args[0] (a path) with args; its stdin and stdout are pipes to us. Returns
//   true once it printed the line "ready" (every workload here prints it when it is set up), false
//   when it could not start or ended first.
// - go(): writes a line to its stdin and closes it (workloads started with --wait start then).
// - finish(): reads the rest of its stdout into `output`, waits for it, returns its exit status
//   (-1 when it did not exit normally).
// - The destructor kills (SIGKILL) and reaps a child that is still running.
// Header-only, for the privileged test binaries.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace ingero::test {

struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string output;

  bool spawn(const std::vector<std::string>& args) {
    int pin[2], pout[2];
    if (::pipe(pin) != 0) return false;
    if (::pipe(pout) != 0) {
      ::close(pin[0]);
      ::close(pin[1]);
      return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_addclose(&fa, pin[1]);
    posix_spawn_file_actions_addclose(&fa, pout[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(pin[0]);
    ::close(pout[1]);
    in = pin[1];
    out = pout[0];
    if (rc != 0) {
      pid = -1;
      return false;
    }
    return read_line() == "ready";
  }
  std::string read_line() {
    std::string line;
    char c;
    while (::read(out, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }
  void go() {
    if (in < 0) return;
    (void)!::write(in, "go\n", 3);
    ::close(in);
    in = -1;
  }
  int finish() {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out, buf, sizeof(buf))) > 0) output.append(buf, static_cast<size_t>(n));
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out);
    out = -1;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
  }
};

}  // namespace ingero::test
