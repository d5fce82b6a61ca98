// Streamable HTTP transport (see transport.h for the contract). Plain POSIX sockets: one thread
// per connection, requests into the server serialised by a mutex, cancellation applied at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "sinks/mcp/transport.h"

namespace ingero::mcp {
namespace {

struct HttpRequest {
  std::string method, target;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 503: return "Service Unavailable";
    case 405: return "Method Not Allowed";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    default: return "Error";
  }
}

bool send_response(int fd, int status, const std::string& body, const std::vector<std::string>& extra = {},
                   bool keep_alive = true) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  if (!body.empty()) head += "Content-Type: application/json\r\n";
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  head += "Cache-Control: no-store\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& h : extra) head += h + "\r\n";
  head += "\r\n";
  return send_all(fd, head + body);
}

// Reads one request; false on EOF, timeout or a malformed head (`status` says which answer).
bool read_request(int fd, std::string& buffer, size_t max_body, HttpRequest& req, int& status) {
  status = 0;
  size_t head_end;
  while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (buffer.size() > 64UL * 1024) {
      status = 431;
      return false;
    }
    char chunk[16384];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  std::string head = buffer.substr(0, head_end);
  buffer.erase(0, head_end + 4);
  std::size_t pos = head.find("\r\n");
  const std::string request_line = head.substr(0, pos);
  const auto sp1 = request_line.find(' ');
  const auto sp2 = request_line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    status = 400;
    return false;
  }
  req.method = request_line.substr(0, sp1);
  req.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  while (pos != std::string::npos) {
    const auto next = head.find("\r\n", pos + 2);
    const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    const auto colon = line.find(':');
    if (colon != std::string::npos) req.headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
    pos = next;
  }
  if (req.headers.count("transfer-encoding")) {
    status = 411;  // chunked bodies are not accepted; MCP clients send Content-Length
    return false;
  }
  size_t length = 0;
  if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
    try {
      length = std::stoul(it->second);
    } catch (...) {
      status = 400;
      return false;
    }
  }
  if (length > max_body) {
    status = 413;
    return false;
  }
  while (buffer.size() < length) {
    char chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  req.body = buffer.substr(0, length);
  buffer.erase(0, length);
  return true;
}

bool loopback_origin(const std::string& origin) {
  for (const char* scheme : {"http://", "https://"}) {
    if (origin.rfind(scheme, 0) != 0) continue;
    std::string host = origin.substr(std::strlen(scheme));
    if (host.rfind("[::1]", 0) == 0) host = host.substr(5);
    else if (host.rfind("127.0.0.1", 0) == 0 || host.rfind("localhost", 0) == 0) host = host.substr(9);
    else return false;
    return host.empty() || host[0] == ':' || host[0] == '/';
  }
  return false;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

std::string new_session_id() {
  unsigned char raw[16] = {};
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(raw), sizeof raw);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : raw) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

struct Shared {
  Server& server;
  const HttpOptions& options;
  std::mutex server_mu;  // the server core is single-threaded
  std::mutex state_mu;
  std::string session;  // current session id ("" = none)
  std::map<std::string, std::shared_ptr<RequestContext>> pending;
  std::vector<int> open_fds;  // shut down at stop so blocked reads return
};

