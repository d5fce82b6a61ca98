// Test helper: run a shell command the way a user would, and capture what it printed.
//
// Contract:
// - run_command(cmd): runs `cmd` through /bin/sh; returns its exit status (-1 when it did not
//   exit normally or could not start), its stdout, and its stderr (redirected by this helper to a
//   private temporary file, removed afterwards). `cmd` must not redirect stderr itself.
// - capture(cmd, status): stdout only (stderr goes wherever `cmd` sends it); *status as above.
// Both block until the command exits. Header-only, for the test binaries of every area.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace ingero::test {

struct CommandRun {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string capture(const std::string& cmd, int* status = nullptr) {
  std::string out;
  if (status) *status = -1;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

inline CommandRun run_command(const std::string& cmd) {
  static std::atomic<unsigned> seq{0};
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("ip-test-" + std::to_string(::getpid()) + "-" + std::to_string(seq++) + ".err");
  CommandRun r;
  r.out = capture(cmd + " 2>" + err_path.string(), &r.status);
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::error_code ec;
  std::filesystem::remove(err_path, ec);
  return r;
}

}  // namespace ingero::test
