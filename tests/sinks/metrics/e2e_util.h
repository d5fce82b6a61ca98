// Helpers of the Prometheus/Alertmanager end-to-end tests (prometheus_e2e_test,
// alertmanager_e2e_test): free loopback ports, a tiny HTTP GET, child processes killed at scope
// exit, and a one-thread HTTP listener that records what is POSTed to it (the webhook receiver).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ingero::test {

inline std::string find_binary(std::initializer_list<const char*> paths) {
  for (const char* p : paths)
    if (::access(p, X_OK) == 0) return p;
  return "";
}

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The whole HTTP/1.0 response to GET `path` on loopback `port`, status line and headers included
// ("" when nothing listens).
inline std::string http_get_response(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// The body of that response ("" when there is none).
inline std::string http_get(int port, const std::string& path) {
  const std::string out = http_get_response(port, path);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

inline std::string url_encode(const std::string& s) {
  std::string o;
  char b[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      o += static_cast<char>(c);
    } else {
      std::snprintf(b, sizeof b, "%%%02X", c);
      o += b;
    }
  }
  return o;
}

// Starts argv[0] with stdout and stderr to `log`. The child gets SIGTERM when the test process
// dies (PR_SET_PDEATHSIG), so a test killed by a ctest timeout leaves no replays behind.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;  // parent (or -1)
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(127);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ::execv(args[0], args.data());
  ::_exit(127);
}

// The processes a test started; SIGTERM and reaped at scope exit (only these pids).
struct Children {
  std::vector<pid_t> pids;
  ~Children() {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGTERM);
    for (pid_t p : pids)
      if (p > 0) ::waitpid(p, nullptr, 0);
  }
};

inline std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// An HTTP/1.x listener on 127.0.0.1 (free port) that answers every request 200 and keeps each
// request's body with the steady-clock time it arrived: Alertmanager's webhook receiver.
class WebhookListener {
 public:
  struct Post {
    std::chrono::steady_clock::time_point at;
    std::string body;
  };
  WebhookListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) return;
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~WebhookListener() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  std::vector<Post> posts() const {
    std::lock_guard lock(mu_);
    return posts_;
  }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      timeval tv{5, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string in;
      char buf[8192];
      size_t need = std::string::npos;
      while (true) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
        const auto hdr = in.find("\r\n\r\n");
        if (hdr == std::string::npos) continue;
        if (need == std::string::npos) {
          size_t cl = 0;
          std::string lower = in.substr(0, hdr);
          for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          const auto k = lower.find("content-length:");
          if (k != std::string::npos) cl = std::stoul(lower.substr(k + 15));
          need = hdr + 4 + cl;
        }
        if (in.size() >= need) break;
      }
      const auto at = std::chrono::steady_clock::now();
      const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      (void)!::write(c, ok.data(), ok.size());
      ::close(c);
      const auto hdr = in.find("\r\n\r\n");
      if (hdr == std::string::npos) continue;
      std::lock_guard lock(mu_);
      posts_.push_back({at, in.substr(hdr + 4)});
    }
  }
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Post> posts_;
};

}  // namespace ingero::test
