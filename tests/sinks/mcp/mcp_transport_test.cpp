// The stdio and Streamable HTTP transports: framing, EOF, oversized lines, cancellation while a
// query runs, and the HTTP guards (bearer token, origin, session).
#include "sinks/mcp/transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "tests/sinks/mcp/test_util.h"

namespace ingero::mcp {
namespace {

using Clock = std::chrono::steady_clock;

std::string init_line(int id) {
  return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
         R"(,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}})";
}

// Runs run_stdio over pipes; the test writes requests and reads reply lines.
class StdioHarness {
 public:
  explicit StdioHarness(ServerOptions opts) : server_(std::move(opts)) {
    EXPECT_EQ(::pipe(in_), 0);
    EXPECT_EQ(::pipe(out_), 0);
    thread_ = std::thread([this] {
      rc_ = run_stdio(server_, in_[0], out_[1]);
      ::close(out_[1]);
    });
  }
  ~StdioHarness() {
    close_input();
    if (thread_.joinable()) thread_.join();
    ::close(in_[0]);
    ::close(out_[0]);
  }
  void write(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::write(in_[1], s.data() + off, s.size() - off);
      ASSERT_GT(n, 0);
      off += static_cast<size_t>(n);
    }
  }
  void close_input() {
    if (in_[1] >= 0) ::close(in_[1]);
    in_[1] = -1;
  }
  // Next reply line, or "" at EOF.
  std::string read_line() {
    while (true) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      char chunk[65536];
      const ssize_t n = ::read(out_[0], chunk, sizeof chunk);
      if (n <= 0) return "";
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }
  void join() { thread_.join(); }
  int rc() const { return rc_; }

 private:
  Server server_;
  int in_[2] = {-1, -1}, out_[2] = {-1, -1};
  std::thread thread_;
  std::string buf_;
  int rc_ = -1;
};

ServerOptions options_for(const std::string& name) {
  ServerOptions o;
  o.db_path = mcp_test::sample_db(name);
  return o;
}

TEST(McpStdio, RepliesInOrderAndExitsOnEof) {
  auto opts = options_for("sample-gpu-node-01.db");
  if (opts.db_path.empty()) GTEST_SKIP() << "shared sample databases not found";
  StdioHarness h(opts);
  h.write(init_line(1) + "\n" + R"({"jsonrpc":"2.0","method":"notifications/initialized"})" + "\n\n" +
          R"({"jsonrpc":"2.0","id":2,"method":"ping"})" + "\r\n" + "not json\n" +
          R"({"jsonrpc":"2.0","id":3,"method":"tools/list"})");  // last line without newline
  h.close_input();
  std::vector<Json> replies;
  for (std::string line; !(line = h.read_line()).empty();) replies.push_back(Json::parse(line));
  h.join();
  EXPECT_EQ(h.rc(), 0);
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0]["id"], 1);
  EXPECT_EQ(replies[1]["id"], 2);
  EXPECT_EQ(replies[2]["error"]["code"], kParseError);
  EXPECT_EQ(replies[3]["id"], 3);
  EXPECT_EQ(replies[3]["result"]["tools"].size(), 12u);  // the eleven trace tools + query_fleet
}

TEST(McpStdio, OversizedLineIsRefusedWithoutStoppingTheServer) {
  auto opts = options_for("sample-gpu-node-01.db");
  if (opts.db_path.empty()) GTEST_SKIP() << "shared sample databases not found";
  opts.max_message_bytes = 1u << 20;
  StdioHarness h(opts);
  h.write(init_line(1) + "\n");
  EXPECT_EQ(Json::parse(h.read_line())["id"], 1);
  std::thread writer(
      [&] { h.write(std::string(10u << 20, 'x') + "\n" + R"({"jsonrpc":"2.0","id":2,"method":"ping"})" + "\n"); });
  Json big = Json::parse(h.read_line());
  EXPECT_EQ(big["error"]["code"], kParseError);
  EXPECT_NE(big["error"]["message"].get<std::string>().find("exceeds"), std::string::npos);
  EXPECT_EQ(Json::parse(h.read_line())["id"], 2);
  writer.join();
}

TEST(McpStdio, CancellationStopsARunningQueryAndSuppressesItsReply) {
  auto opts = options_for("sample-gpu-node-01.db");
  if (opts.db_path.empty()) GTEST_SKIP() << "shared sample databases not found";
  opts.sql.max_ms = 120'000;
  StdioHarness h(opts);
  h.write(init_line(1) + "\n");
  EXPECT_EQ(Json::parse(h.read_line())["id"], 1);
  const auto start = Clock::now();
  h.write(
      R"({"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"run_sql","arguments":{"sql":"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT max(x) FROM c"}}})"
      "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  h.write(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow","reason":"test"}})"
          "\n"
          R"({"jsonrpc":"2.0","id":3,"method":"ping"})"
          "\n");
  Json next = Json::parse(h.read_line());
  EXPECT_EQ(next["id"], 3) << "the cancelled request must not be answered: " << next.dump();
  EXPECT_LT(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count(), 60);
}

