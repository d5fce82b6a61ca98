#include <cerrno>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "sinks/mcp/transport.h"

namespace ingero::mcp {
namespace {

struct Job {
  std::string line;
  std::shared_ptr<RequestContext> ctx;
  std::string key;  // id key of a request ("" for others)
  bool oversized = false;
};

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int run_stdio(Server& server, int in_fd, int out_fd) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  std::map<std::string, std::shared_ptr<RequestContext>> pending;
  bool done = false;
  bool out_broken = false;

  std::thread worker([&] {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      std::optional<std::string> reply;
      if (job.oversized) {
        reply = to_line(make_error(nullptr, kParseError,
                                   "message exceeds the limit of " +
                                       std::to_string(server.options().max_message_bytes) + " bytes"));
      } else if (!job.ctx->cancelled.load()) {
        reply = server.handle_line(job.line, job.ctx.get());
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!job.key.empty()) {
          auto it = pending.find(job.key);
          if (it != pending.end() && it->second == job.ctx) pending.erase(it);
        }
      }
      // A cancelled request gets no reply (MCP cancellation).
      if (reply && !job.ctx->cancelled.load() && !out_broken) {
        if (!write_all(out_fd, *reply + "\n")) out_broken = true;
      }
    }
  });

  auto submit = [&](Job job) {
    std::lock_guard<std::mutex> lock(mu);
    if (!job.key.empty()) pending[job.key] = job.ctx;
    queue.push_back(std::move(job));
    cv.notify_one();
  };

  auto on_line = [&](std::string& line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) return;
    Job job;
    job.ctx = std::make_shared<RequestContext>();
    Json msg;
    if (server.parse(line, msg, nullptr) && msg.is_object() && msg.contains("method") && msg["method"].is_string()) {
      const std::string method = msg["method"].get<std::string>();
      if (method == "notifications/cancelled" && !msg.contains("id")) {
        if (msg.contains("params") && msg["params"].is_object() && msg["params"].contains("requestId")) {
          const std::string key = Server::id_key(msg["params"]["requestId"]);
          std::lock_guard<std::mutex> lock(mu);
          auto it = pending.find(key);
          if (it != pending.end()) it->second->cancelled.store(true);
        }
        return;
      }
      if (msg.contains("id")) job.key = Server::id_key(msg["id"]);
    }
    job.line = std::move(line);
    submit(std::move(job));
  };

  const size_t limit = server.options().max_message_bytes;
  std::string line;
  bool discarding = false;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(in_fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (n == 0) break;
    size_t start = 0;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      if (buf[i] != '\n') continue;
      if (!discarding) {
        line.append(buf + start, i - start);
        on_line(line);
      }
      line.clear();
      discarding = false;
      start = i + 1;
    }
    if (!discarding) {
      line.append(buf + start, static_cast<size_t>(n) - start);
      if (line.size() > limit) {
        // Refuse it now, without holding more of it in memory.
        line.clear();
        discarding = true;
        Job job;
        job.ctx = std::make_shared<RequestContext>();
        job.oversized = true;
        submit(std::move(job));
      }
    }
  }
  if (!discarding && !line.empty()) on_line(line);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_one();
  }
  worker.join();
  return 0;
}

}  // namespace ingero::mcp