void serve_connection(Shared& sh, int fd, std::atomic<bool>& stop) {
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string buffer;
  const std::string bearer = "Bearer " + sh.options.token;
  while (!stop.load()) {
    HttpRequest req;
    int status = 0;
    if (!read_request(fd, buffer, sh.server.options().max_message_bytes, req, status)) {
      if (status) send_response(fd, status, "", {}, false);
      break;
    }
    const bool keep = lower(req.headers["connection"]) != "close";
    // False ends the connection: a failed send, or the client asked to close.
    auto respond = [&](int st, const std::string& body, const std::vector<std::string>& extra = {}) {
      return send_response(fd, st, body, extra, keep) && keep;
    };
    if (sh.options.health && req.method == "GET" &&
        req.target.substr(0, req.target.find('?')) == sh.options.health_path) {
      const auto [st, body] = sh.options.health();
      if (!respond(st, body)) break;
      continue;
    }
    const auto origin = req.headers.find("origin");
    if (origin != req.headers.end() && !loopback_origin(origin->second)) {
      if (!respond(403, to_line(make_error(nullptr, kInvalidRequest, "origin not allowed")))) break;
      continue;
    }
    if (!constant_time_equal(req.headers["authorization"], bearer)) {
      if (!respond(401, to_line(make_error(nullptr, kInvalidRequest, "missing or wrong bearer token")),
                   {"WWW-Authenticate: Bearer realm=\"ingero-pipeline\""}))
        break;
      continue;
    }
    const std::string path = req.target.substr(0, req.target.find('?'));
    if (path != sh.options.path) {
      if (!respond(404, "")) break;
      continue;
    }
    if (auto v = req.headers.find("mcp-protocol-version"); v != req.headers.end()) {
      const auto& known = supported_protocols();
      if (std::find(known.begin(), known.end(), v->second) == known.end()) {
        if (!respond(400, to_line(make_error(nullptr, kInvalidRequest,
                                             "unsupported MCP-Protocol-Version: " + v->second.substr(0, 40)))))
          break;
        continue;
      }
    }
    const std::string session_header = req.headers.count("mcp-session-id") ? req.headers["mcp-session-id"] : "";
    if (req.method == "DELETE") {
      std::lock_guard<std::mutex> lock(sh.state_mu);
      const bool ok = !sh.session.empty() && session_header == sh.session;
      if (ok) {
        sh.session.clear();
        std::lock_guard<std::mutex> slock(sh.server_mu);
        sh.server.reset_session();
      }
      if (!respond(ok ? 200 : 404, "")) break;
      continue;
    }
    if (req.method != "POST") {
      if (!respond(405, "", {"Allow: POST, DELETE"})) break;
      continue;
    }
    Json msg, err;
    if (!sh.server.parse(req.body, msg, &err)) {
      if (!respond(400, to_line(err))) break;
      continue;
    }
    const bool is_initialize = msg.is_object() && msg.contains("method") && msg["method"] == "initialize";
    {
      std::lock_guard<std::mutex> lock(sh.state_mu);
      if (!is_initialize) {
        if (session_header.empty() && !sh.session.empty()) {
          if (!respond(400, to_line(make_error(nullptr, kInvalidRequest, "missing Mcp-Session-Id header")))) break;
          continue;
        }
        if (session_header != sh.session) {
          if (!respond(404, to_line(make_error(nullptr, kInvalidRequest, "unknown or ended session")))) break;
          continue;
        }
      } else if (!sh.session.empty()) {
        // A new initialize replaces the previous session (one client at a time).
        sh.session.clear();
        std::lock_guard<std::mutex> slock(sh.server_mu);
        sh.server.reset_session();
      }
    }
    // Cancellation applies at once, outside the server lock.
    if (msg.is_object() && msg.contains("method") && msg["method"] == "notifications/cancelled" &&
        !msg.contains("id")) {
      if (msg.contains("params") && msg["params"].is_object() && msg["params"].contains("requestId")) {
        std::lock_guard<std::mutex> lock(sh.state_mu);
        auto it = sh.pending.find(Server::id_key(msg["params"]["requestId"]));
        if (it != sh.pending.end()) it->second->cancelled.store(true);
      }
      if (!respond(202, "")) break;
      continue;
    }
    auto ctx = std::make_shared<RequestContext>();
    std::string key;
    if (msg.is_object() && msg.contains("id")) key = Server::id_key(msg["id"]);
    if (!key.empty()) {
      std::lock_guard<std::mutex> lock(sh.state_mu);
      sh.pending[key] = ctx;
    }
    std::optional<Json> reply;
    {
      std::lock_guard<std::mutex> lock(sh.server_mu);
      reply = sh.server.handle_message(msg, ctx.get());
    }
    std::vector<std::string> extra;
    {
      std::lock_guard<std::mutex> lock(sh.state_mu);
      if (!key.empty()) sh.pending.erase(key);
      if (is_initialize && reply && reply->contains("result")) {
        sh.session = new_session_id();
        extra.push_back("Mcp-Session-Id: " + sh.session);
      }
    }
    if (!reply) {
      if (!respond(202, "")) break;
      continue;
    }
    if (!respond(200, to_line(*reply), extra)) break;
  }
  {
    std::lock_guard<std::mutex> lock(sh.state_mu);
    sh.open_fds.erase(std::remove(sh.open_fds.begin(), sh.open_fds.end(), fd), sh.open_fds.end());
  }
  ::close(fd);
}

}  // namespace

int run_http(Server& server, const HttpOptions& options, std::atomic<bool>& stop, std::atomic<uint16_t>* bound_port,
             std::string& error) {
  if (options.token.empty()) {
    error = "the HTTP transport needs a bearer token";
    return 1;
  }
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return 1;
  }
  int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options.port);
  if (::inet_pton(AF_INET, options.bind.c_str(), &addr.sin_addr) != 1) {
    error = "cannot listen on '" + options.bind + "': expected an IPv4 address such as 127.0.0.1";
    ::close(lfd);
    return 1;
  }
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 16) != 0) {
    error = "cannot listen on " + options.bind + ":" + std::to_string(options.port) + ": " + std::strerror(errno);
    ::close(lfd);
    return 1;
  }
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound_port) bound_port->store(ntohs(addr.sin_port));
  Shared shared{server, options, {}, {}, {}, {}, {}};
  std::list<std::thread> threads;
  while (!stop.load()) {
    pollfd p{lfd, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r <= 0) continue;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      std::lock_guard<std::mutex> lock(shared.state_mu);
      shared.open_fds.push_back(fd);
    }
    threads.emplace_back([&shared, fd, &stop] { serve_connection(shared, fd, stop); });
  }
  ::close(lfd);
  {
    std::lock_guard<std::mutex> lock(shared.state_mu);
    for (int fd : shared.open_fds) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : threads) t.join();
  return 0;
}

}  // namespace ingero::mcp