// --- HTTP ---

struct HttpReply {
  int status = 0;
  std::string headers, body;
};

HttpReply http(uint16_t port, const std::string& method, const std::string& body,
               const std::vector<std::string>& headers) {
  HttpReply r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = method + " /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string all;
  char chunk[16384];
  ssize_t n;
  while ((n = ::recv(fd, chunk, sizeof chunk, 0)) > 0) all.append(chunk, static_cast<size_t>(n));
  ::close(fd);
  const auto sp = all.find(' ');
  if (sp != std::string::npos) r.status = std::atoi(all.c_str() + sp + 1);
  const auto end = all.find("\r\n\r\n");
  r.headers = all.substr(0, end);
  if (end != std::string::npos) r.body = all.substr(end + 4);
  return r;
}

std::string header(const HttpReply& r, const std::string& name) {
  std::istringstream in(r.headers);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > name.size() && strncasecmp(line.c_str(), name.c_str(), name.size()) == 0 &&
        line[name.size()] == ':') {
      std::string v = line.substr(name.size() + 1);
      while (!v.empty() && (v.front() == ' ')) v.erase(0, 1);
      while (!v.empty() && (v.back() == '\r')) v.pop_back();
      return v;
    }
  }
  return "";
}

TEST(McpHttp, TokenOriginAndSessionAreEnforced) {
  auto opts = options_for("sample-gpu-node-01.db");
  if (opts.db_path.empty()) GTEST_SKIP() << "shared sample databases not found";
  Server server(opts);
  HttpOptions ho;
  ho.token = "s3cret";
  std::atomic<bool> stop{false};
  std::atomic<uint16_t> port{0};
  std::string error;
  std::thread t([&] { EXPECT_EQ(run_http(server, ho, stop, &port, error), 0) << error; });
  for (int i = 0; i < 500 && port.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_NE(port.load(), 0);
  const std::string auth = "Authorization: Bearer s3cret";
  const std::string json = "Content-Type: application/json";
  EXPECT_EQ(http(port, "POST", init_line(1), {json}).status, 401);
  EXPECT_EQ(http(port, "POST", init_line(1), {json, "Authorization: Bearer wrong"}).status, 401);
  EXPECT_EQ(http(port, "POST", init_line(1), {json, auth, "Origin: https://evil.example"}).status, 403);
  EXPECT_EQ(http(port, "GET", "", {auth}).status, 405);
  EXPECT_EQ(http(port, "POST", "{", {json, auth}).status, 400);
  HttpReply init = http(port, "POST", init_line(1), {json, auth, "Origin: http://localhost:6274"});
  ASSERT_EQ(init.status, 200) << init.body;
  EXPECT_EQ(Json::parse(init.body)["result"]["protocolVersion"], "2025-11-25");
  const std::string session = header(init, "Mcp-Session-Id");
  ASSERT_FALSE(session.empty()) << init.headers;
  const std::string list = R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})";
  EXPECT_EQ(http(port, "POST", list, {json, auth}).status, 400);  // no session header
  EXPECT_EQ(http(port, "POST", list, {json, auth, "Mcp-Session-Id: other"}).status, 404);
  EXPECT_EQ(
      http(port, "POST", list, {json, auth, "Mcp-Session-Id: " + session, "MCP-Protocol-Version: 1900-01-01"}).status,
      400);
  HttpReply tools = http(port, "POST", list,
                         {json, auth, "Mcp-Session-Id: " + session, "MCP-Protocol-Version: 2025-11-25"});
  ASSERT_EQ(tools.status, 200);
  EXPECT_EQ(Json::parse(tools.body)["result"]["tools"].size(), 12u);
  EXPECT_EQ(http(port, "POST", R"({"jsonrpc":"2.0","method":"notifications/initialized"})",
                 {json, auth, "Mcp-Session-Id: " + session})
                .status,
            202);
  EXPECT_EQ(http(port, "DELETE", "", {auth, "Mcp-Session-Id: " + session}).status, 200);
  EXPECT_EQ(http(port, "POST", list, {json, auth, "Mcp-Session-Id: " + session}).status, 404);
  stop.store(true);
  t.join();
}

}  // namespace
}  // namespace ingero::mcp
